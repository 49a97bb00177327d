"""Realistic shapes on a CUDA GPU, compiled (on a CUDA machine tests/conftest.py leaves
TRITON_INTERPRET unset, so the kernels compile):

    pytest tests/kernels -m gpu

The accuracy rule is the CPU suite's (``check``): the kernel's largest error against
a float64 reference, computed on the GPU, may be at most twice torch's own error in
the same dtype (``lowp``) plus the floor derived from the case. A fixed atol would
not do at long contexts: at 32k keys the outputs are about 0.03, so atol=2e-2
accepted a decode that lost a split-K partition (test_lost_split_fails_the_check).
"""

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.kernels import flash_attn_varlen_func, paged_attention, reference, write_kv_cache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and kernels.runtime_mode("cuda") != "compiled",
                       reason="kernels are interpreted (TRITON_INTERPRET=1); unset it to compile them"),
]


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def cu_seqlens(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_prefill(check, lowp, dtype, head_dim, causal):
    gen = torch.Generator("cuda").manual_seed(0)
    lens = [1, 517, 2048, 1000]
    cu = cu_seqlens(lens)
    q = randn(sum(lens), 32, head_dim, dtype=dtype, gen=gen)
    k, v = randn(sum(lens), 8, head_dim, dtype=dtype, gen=gen), randn(sum(lens), 8, head_dim, dtype=dtype, gen=gen)
    out, lse = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal, return_lse=True)
    ref, ref_lse = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu, cu, max(lens),
                                                    max(lens), causal=causal, return_lse=True)
    max_score = check.max_score(q, k)
    check.close(out, ref, lowp.varlen(q, k, v, cu, cu, causal=causal), dtype, max_score=max_score)
    check.lse_close(lse, ref_lse, max_score=max_score)


def test_prefill_fp32_window_softcap(check, lowp):
    gen = torch.Generator("cuda").manual_seed(1)
    lens = [300, 1024]
    cu = cu_seqlens(lens)
    q, k, v = (randn(1324, 8, 96, dtype=torch.float32, gen=gen) for _ in range(3))
    opts = dict(causal=True, window_size=(255, 0), softcap=30.0)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **opts)
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu, cu, max(lens), max(lens), **opts)
    check.close(out, ref, lowp.varlen(q, k, v, cu, cu, **opts), torch.float32,
                max_score=check.max_score(q, k, softcap=30.0))


def paged_inputs(batch, context, q_len, block_size, dtype, gen, num_heads=32, num_kv_heads=8, head_dim=128):
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq + 7
    table = torch.randperm(num_blocks, device="cuda")[:batch * blocks_per_seq].view(batch, blocks_per_seq)
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, gen=gen)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, gen=gen)
    q = randn(batch * q_len, num_heads, head_dim, dtype=dtype, gen=gen)
    cu = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, cu, seq_lens, table.to(torch.int32)


def paged_reference(q, k_cache, v_cache, cu, seq_lens, table, q_len, **opts):
    return reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), cu, seq_lens, table, q_len,
                                     int(seq_lens.max()), **opts)


@pytest.mark.parametrize("num_splits", [0, 1])
@pytest.mark.parametrize("batch,context", [(1, 32768), (8, 4096), (64, 1000)])
def test_decode(check, lowp, batch, context, num_splits):
    gen = torch.Generator("cuda").manual_seed(2)
    q, k_cache, v_cache, cu, seq_lens, table = paged_inputs(batch, context, 1, 16, torch.bfloat16, gen)
    out = paged_attention(q, k_cache, v_cache, cu, seq_lens, table, 1, context, num_splits=num_splits)
    ref = paged_reference(q, k_cache, v_cache, cu, seq_lens, table, 1)
    check.close(out, ref, lowp.paged(q, k_cache, v_cache, cu, seq_lens, table), torch.bfloat16,
                max_score=check.max_score(q, k_cache))


