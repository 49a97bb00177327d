"""Where a kernel call runs: compiled Triton, the Triton interpreter, or the torch CPU path.

:func:`enter_kernel` is the one preamble every public kernel function runs: choose
the mode, check the interpreter, validate, hand the call to the torch CPU path
(:mod:`.cpu_attention`) where Triton cannot run.

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
from typing import Any, Callable, NamedTuple

import torch
import triton
import triton.language as tl

__all__ = [
    "InterpreterUnusable",
    "KernelEntry",
    "check_interpreter",
    "enter_kernel",
    "kernels_interpreted",
    "runtime_mode",
    "runtime_mode_reason",
    "warn_torch_fallback",
]

COMPILED = "compiled"
INTERPRETER = "interpreter"
#: the batched torch path of :mod:`.cpu_attention` (the name ``accel doctor`` shows)
TORCH = "torch"


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
        f"torch CPU path"
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
    return TORCH


def runtime_mode(device: str | torch.device | None = None) -> str:
    """What a kernel call on tensors of ``device`` runs: "compiled", "interpreter" or "torch"
    (the batched torch path of :mod:`.cpu_attention`).

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
    path = _cpu_path_name()
    env_set = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "yes", "on")
    if env_set:
        return ("TRITON_INTERPRET was set after accel_plugin.kernels was imported: "
                f"{path} (set it before the import for the Triton interpreter)")
    if dev.type == "cuda":
        return f"CUDA requested but torch.cuda.is_available() is False: {path}"
    if torch.cuda.is_available():
        return f"{dev.type} tensors and TRITON_INTERPRET unset: {path}"
    return f"no CUDA device and TRITON_INTERPRET unset: {path}"


def _cpu_path_name() -> str:
    from .cpu_attention import path_name

    return path_name()


_warned = False


def warn_torch_fallback(device: torch.device, stacklevel: int = 3) -> None:
    """Warn once per process that calls run the torch CPU path, not Triton.

    ``stacklevel`` as for :func:`warnings.warn`, counted from this function: the
    default 3 points at the caller of the function that calls this one.
    """
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"accel_plugin.kernels: {runtime_mode_reason(device)}. Results are exact; the Triton "
        "kernels run on CUDA tensors, or in the interpreter with TRITON_INTERPRET=1 set before "
        "the import.",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


class KernelEntry(NamedTuple):
    """What :func:`enter_kernel` decided for one call."""

    mode: str
    params: Any  # what ``validate`` returned
    ran_torch: bool  # the torch CPU path computed the call: return ``result``
    result: Any = None


def enter_kernel(x: Any, validate: Callable[[bool], Any],
                 torch_path: Callable[[Any], Any]) -> KernelEntry:
    """The preamble of every public kernel function (flash, paged, KV write).

    The mode comes from ``x``'s device (the call's first tensor; anything else counts as
    compiled, so validation names what is wrong). In the interpreter, the probe runs
    once per process: a clear error instead of an opaque one. ``validate(check_contents)``
    then checks the arguments, tensor contents too off the compiled path, and returns
    the parameters. In torch mode it warns once and returns
    ``torch_path(params)`` as the result, with ``ran_torch`` set.
    """
    mode = runtime_mode(x.device) if isinstance(x, torch.Tensor) else COMPILED
    if mode == INTERPRETER:
        check_interpreter()
    params = validate(mode != COMPILED)
    if mode == TORCH:
        # 4: the warning points at the caller of the public kernel function, as it would
        # from that function itself.
        warn_torch_fallback(x.device, stacklevel=4)
        return KernelEntry(mode, params, True, torch_path(params))
    return KernelEntry(mode, params, False)
