"""Triton attention kernels: varlen FlashAttention, paged attention with split-K, KV-cache write.

Installed as ``accel_plugin.kernels``; imports only torch and triton. Argument
names and order follow flash-attn and vLLM. Every call dispatches on the
tensors' device (see :func:`runtime_mode`):

* CUDA tensors: compiled Triton kernels;
* ``TRITON_INTERPRET=1`` set before this package is imported: the Triton
  interpreter (bf16 is upcast to fp32 inside the kernels there);
* otherwise: the batched torch CPU path, :mod:`~accel_plugin.kernels.cpu_attention`,
  with a one-time ``RuntimeWarning``. :mod:`~accel_plugin.kernels.reference` is the
  tests' clear, slow oracle.

Documentation: docs/kernels.md.

Names are imported on first use (PEP 562), so that reading
:mod:`~accel_plugin.kernels.limits` (what the kernels accept, plain data)
imports neither torch nor triton.
"""

from __future__ import annotations

import importlib

#: public name -> the submodule that defines it
_LAZY = {
    "reference": None,
    "limits": None,
    "tolerance": None,
    "runtime_mode": "_runtime",
    "runtime_mode_reason": "_runtime",
    "MAX_BLOCK_SIZE": "_validation",
    "MIN_BLOCK_SIZE": "_validation",
    "SUPPORTED_DTYPES": "_validation",
    "SUPPORTED_HEAD_SIZES": "_validation",
    "flash_attn_varlen_func": "flash_attn",
    "write_kv_cache": "kv_cache",
    "paged_attention": "paged_attn",
    "auto_num_splits": "paged_attn",
    "native_cpu_ops": "cpu_attention",
    "NATIVE_MAX_Q": "cpu_attention",
    "split_workspace_numel": "paged_attn",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _LAZY[name]
    if module is None:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "limits",
    "native_cpu_ops",
    "NATIVE_MAX_Q",
    "MAX_BLOCK_SIZE",
    "MIN_BLOCK_SIZE",
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_SIZES",
    "auto_num_splits",
    "flash_attn_varlen_func",
    "paged_attention",
    "reference",
    "runtime_mode",
    "runtime_mode_reason",
    "split_workspace_numel",
    "tolerance",
    "write_kv_cache",
]
