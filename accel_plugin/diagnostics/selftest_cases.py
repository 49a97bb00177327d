"""The self-test's cases: the fixed grid of kernel calls, their seeded inputs, and what each
kernel's case computes and compares with the float64 reference.

Attention cases are judged by the tests' accuracy rule
(:mod:`accel_plugin.kernels.tolerance`: twice torch's own error in the dtype plus the
derived floor); the cache write must be exact. Running them, and where:
:mod:`accel_plugin.diagnostics.selftest_run`. Imports torch and the kernels only
when a case runs.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any

from ..kernels import limits

__all__ = ["GRID", "KERNELS", "RUNNERS", "Case", "default_cases"]

FLASH = "flash_attn_varlen_func"
PAGED = "paged_attention"
WRITE_KV = "write_kv_cache"
KERNELS = (FLASH, PAGED, WRITE_KV)

#: (variant, head size, block size, GQA ratio) per kernel, run for every dtype in
#: limits.DTYPE_NAMES: each head size, block size and ratio appears for each kernel
#: and dtype. 80 is not a power of two (padded to 128 inside the kernels).
GRID: dict[str, tuple[tuple[str, int, int | None, int | None], ...]] = {
    FLASH: (("prefill", 64, None, 4), ("prefill", 128, None, 1), ("prefill", 80, None, 4)),
    PAGED: (("mixed", 64, 16, 1), ("mixed", 128, 32, 4), ("mixed", 80, 16, 4), ("split-K", 64, 32, 1)),
    WRITE_KV: (("write", 64, 16, None), ("write", 128, 32, None), ("write", 80, 16, None)),
}
#: kv heads of every case; query heads = NUM_KV_HEADS * GQA ratio.
NUM_KV_HEADS = 2
#: varlen prefill: causal, one prompt of one token, one not a multiple of any tile.
FLASH_LENS = (1, 17, 40)
#: paged "mixed": decode (1 query), speculative verification (4) and a prefill chunk
#: (9) over cached contexts; "split-K": a 300-token decode cut in NUM_SPLITS pieces
#: next to a short sequence whose last pieces are empty.
PAGED_BATCHES = {"mixed": ((1, 40), (4, 23), (9, 57)), "split-K": ((1, 300), (3, 45))}
NUM_SPLITS = 4
#: tokens written by the cache-write case (one of them padding, slot -1).
WRITE_TOKENS = 21


@dataclass(frozen=True)
class Case:
    """One kernel call: ``block_size`` is None for the flash kernel, ``gqa`` for the cache write."""

    kernel: str
    variant: str
    dtype: str
    head_size: int
    block_size: int | None
    gqa: int | None

    def seed(self) -> int:
        """The case's own random seed: the same inputs whatever else runs."""
        return zlib.crc32(repr(astuple(self)).encode())


def default_cases(kernels: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None) -> list[Case]:
    """The fixed grid (:data:`GRID` x limits.DTYPE_NAMES), optionally only some kernels or dtypes."""
    return [Case(kernel, variant, dtype, head_size, block_size, gqa)
            for kernel, shapes in GRID.items() if kernels is None or kernel in kernels
            for dtype in limits.DTYPE_NAMES if dtypes is None or dtype in dtypes
            for variant, head_size, block_size, gqa in shapes]


def _timed(device, call: Callable[[], Any]) -> tuple[Any, float]:
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    result = call()
    sync()
    return result, time.perf_counter() - start


class _Inputs:
    """Random inputs of one case, drawn on the CPU (reproducible) and moved to ``device``."""

    def __init__(self, case: Case, device):
        import torch

        self.torch, self.device = torch, device
        self.dtype = getattr(torch, case.dtype)
        self.gen = torch.Generator().manual_seed(case.seed())

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen).to(self.dtype).to(self.device)

    def int32(self, values):
        return self.torch.tensor(values, dtype=self.torch.int32, device=self.device)

    def cu_seqlens(self, lens):
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return self.int32(cu)

    def block_table(self, seq_lens, block_size):
        """A shuffled block table; each row's trailing entry is a foreign block, so a read past
        seq_len shows in the result. Returns (table, num_blocks)."""
        used = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(used) + 2
        perm = self.torch.randperm(num_blocks, generator=self.gen).tolist()
        rows, start = [], 0
        for n in used:
            rows.append(perm[start:start + n] + [perm[-1]] * (max(used) + 1 - n))
            start += n
        return self.int32(rows), num_blocks


