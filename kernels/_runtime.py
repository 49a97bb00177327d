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

__all__ = ["runtime_mode", "runtime_mode_reason", "kernels_interpreted", "warn_reference_fallback"]

COMPILED = "compiled"
INTERPRETER = "interpreter"
REFERENCE = "reference"


@triton.jit
def _probe():
    pass


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
