"""KV-cache write: scatter new keys and values into a paged cache (vLLM's reshape_and_cache_flash).

``k_cache[slot // block_size, slot % block_size] = k[t]`` (and v) for every token t
whose ``slot_mapping[t]`` is not -1. One program per token copies all kv heads.
k and v may be strided views (e.g. slices of a fused qkv projection) and the
caches may be views into one combined tensor; only the last dim must be contiguous.

Limits: the cache dtype must equal k's (no fp8 quantisation on write).
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import cpu_attention
from ._runtime import enter_kernel, kernels_interpreted
from ._validation import SUPPORTED_DTYPES, validate_write_kv


@triton.jit
def _write_kv_kernel(K, V, KCache, VCache, slot_mapping,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     num_kv_heads,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping + token).to(tl.int64)
    if slot < 0:  # padding token
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    row = token.to(tl.int64)
    for h0 in range(0, num_kv_heads, BLOCK_H):
        heads = h0 + offs_h
        mask = (heads < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(K + row * stride_kt + heads[:, None] * stride_kh + offs_d[None, :], mask=mask)
        v = tl.load(V + row * stride_vt + heads[:, None] * stride_vh + offs_d[None, :], mask=mask)
        kc = KCache + block * stride_kcb + offset * stride_kcs
        vc = VCache + block * stride_vcb + offset * stride_vcs
        tl.store(kc + heads[:, None] * stride_kch + offs_d[None, :], k, mask=mask)
        tl.store(vc + heads[:, None] * stride_vch + offs_d[None, :], v, mask=mask)


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping):
    """Write new keys/values into the paged cache, in place.

    Args:
        k, v: [num_tokens, num_kv_heads, head_dim], fp16/bf16/fp32; any strides, last dim contiguous.
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], dtype of k; any
            strides, last dim contiguous.
        slot_mapping: int64 (or int32) [num_tokens]; slot = block * block_size + offset, -1 = skip.
    """
    entry = enter_kernel(
        k,
        lambda check_contents: validate_write_kv(k, v, k_cache, v_cache, slot_mapping, SUPPORTED_DTYPES,
                                                 check_contents=check_contents),
        lambda params: cpu_attention.write_kv_cache(k, v, k_cache, v_cache, slot_mapping))
    if entry.ran_torch:
        return entry.result
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return None
    block_d = triton.next_power_of_2(head_dim)
    # Up to 2048 elements per copy step; the interpreter takes all heads at once.
    block_h = triton.next_power_of_2(num_kv_heads)
    if not kernels_interpreted():
        block_h = min(block_h, max(1, 2048 // block_d))
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_H=block_h, BLOCK_SIZE=k_cache.shape[1],
        num_warps=4,
    )
    return None