def _run_flash(case: Case, kernels, device) -> tuple[float, float, float]:
    from ..kernels import reference, tolerance

    x = _Inputs(case, device)
    total = sum(FLASH_LENS)
    q = x.randn(total, NUM_KV_HEADS * case.gqa, case.head_size)
    k, v = x.randn(total, NUM_KV_HEADS, case.head_size), x.randn(total, NUM_KV_HEADS, case.head_size)
    cu = x.cu_seqlens(FLASH_LENS)
    longest = max(FLASH_LENS)
    out, seconds = _timed(device, lambda: kernels.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                                         causal=True))
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu, cu, longest, longest,
                                           causal=True)
    lowp = tolerance.TorchLowp().varlen(q, k, v, cu, cu, causal=True)
    err, limit, _ = tolerance.verdict(out, ref, lowp, x.dtype, tolerance.max_score(q, k))
    return err, limit, seconds


def _run_paged(case: Case, kernels, device) -> tuple[float, float, float]:
    from ..kernels import reference, tolerance

    x = _Inputs(case, device)
    q_lens, seq_lens = zip(*PAGED_BATCHES[case.variant])
    table, num_blocks = x.block_table(seq_lens, case.block_size)
    cache_shape = (num_blocks, case.block_size, NUM_KV_HEADS, case.head_size)
    k_cache, v_cache = x.randn(*cache_shape), x.randn(*cache_shape)
    q = x.randn(sum(q_lens), NUM_KV_HEADS * case.gqa, case.head_size)
    cu, lens = x.cu_seqlens(q_lens), x.int32(seq_lens)
    num_splits = NUM_SPLITS if case.variant == "split-K" else 0
    out, seconds = _timed(device, lambda: kernels.paged_attention(
        q, k_cache, v_cache, cu, lens, table, max(q_lens), max(seq_lens), num_splits=num_splits))
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), cu, lens, table,
                                    max(q_lens), max(seq_lens))
    lowp = tolerance.TorchLowp().paged(q, k_cache, v_cache, cu, lens, table)
    err, limit, _ = tolerance.verdict(out, ref, lowp, x.dtype, tolerance.max_score(q, k_cache))
    return err, limit, seconds


def _run_write_kv(case: Case, kernels, device) -> tuple[float, float, float]:
    from ..kernels import reference, tolerance

    x = _Inputs(case, device)
    num_blocks = -(-WRITE_TOKENS // case.block_size) + 2
    cache_shape = (num_blocks, case.block_size, NUM_KV_HEADS, case.head_size)
    k_cache, v_cache = x.randn(*cache_shape), x.randn(*cache_shape)
    k, v = x.randn(WRITE_TOKENS, NUM_KV_HEADS, case.head_size), x.randn(WRITE_TOKENS, NUM_KV_HEADS, case.head_size)
    slots = x.torch.randperm(num_blocks * case.block_size, generator=x.gen)[:WRITE_TOKENS]
    slots[WRITE_TOKENS // 2] = -1  # a padding token: written nowhere
    slots = slots.to(device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    _, seconds = _timed(device, lambda: kernels.write_kv_cache(k, v, k_cache, v_cache, slots))
    reference.write_kv_cache(k, v, ref_k, ref_v, slots)
    err = max(tolerance.max_err(k_cache, ref_k), tolerance.max_err(v_cache, ref_v))
    return err, 0.0, seconds


RUNNERS = {FLASH: _run_flash, PAGED: _run_paged, WRITE_KV: _run_write_kv}
