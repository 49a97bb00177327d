"""Realistic shapes on a CUDA GPU, compiled (run with TRITON_INTERPRET=0 on a GPU machine).

    TRITON_INTERPRET=0 pytest tests/kernels -m gpu

Reference outputs are computed with the pure-torch reference in float32 on the GPU;
the float64 oracle would be too slow at these sizes.
"""

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.kernels import flash_attn_varlen_func, paged_attention, reference, write_kv_cache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and kernels.runtime_mode("cuda") != "compiled",
                       reason="kernels are interpreted (TRITON_INTERPRET=1); run with TRITON_INTERPRET=0"),
]

# Against an fp32 reference: |err| <= ATOL + RTOL * |ref| (bf16/fp16 rounding of p and out).
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3), torch.float32: (2e-4, 2e-4)}


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def assert_close(out, ref, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_prefill(dtype, head_dim, causal):
    gen = torch.Generator("cuda").manual_seed(0)
    lens = [1, 517, 2048, 1000]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = randn(sum(lens), 32, head_dim, dtype=dtype, gen=gen)
    k, v = randn(sum(lens), 8, head_dim, dtype=dtype, gen=gen), randn(sum(lens), 8, head_dim, dtype=dtype, gen=gen)
    out, lse = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal, return_lse=True)
    ref, ref_lse = reference.flash_attn_varlen_func(q.float(), k.float(), v.float(), cu, cu, max(lens),
                                                    max(lens), causal=causal, return_lse=True)
    assert_close(out, ref, dtype)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


def test_prefill_fp32_window_softcap():
    gen = torch.Generator("cuda").manual_seed(1)
    lens = [300, 1024]
    cu = torch.tensor([0, 300, 1324], dtype=torch.int32, device="cuda")
    q, k, v = (randn(1324, 8, 96, dtype=torch.float32, gen=gen) for _ in range(3))
    opts = dict(causal=True, window_size=(255, 0), softcap=30.0)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **opts)
    ref = reference.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **opts)
    assert_close(out, ref, torch.float32)


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


@pytest.mark.parametrize("num_splits", [0, 1])
@pytest.mark.parametrize("batch,context", [(1, 32768), (8, 4096), (64, 1000)])
def test_decode(batch, context, num_splits):
    gen = torch.Generator("cuda").manual_seed(2)
    q, k_cache, v_cache, cu, seq_lens, table = paged_inputs(batch, context, 1, 16, torch.bfloat16, gen)
    out = paged_attention(q, k_cache, v_cache, cu, seq_lens, table, 1, context, num_splits=num_splits)
    ref = reference.paged_attention(q.float(), k_cache.float(), v_cache.float(), cu, seq_lens, table, 1, context)
    assert_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_chunked_prefill_and_verify(block_size):
    gen = torch.Generator("cuda").manual_seed(3)
    for q_len in (5, 512):
        q, k_cache, v_cache, cu, seq_lens, table = paged_inputs(4, 3000, q_len, block_size, torch.float16, gen)
        out = paged_attention(q, k_cache, v_cache, cu, seq_lens, table, q_len, 3000, window_size=(1023, 0))
        ref = reference.paged_attention(q.float(), k_cache.float(), v_cache.float(), cu, seq_lens, table, q_len,
                                        3000, window_size=(1023, 0))
        assert_close(out, ref, torch.float16)


def test_large_cache_needs_64_bit_offsets():
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
    ref = reference.flash_attn_varlen_func(q.float(), k.float(), v.float(), cu,
                                           torch.tensor([0, 40], dtype=torch.int32, device="cuda"), 1, 40,
                                           causal=True)
    assert_close(out, ref, torch.bfloat16)


def test_long_prefill_32k():
    gen = torch.Generator("cuda").manual_seed(5)
    n = 32768
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    q, k, v = (randn(n, 8, 128, dtype=torch.bfloat16, gen=gen) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=True)
    rows = slice(n - 64, n)  # the last rows see every key: compare them with the reference
    cu_last = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    ref = reference.flash_attn_varlen_func(q[rows].float(), k.float(), v.float(), cu_last, cu, 64, n, causal=True)
    assert_close(out[rows], ref, torch.bfloat16)
