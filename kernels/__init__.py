"""Triton attention kernels: varlen FlashAttention, paged attention with split-K, KV-cache write.

Installed as ``accel_plugin.kernels``; imports only torch and triton. Argument
names and order follow flash-attn and vLLM. Every call dispatches on the
tensors' device (see :func:`runtime_mode`):

* CUDA tensors: compiled Triton kernels;
* ``TRITON_INTERPRET=1`` set before this package is imported: the Triton
  interpreter (bf16 is upcast to fp32 inside the kernels there);
* otherwise: the pure-torch :mod:`~accel_plugin.kernels.reference`, with a
  one-time ``RuntimeWarning``.

Documentation: docs/kernels.md.
"""

from __future__ import annotations

from . import reference
from ._runtime import runtime_mode, runtime_mode_reason
from ._validation import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, SUPPORTED_DTYPES, SUPPORTED_HEAD_SIZES
from .flash_attn import flash_attn_varlen_func
from .kv_cache import write_kv_cache
from .paged_attn import paged_attention

__all__ = [
    "MAX_BLOCK_SIZE",
    "MIN_BLOCK_SIZE",
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_SIZES",
    "flash_attn_varlen_func",
    "paged_attention",
    "reference",
    "runtime_mode",
    "runtime_mode_reason",
    "write_kv_cache",
]
