"""The native CPU kernels (``csrc/cpu_attention.cpp``, ``csrc/cpu_linear.cpp``): built once per machine,
loaded per process.

What they compute: :func:`~accel_plugin.kernels.paged_attention` (every call whose
queries are short: decode, speculative verification, small chunks) and
:func:`~accel_plugin.kernels.write_kv_cache`, on CPU tensors, without Triton. The paged
kernel reads each sequence's K/V through its block table in place, once per (sequence,
kv head), for all query heads of the GQA group, with an online softmax in fp32 (the
FlashAttention recurrence, Dao et al. 2022), threads over OpenMP as torch's own ops.
The batched torch path (:mod:`.cpu_attention`) keeps long queries (prefill: SDPA's
blocked matmuls win there) and everything when the native kernels cannot be built.
The same library holds the few-row float32 product of :mod:`.cpu_linear`.

Building: :func:`torch.utils.cpp_extension.load` with ``-O3 -march=native -fopenmp``, in a
child process (the compiler's output and ``ninja``'s ``PATH`` stay there), into
``$TORCH_EXTENSIONS_DIR/<name>`` or ``~/.cache/accel-plugin/torch_extensions/<name>``. The
name carries the torch version and a hash of the source, the flags and the CPU's
instruction-set flags, so a cache shared by other machines or another torch is never
loaded by mistake. About a minute the first time (g++ and ninja needed: ``pip install
ninja``), then a file load. Concurrent builders (vLLM's workers) wait on torch's lock.

Limits: ``head_dim <= 256``; CPU tensors only; a build failure is reported once (a
``RuntimeWarning`` naming the cause) and the torch path serves every call.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

__all__ = ["NAME", "build_dir", "extension_name", "load", "status"]

#: What ``accel doctor`` and the start-up line call this path.
NAME = "native C++ CPU kernel (paged decode, OpenMP)"

#: the library's sources: the paged-attention kernels and the few-row float32 product (``cpu_linear.cpp``)
_SOURCES = [Path(__file__).resolve().parent / "csrc" / name for name in ("cpu_attention.cpp", "cpu_linear.cpp")]
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]
_LDFLAGS = ["-fopenmp"]
#: seconds a first build may take before it counts as failed
BUILD_TIMEOUT = 600

_state: dict = {}  # "ops": torch.ops.accel_cpu or None, "reason": why not


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def extension_name() -> str:
    """``accel_cpu_<torch version>_<hash of source, flags, CPU flags>``."""
    digest = hashlib.sha256()
    for part in (*(src.read_bytes() for src in _SOURCES), " ".join(_CFLAGS + _LDFLAGS).encode(),
                 _cpu_flags().encode()):
        digest.update(part)
    version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    return f"accel_cpu_{version}_{digest.hexdigest()[:12]}"


def build_dir() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "accel-plugin" / "torch_extensions"
    return base / extension_name()


def _library() -> Path:
    return build_dir() / f"{extension_name()}.so"


def _build() -> None:
    """In this process: compile and link the library (the child's job)."""
    from torch.utils.cpp_extension import load as cpp_load

    target = build_dir()
    target.mkdir(parents=True, exist_ok=True)
    cpp_load(name=extension_name(), sources=[str(src) for src in _SOURCES], extra_cflags=_CFLAGS,
             extra_ldflags=_LDFLAGS, build_directory=str(target), is_python_module=False, verbose=False)


def _build_in_child() -> str | None:
    """Build in a child python; None when it worked, else the reason."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cwd = build_dir()  # not the caller's: `-m` puts it first on sys.path, where a source checkout's
    cwd.mkdir(parents=True, exist_ok=True)  # accel_plugin/ (no kernels/ in it) would shadow the installed one
    try:
        proc = subprocess.run([sys.executable, "-m", __name__], env=env, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL, cwd=str(cwd))
    except subprocess.TimeoutExpired:
        return f"the build took more than {BUILD_TIMEOUT} s"
    if proc.returncode == 0 and _library().exists():
        return None
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()] or lines
    return f"the build failed (exit {proc.returncode}): " + " | ".join(errors[-3:])[:600]


def load():
    """``torch.ops.accel_cpu`` with the native kernels, built first if needed; None where they cannot
    be had (warned once, :func:`status` says why)."""
    if "ops" in _state:
        return _state["ops"]
    ops = reason = None
    try:
        if not _library().exists():
            reason = _build_in_child()
        if reason is None:
            torch.ops.load_library(str(_library()))
            ops = torch.ops.accel_cpu
    except Exception as exc:  # a broken cache, a library torch refuses: the torch path serves
        reason = f"{type(exc).__name__}: {exc}"
    _state["ops"], _state["reason"] = ops, reason
    if ops is None:
        warnings.warn(f"accel_plugin.kernels: the native CPU kernels are not available ({reason}); the "
                      f"batched torch path serves every call (slower). Needs g++ and ninja (pip install ninja); "
                      f"build cache: {build_dir()}", RuntimeWarning, stacklevel=2)
    return ops


def status() -> tuple[bool, str]:
    """(available, a sentence) for ``accel doctor``; builds if needed."""
    ops = load()
    if ops is not None:
        return True, f"{NAME}, {_library()}"
    return False, f"not available: {_state['reason']}"


if __name__ == "__main__":
    _build()
