"""Products of a few float32 rows with a matrix read once (CPU): ``csrc/cpu_linear.cpp``.

A decode step multiplies ``batch x (1 + drafts)`` rows with each of the model's
matrices; on a CPU that costs reading the matrix, not the arithmetic, as long as the
product reads it once. torch's ``F.linear`` does for one row and stops doing so from
about four rows (1.5-2.4x the one-row time); oneDNN's prepacked product costs 1.2x
``F.linear`` at one row. The native product keeps a copy of the matrix in blocks of
64 output columns and streams it once for up to 6 rows (more rows reread each block
from L2). Measured by ``benchmarks/target_linears.py``.

The matrix may be float32 or bfloat16 (``ops(torch.bfloat16)``: AVX512-BF16's pair dot
product, half the bytes; ``x`` is rounded to bfloat16 inside, the result is float32):
what a draft model whose weights are bfloat16 multiplies by (see
:mod:`accel_plugin.speculative.llama`, ``benchmarks/draft_forward.py``).

:func:`ops` returns ``(pack, linear)`` (the shape of
:func:`accel_plugin.speculative.llama.packed_linear`'s pair) or ``None`` where the
native library cannot be had (no compiler, no AVX-512F, or for bfloat16 no
AVX512-BF16, at build time; a probe that disagrees with ``F.linear``). Imports no
framework.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["NAME", "SkinnyWeight", "linear", "ops", "pack", "pack_bf16", "reason"]

#: what a start-up line calls this product
NAME = "native few-row product (kernels/csrc/cpu_linear.cpp)"

_state: dict = {}


class SkinnyWeight(NamedTuple):
    """A matrix ``[N, K]`` in the native product's layout (float32 ``[ceil(N/64), K, 64]``,
    bfloat16 ``[ceil(N/64), ceil(K/2), 64, 2]``)."""

    packed: torch.Tensor
    n: int


def pack(weight: torch.Tensor) -> SkinnyWeight:
    """The native layout of a float32 or bfloat16 CPU matrix ``[N, K]`` (a copy, zero-padded to
    64 columns; the bfloat16 one to an even ``K``)."""
    return SkinnyWeight(torch.ops.accel_cpu.skinny_pack(weight.detach()), int(weight.shape[0]))


def pack_bf16(weight: torch.Tensor) -> SkinnyWeight:
    """:func:`pack` of ``weight`` rounded to bfloat16."""
    return pack(weight.detach().to(torch.bfloat16))


def linear(x: torch.Tensor, weight: SkinnyWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` with ``W`` as :func:`pack` laid it out."""
    out = torch.ops.accel_cpu.skinny_linear(x, weight.packed, weight.n)
    return out if bias is None else out.add_(bias)


#: the matrix dtypes the native product takes, with each one's pack
_PACKS = {torch.float32: pack, torch.bfloat16: pack_bf16}


def _probe(dtype: torch.dtype) -> str | None:
    """None when the native product of ``dtype`` matrices agrees with ``F.linear`` here, else why not."""
    from . import cpu_native

    if cpu_native.load() is None:
        return f"the native CPU kernels are not available ({cpu_native.status()[1]})"
    if not torch.ops.accel_cpu.skinny_available():
        return "the native library was built without AVX-512F"
    if dtype == torch.bfloat16 and not torch.ops.accel_cpu.skinny_bf16_available():
        return "the native library was built without AVX512-BF16 (bfloat16 matrices)"
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(100, 73, generator=gen), torch.randn(100, generator=gen)
    packed = _PACKS[dtype](w)
    for rows in (1, 4, 7):
        x = torch.randn(rows, 73, generator=gen)
        # the reference rounds what the native product rounds (bfloat16: x and W), in float32
        ref = F.linear(x.to(dtype).float(), w.to(dtype).float(), b)
        if not torch.allclose(linear(x, packed, b), ref, rtol=1e-4, atol=1e-4):
            return f"the native product of {dtype} matrices disagrees with F.linear at {rows} rows"
    return None


def ops(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """``(pack, linear)`` of the native few-row product with ``dtype`` matrices (float32 or
    bfloat16; ``x`` and the result float32), or ``None`` (then :func:`reason` says why)."""
    if torch.device(device).type != "cpu" or dtype not in _PACKS:
        return None
    if dtype not in _state:
        try:
            _state[dtype] = _probe(dtype)
        except Exception as exc:  # noqa: BLE001 - a broken build: the caller's other product serves
            _state[dtype] = f"{type(exc).__name__}: {exc}"
    return None if _state[dtype] else (_PACKS[dtype], linear)


def reason(dtype: torch.dtype = torch.float32) -> str | None:
    """Why :func:`ops` of ``dtype`` returned ``None`` (``None`` when it did not, or was not asked)."""
    return _state.get(dtype)
