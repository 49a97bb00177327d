"""The CPU a measurement ran on: model, CPUs this process may use, vector instruction sets.

Speed on a CPU depends on the machine more than on anything else a run prints: the same
2-CPU development container has been an AMD EPYC with AVX2 and an Intel Xeon with AVX-512 and
AMX, and plain compiled vLLM ran SmolLM2-135M at 25 tok/s in one session and 17 tok/s in
another, with nothing recorded to say which CPU ran which. So
``accel doctor``, ``accel demo`` (its text and its JSON) and the speculative benchmarks name
the CPU beside every result. Linux's ``/proc/cpuinfo`` where it exists, else :mod:`platform`.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["ISA_LEVELS", "cpu_info", "cpu_line"]

#: (name printed, the ``/proc/cpuinfo`` flag that shows it), widest last; AVX512-BF16 (or AMX)
#: is what the drafts' native bfloat16 product needs (:func:`.speculative.llama.native_bf16`)
ISA_LEVELS = (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX512-BF16", "avx512_bf16"), ("AMX", "amx_tile"))


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def cpu_info(cpuinfo: str | None = None) -> dict:
    """``{"model", "arch", "cpus", "isa"}``: the CPU's model name, the machine architecture,
    the CPUs this process may run on and the vector instruction sets of :data:`ISA_LEVELS`
    it has. ``cpuinfo``: the text of ``/proc/cpuinfo`` (read here when ``None``)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = None, set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip() or None
        elif key in ("flags", "Features") and not flags:  # x86, arm
            flags = set(value.split())
    return {"model": model or platform.processor() or None, "arch": platform.machine() or None,
            "cpus": _usable_cpus(), "isa": [name for name, flag in ISA_LEVELS if flag in flags]}


def cpu_line(info: dict | None = None) -> str:
    """``Intel(R) Xeon(R) Processor, 2 CPUs, x86_64 with AVX2, AVX-512, AMX``: :func:`cpu_info` in words."""
    info = cpu_info() if info is None else info
    isa = ", ".join(info.get("isa") or ()) or "no AVX2"
    arch = info.get("arch") or "unknown architecture"
    cpus = info.get("cpus")
    return f"{info.get('model') or 'unknown CPU'}, {cpus if cpus else '?'} CPUs, {arch} with {isa}"
