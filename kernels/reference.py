"""Pure-torch references for the kernels, written for clarity rather than speed.

Same signatures as the kernels in :mod:`accel_plugin.kernels`. They are the
tests' oracle (called with float64 tensors they compute in float64) and the
fallback where Triton cannot run (CPU without ``TRITON_INTERPRET``). fp16 and
bf16 inputs are computed in fp32 and rounded once at the end.

They loop over sequences in Python and build each sequence's full score matrix
([num_heads, q_len, k_len]), so memory grows with the square of the length: fine
for tests and CPU fallback, not for 32k-token prompts.
"""

from __future__ import annotations

import torch

from ._validation import SUPPORTED_DTYPES, validate_paged, validate_varlen, validate_write_kv

__all__ = ["flash_attn_varlen_func", "paged_attention", "write_kv_cache", "attention_mask"]

_ALLOWED = SUPPORTED_DTYPES + (torch.float64,)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_mask(q_len: int, k_len: int, causal: bool, window_size: tuple[int, int],
                   device=None) -> torch.Tensor:
    """bool [q_len, k_len], True where query i may see key j (bottom-right aligned)."""
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    diag = k_len - q_len
    left, right = window_size
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        right = 0
    if right >= 0:
        allowed &= j <= i + diag + right
    if left >= 0:
        allowed &= j >= i + diag - left
    return allowed


def _attention(q, k, v, softmax_scale, causal, window_size, softcap):
    """One sequence. q [q_len, H, D], k/v [k_len, Hkv, D] -> out [q_len, H, D], lse [H, q_len]."""
    compute = _compute_dtype(q.dtype)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    allowed = attention_mask(q.shape[0], k.shape[0], causal, window_size, device=q.device)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # Rows that see no key: probabilities 0 (not nan), output 0, lse -inf.
    p = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None])
    out = torch.einsum("hqk,khd->qhd", p, v)
    return out, lse


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           return_lse=False, *, out=None):
    """Reference for :func:`accel_plugin.kernels.flash_attn_varlen_func` (same contract)."""
    params = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                             window_size, softcap, out, _ALLOWED, check_contents=True)
    return flash_attn_varlen_validated(q, k, v, cu_seqlens_q, cu_seqlens_k, params, causal, return_lse, out)


def flash_attn_varlen_validated(q, k, v, cu_seqlens_q, cu_seqlens_k, params, causal, return_lse, out):
    """The computation of :func:`flash_attn_varlen_func` on inputs that ``validate_varlen``
    accepted (``params`` is what it returned); checks nothing. The kernels' CPU fallback
    calls this after validating once."""
    window = (params.window_left, params.window_right)
    if out is None:
        out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cu_q) - 1):
        rows = slice(cu_q[b], cu_q[b + 1])
        keys = slice(cu_k[b], cu_k[b + 1])
        o, seq_lse = _attention(q[rows], k[keys], v[keys], params.softmax_scale, causal, window, params.softcap)
        out[rows] = o.to(out.dtype)
        lse[:, rows] = seq_lse.float()
    return (out, lse) if return_lse else out


def gather_kv(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[seq_len, Hkv, D]: the first seq_len tokens of one sequence from a paged cache."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = block_table_row[:num_blocks].long()
    return cache[blocks].reshape(num_blocks * block_size, *cache.shape[2:])[:seq_len]


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len,
                    softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0, num_splits=0,
                    out=None):
    """Reference for :func:`accel_plugin.kernels.paged_attention` (same contract; no split-K)."""
    params = validate_paged(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len,
                            softmax_scale, window_size, softcap, num_splits, out, _ALLOWED, check_contents=True)
    return paged_attention_validated(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, params, causal, out)


def paged_attention_validated(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, params, causal, out):
    """The computation of :func:`paged_attention` on inputs that ``validate_paged``
    accepted (``params`` is what it returned); checks nothing."""
    window = (params.window_left, params.window_right)
    if out is None:
        out = torch.zeros_like(q)
    cu_q, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        rows = slice(cu_q[b], cu_q[b + 1])
        if rows.stop == rows.start:
            continue
        k = gather_kv(k_cache, block_table[b], seq_len)
        v = gather_kv(v_cache, block_table[b], seq_len)
        o, _ = _attention(q[rows], k, v, params.softmax_scale, causal, window, params.softcap)
        out[rows] = o.to(out.dtype)
    return out


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping):
    """Reference for :func:`accel_plugin.kernels.write_kv_cache`: cache[slot // bs, slot % bs] = k, v."""
    validate_write_kv(k, v, k_cache, v_cache, slot_mapping, _ALLOWED, check_contents=True)
    write_kv_cache_validated(k, v, k_cache, v_cache, slot_mapping)


def write_kv_cache_validated(k, v, k_cache, v_cache, slot_mapping):
    """The computation of :func:`write_kv_cache` on inputs that ``validate_write_kv``
    accepted; checks nothing."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    k_cache[slots // block_size, slots % block_size] = k[keep]
    v_cache[slots // block_size, slots % block_size] = v[keep]