@pytest.mark.parametrize("num_splits", [2, 8])
def test_lost_split_fails_the_check(check, lowp, num_splits):
    """The kernel's split-K decode passes; the same decode with its last partition lost
    (the reference on the first (num_splits - 1) / num_splits of the keys) is rejected."""
    gen = torch.Generator("cuda").manual_seed(6)
    context = 32768
    q, k_cache, v_cache, cu, seq_lens, table = paged_inputs(1, context, 1, 16, torch.bfloat16, gen)
    out = paged_attention(q, k_cache, v_cache, cu, seq_lens, table, 1, context, num_splits=num_splits)
    ref = paged_reference(q, k_cache, v_cache, cu, seq_lens, table, 1)
    base = lowp.paged(q, k_cache, v_cache, cu, seq_lens, table)
    max_score = check.max_score(q, k_cache)
    check.close(out, ref, base, torch.bfloat16, max_score=max_score)
    kept = seq_lens - context // num_splits
    lost = paged_reference(q, k_cache, v_cache, cu, kept, table, 1).to(torch.bfloat16)
    err, limit, _ = check.verdict(lost, ref, base, torch.bfloat16, max_score)
    assert err > limit, f"a lost partition passed: error {err:.3g} <= {limit:.3g}"


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_chunked_prefill_and_verify(check, lowp, block_size):
    gen = torch.Generator("cuda").manual_seed(3)
    for q_len in (5, 512):
        q, k_cache, v_cache, cu, seq_lens, table = paged_inputs(4, 3000, q_len, block_size, torch.float16, gen)
        opts = dict(window_size=(1023, 0))
        out = paged_attention(q, k_cache, v_cache, cu, seq_lens, table, q_len, 3000, **opts)
        ref = paged_reference(q, k_cache, v_cache, cu, seq_lens, table, q_len, **opts)
        check.close(out, ref, lowp.paged(q, k_cache, v_cache, cu, seq_lens, table, **opts), torch.float16,
                    max_score=check.max_score(q, k_cache), what=f"out (q_len {q_len})")


def test_large_cache_needs_64_bit_offsets(check, lowp):
    """A cache of more than 2**31 elements: blocks at its end must be addressed correctly."""
    num_blocks, block_size, num_kv_heads, head_dim = 135_000, 16, 8, 128  # 2.2e9 elements, 4.4 GB
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * 2**30:
        pytest.skip("needs 12 GiB of free GPU memory")
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    gen = torch.Generator("cuda").manual_seed(4)
    k = randn(40, num_kv_heads, head_dim, dtype=torch.bfloat16, gen=gen)
    v = randn(40, num_kv_heads, head_dim, dtype=torch.bfloat16, gen=gen)
    blocks = torch.tensor([num_blocks - 1, num_blocks - 3, num_blocks - 2], dtype=torch.int32, device="cuda")
    positions = torch.arange(40, device="cuda")
    slots = blocks.long()[positions // block_size] * block_size + positions % block_size
    write_kv_cache(k, v, k_cache, v_cache, slots)
    q = randn(1, 32, head_dim, dtype=torch.bfloat16, gen=gen)
    cu = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([40], dtype=torch.int32, device="cuda")
    out = paged_attention(q, k_cache, v_cache, cu, seq_lens, blocks[None], 1, 40)
    cu_k = torch.tensor([0, 40], dtype=torch.int32, device="cuda")
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu, cu_k, 1, 40, causal=True)
    check.close(out, ref, lowp.varlen(q, k, v, cu, cu_k, causal=True), torch.bfloat16,
                max_score=check.max_score(q, k))


def test_long_prefill_32k(check, lowp):
    gen = torch.Generator("cuda").manual_seed(5)
    n = 32768
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    q, k, v = (randn(n, 8, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=True)
    rows = slice(n - 64, n)  # the last rows see every key: compare them with the reference
    cu_last = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    ref = reference.flash_attn_varlen_func(q[rows].double(), k.double(), v.double(), cu_last, cu, 64, n,
                                           causal=True)
    check.close(out[rows], ref, lowp.varlen(q[rows], k, v, cu_last, cu, causal=True), torch.bfloat16,
                max_score=check.max_score(q[rows], k))
