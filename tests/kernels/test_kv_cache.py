"""write_kv_cache: scatter into a paged cache, against the reference and end to end."""

import pytest
import torch

from accel_plugin.kernels import paged_attention, reference, write_kv_cache


def fused_kv(inputs, num_tokens, num_heads, num_kv_heads, head_dim, dtype):
    """k, v as vLLM passes them: strided slices of one qkv projection."""
    qkv = inputs.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, dtype=dtype)
    return qkv[:, num_heads:num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads:]


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_matches_reference(inputs, dtype, block_size):
    num_tokens, num_kv_heads, head_dim, num_blocks = 37, 2, 64, 5
    k, v = fused_kv(inputs, num_tokens, 4, num_kv_heads, head_dim, dtype)
    assert not k.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=inputs.gen)[:num_tokens]
    slots[[0, 7, 30]] = -1  # padding tokens
    slots = slots.to(inputs.device)
    kv_cache = torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=inputs.device)
    expected = kv_cache.clone()
    write_kv_cache(k, v, kv_cache[0], kv_cache[1], slots)
    reference.write_kv_cache(k, v, expected[0], expected[1], slots)
    assert torch.equal(kv_cache, expected)
    written = slots[slots >= 0]
    assert torch.equal(kv_cache[0].flatten(0, 1)[written], k[slots >= 0])
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=inputs.device)
    untouched[written] = False
    assert torch.all(kv_cache[:, :].flatten(1, 2)[:, untouched] == 0)


def test_int32_slots_and_many_heads(inputs):
    k, v = fused_kv(inputs, 5, 8, 8, 32, torch.float16)
    k_cache = torch.zeros(2, 16, 8, 32, dtype=torch.float16, device=inputs.device)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([31, -1, 0, 17, 5], dtype=torch.int32, device=inputs.device)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.flatten(0, 1)[[31, 0, 17, 5]], k[[0, 2, 3, 4]])
    assert torch.equal(v_cache.flatten(0, 1)[[31, 0, 17, 5]], v[[0, 2, 3, 4]])


def test_empty(inputs):
    k = inputs.randn(0, 2, 32, dtype=torch.float32)
    cache = torch.zeros(2, 16, 2, 32, device=inputs.device)
    write_kv_cache(k, k, cache, cache, torch.zeros(0, dtype=torch.int64, device=inputs.device))
    assert torch.all(cache == 0)


def test_write_then_attend(inputs, check):
    """A prompt written with write_kv_cache, then a decode step over it, equals plain attention."""
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 4, 2, 32, 16, 8
    prompt = 21
    k, v = fused_kv(inputs, prompt + 1, num_heads, num_kv_heads, head_dim, torch.float32)
    blocks = torch.tensor([5, 2], dtype=torch.int32)  # shuffled
    positions = torch.arange(prompt + 1)
    slots = (blocks.long()[positions // block_size] * block_size + positions % block_size).to(inputs.device)
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, device=inputs.device)
    v_cache = torch.zeros_like(k_cache)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    q = inputs.randn(1, num_heads, head_dim, dtype=torch.float32)
    cu_q = torch.tensor([0, 1], dtype=torch.int32, device=inputs.device)
    seq_lens = torch.tensor([prompt + 1], dtype=torch.int32, device=inputs.device)
    table = blocks[None].to(inputs.device)
    out = paged_attention(q, k_cache, v_cache, cu_q, seq_lens, table, 1, prompt + 1)
    cu_k = torch.tensor([0, prompt + 1], dtype=torch.int32, device=inputs.device)
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu_q, cu_k, 1, prompt + 1,
                                           causal=True)
    check.close(out, ref, ref, torch.float32, max_score=check.max_score(q, k))
