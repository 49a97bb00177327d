"""Where a kernel call runs: compiled Triton, the Triton interpreter, or the torch reference.

Triton decides at ``@triton.jit`` time (that is, when this package is imported)
whether kernels are interpreted: ``TRITON_INTERPRET=1`` must be set before the
import. So the mode is read from what the decorator actually produced, not from
the environment at call time; a probe kernel, jitted alongside the real ones,
tells which.

Nothing here touches the GPU driver: with no GPU, ``triton.runtime.driver.active``
raises, so it is never consulted at import time.
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
import triton.language as tl

__all__ = [
    "InterpreterUnusable",
    "check_interpreter",
    "kernels_interpreted",
    "runtime_mode",
    "runtime_mode_reason",
    "warn_reference_fallback",
]

COMPILED = "compiled"
INTERPRETER = "interpreter"
REFERENCE = "reference"


@triton.jit
def _probe():
    pass


@triton.jit
def _loop_probe(ptr):
    # A loop bound loaded from memory, as the kernels' key loops have: the
    # interpreter turns it into a Python int through numpy.
    n = tl.load(ptr)
    acc = 0
    for i in range(0, n):
        acc += i
    tl.store(ptr, acc)


class InterpreterUnusable(RuntimeError):
    """This triton's interpreter cannot run the kernels with the installed numpy."""


_interpreter_checked: str | None = None


def check_interpreter() -> None:
    """Run a probe kernel in the interpreter once per process; raise
    :class:`InterpreterUnusable` naming the versions and the fix when it fails.

    Seen in the compatibility matrix: triton 3.3's interpreter converts 1-element
    arrays to Python ints, which numpy 2.4 no longer allows, so every kernel loop
    fails with an opaque ``InterpreterError``. Compiled kernels (GPU) are unaffected.
    """
    global _interpreter_checked
    if _interpreter_checked == "ok":
        return
    if _interpreter_checked is not None:
        raise InterpreterUnusable(_interpreter_checked)
    import numpy

    buf = torch.tensor([4], dtype=torch.int32)
    try:
        _loop_probe[(1,)](buf)
        ok = int(buf.item()) == 6
        detail = f"the probe returned {int(buf.item())}, expected 6"
    except Exception as exc:  # the interpreter wraps what numpy raised
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    if ok:
        _interpreter_checked = "ok"
        return
    _interpreter_checked = (
        f"the Triton interpreter (TRITON_INTERPRET=1) of triton {triton.__version__} cannot run "
        f"accel-plugin's kernels with numpy {numpy.__version__} ({detail}); install numpy<2.4 "
        f"(pip install 'numpy<2.4') or a triton whose interpreter supports this numpy "
        f"(docs/compatibility.md lists the tested pairs), or unset TRITON_INTERPRET to use the "
        f"pure-torch reference on CPU"
    )
    raise InterpreterUnusable(_interpreter_checked)


def kernels_interpreted() -> bool:
    """True when this package's kernels were jitted for the Triton interpreter."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every supported triton has it
        return False
    return isinstance(_probe, InterpretedFunction)


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_mode(device_type: str, interpreted: bool, cuda_available: bool) -> str:
    """The dispatch rule, as a pure function of its three inputs."""
    if interpreted:
        return INTERPRETER
    if device_type == "cuda" and cuda_available:
        return COMPILED
    return REFERENCE


def runtime_mode(device: str | torch.device | None = None) -> str:
    """What a kernel call on tensors of ``device`` runs: "compiled", "interpreter" or "reference".

    ``device=None`` means the default device: cuda if available, else cpu.
    """
    return resolve_mode(_device(device).type, kernels_interpreted(), torch.cuda.is_available())


def runtime_mode_reason(device: str | torch.device | None = None) -> str:
    """A short sentence saying why :func:`runtime_mode` chose what it chose."""
    dev = _device(device)
    mode = runtime_mode(dev)
    if mode == INTERPRETER:
        where = "CPU" if dev.type == "cpu" else f"{dev.type} tensors copied to the host"
        return f"TRITON_INTERPRET=1: Triton interpreter on {where}"
    if mode == COMPILED:
        return f"CUDA device: compiled Triton kernels (triton {triton.__version__})"
    env_set = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "yes", "on")
    if env_set:
        return ("TRITON_INTERPRET was set after accel_plugin.kernels was imported: "
                "pure-torch reference (set it before the import)")
    if dev.type == "cuda":
        return "CUDA requested but torch.cuda.is_available() is False: pure-torch reference"
    if torch.cuda.is_available():
        return f"{dev.type} tensors and TRITON_INTERPRET unset: pure-torch reference"
    return "no CUDA device and TRITON_INTERPRET unset: pure-torch reference"


_warned = False


def warn_reference_fallback(device: torch.device) -> None:
    """Warn once per process that calls fall back to the torch reference."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"accel_plugin.kernels: {runtime_mode_reason(device)}. Results are exact but slow; "
        "use CUDA tensors, or set TRITON_INTERPRET=1 before the import to run the Triton "
        "kernels in the interpreter.",
        RuntimeWarning,
        stacklevel=3,
    )
