"""Varlen FlashAttention forward: exact softmax(q k^T * scale) v without the score matrix.

FlashAttention-2 (Dao, 2023, arXiv:2307.08691) in the style of Triton's fused-attention
tutorial: each program owns BLOCK_M query rows of one head of one sequence and
streams the keys in BLOCK_N tiles, keeping an online softmax (m, l, acc) in
registers. Sequences are packed (varlen): ``cu_seqlens_q/k`` give their offsets.

Features: MHA/GQA/MQA (query head h reads kv head h // (H / Hkv)); causal masks
aligned to the bottom-right corner when q and k lengths differ; sliding window
(left, right); softcap; optional log-sum-exp output; fp16/bf16/fp32 inputs with
fp32 accumulation; head dims 32-256 (80 and 96 are padded to 128 in registers).

The key loop is cut into a masked head, an unmasked middle and a masked tail
(the tutorial's causal "stages", generalised to windows): only the tiles that
straddle a boundary pay for masking.

Limits: forward only; no dropout, ALiBi or attention sinks. A wrong
``max_seqlen_q`` (smaller than a real sequence) leaves that sequence's last rows
unwritten; contents are validated only off the compiled path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common, _configs, cpu_attention
from ._runtime import enter_kernel, kernels_interpreted
from ._validation import SUPPORTED_DTYPES, check_flag, validate_varlen


@triton.jit
def _fwd_inner(acc, m_i, l_i, q, k_ptrs, v_ptrs, q_pos, offs_n, offs_d, start, end,
               stride_kt, stride_vt, k_len, window_left, window_right, score_scale, softcap_log2e,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
               LOCAL_LEFT: tl.constexpr, LOCAL_RIGHT: tl.constexpr, USE_SOFTCAP: tl.constexpr,
               UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    d_ok = offs_d < HEAD_DIM
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k_idx = start_n + offs_n
        # int64: (token index x token stride) exceeds 2**31 for long packed batches.
        step_k = start_n.to(tl.int64) * stride_kt
        step_v = start_n.to(tl.int64) * stride_vt
        if MASKED:
            k_ok = k_idx < k_len
            k_t = tl.load(k_ptrs + step_k, mask=k_ok[None, :] & d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + step_v, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        elif EVEN_D:
            k_t = tl.load(k_ptrs + step_k)
            v = tl.load(v_ptrs + step_v)
        else:
            k_t = tl.load(k_ptrs + step_k, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + step_v, mask=d_ok[None, :], other=0.0)
        if UPCAST:
            k_t = k_t.to(tl.float32)
            v = v.to(tl.float32)
        acc, m_i, l_i = _common.attend_tile(acc, m_i, l_i, q, k_t, v, q_pos, k_idx, k_len, window_left,
                                            window_right, score_scale, softcap_log2e, MASKED, LOCAL_LEFT,
                                            LOCAL_RIGHT, USE_SOFTCAP, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(Q, K, V, Out, Lse, cu_seqlens_q, cu_seqlens_k,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                stride_lse_h,
                group_size, window_left, window_right, score_scale, softcap_log2e,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                LOCAL_LEFT: tl.constexpr, LOCAL_RIGHT: tl.constexpr, USE_SOFTCAP: tl.constexpr,
                UPCAST: tl.constexpr, STORE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Highest query tiles first: under a causal mask they have the most keys (less tail).
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q + seq)
    q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
    if start_m * BLOCK_M >= q_len:
        return
    k_start = tl.load(cu_seqlens_k + seq)
    k_len = tl.load(cu_seqlens_k + seq + 1) - k_start
    kv_head = head // group_size
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q_ptrs = Q + (q_start + offs_m).to(tl.int64)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_ptrs = (K + k_start.to(tl.int64) * stride_kt + kv_head * stride_kh
              + offs_n[None, :] * stride_kt + offs_d[:, None])
    v_ptrs = (V + k_start.to(tl.int64) * stride_vt + kv_head * stride_vh
              + offs_n[:, None] * stride_vt + offs_d[None, :])

    # Bottom-right alignment: query row i sees key j <= i + diag under a causal mask.
    diag = k_len - q_len
    row_lo = start_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, q_len) - 1
    lo = 0
    hi = k_len
    full_lo = 0
    full_hi = k_len
    if LOCAL_LEFT:
        lo = tl.maximum(row_lo + diag - window_left, 0)
        full_lo = tl.maximum(row_hi + diag - window_left, 0)
    if LOCAL_RIGHT:
        hi = tl.maximum(tl.minimum(row_hi + diag + window_right + 1, k_len), 0)
        full_hi = tl.maximum(tl.minimum(row_lo + diag + window_right + 1, k_len), 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    q_pos = offs_m + diag
    b, c = _common.key_segments(lo, hi, full_lo, full_hi, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_ptrs, v_ptrs, q_pos, offs_n, offs_d, lo, b,
                               stride_kt, stride_vt, k_len, window_left, window_right, score_scale,
                               softcap_log2e, HEAD_DIM, BLOCK_N, EVEN_D, True, LOCAL_LEFT, LOCAL_RIGHT,
                               USE_SOFTCAP, UPCAST, DOT_PRECISION)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_ptrs, v_ptrs, q_pos, offs_n, offs_d, b, c,
                               stride_kt, stride_vt, k_len, window_left, window_right, score_scale,
                               softcap_log2e, HEAD_DIM, BLOCK_N, EVEN_D, False, LOCAL_LEFT, LOCAL_RIGHT,
                               USE_SOFTCAP, UPCAST, DOT_PRECISION)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_ptrs, v_ptrs, q_pos, offs_n, offs_d, c, hi,
                               stride_kt, stride_vt, k_len, window_left, window_right, score_scale,
                               softcap_log2e, HEAD_DIM, BLOCK_N, EVEN_D, True, LOCAL_LEFT, LOCAL_RIGHT,
                               USE_SOFTCAP, UPCAST, DOT_PRECISION)

    out, lse2 = _common.finalize(acc, m_i, l_i)
    o_ptrs = Out + (q_start + offs_m).to(tl.int64)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    if STORE_LSE:
        lse_ptrs = Lse + head.to(tl.int64) * stride_lse_h + q_start + offs_m
        tl.store(lse_ptrs, lse2 * 0.6931471805599453, mask=m_ok)  # log2 -> natural log


def dot_precision(dtype: torch.dtype):
    """tl.dot input precision: fp32 inputs use three tf32 products (tf32x3, near-fp32 accuracy
    on tensor cores; plain tf32 would lose ~3 digits, ieee spills heavily); others use the default.
    The interpreter computes dots exactly whatever this says."""
    return "tf32x3" if dtype == torch.float32 else None


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           return_lse=False, *, out=None, plans=None):
    """Exact attention over packed variable-length sequences (flash-attn's varlen API).

    Args:
        q: [total_q, num_heads, head_dim], fp16/bf16/fp32; any strides, last dim contiguous.
        k, v: [total_k, num_kv_heads, head_dim], dtype of q; num_heads % num_kv_heads == 0.
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1], cumulative sequence starts (first 0).
            Rows of q at or beyond cu_seqlens_q[-1] are padding.
        max_seqlen_q, max_seqlen_k: int, at least the longest q / k sequence.
        softmax_scale: float, default 1/sqrt(head_dim).
        causal: mask keys after the query, aligned to the bottom-right corner when a
            sequence's q and k lengths differ (query i sees keys j <= i + k_len - q_len).
        window_size: (left, right); query i sees keys in [i + d - left, i + d + right] with
            d = k_len - q_len; -1 = unbounded. causal sets right to 0.
        softcap: > 0 applies s = softcap * tanh(s / softcap) to the scaled scores.
        return_lse: also return the log-sum-exp (natural log) fp32 [num_heads, total_q].
        out: optional preallocated output, the shape and dtype of q (keyword only).
        plans: optional dict, one per step, in which the torch CPU path keeps the step's index
            work for the step's other layers (keyword only; the Triton kernel ignores it). The
            first call with a dict checks cu_seqlens' contents, later ones do not.

    Returns:
        out [total_q, num_heads, head_dim], dtype of q, or (out, lse) when return_lse.
        Padding rows are zero in a freshly allocated out (lse -inf) and untouched in a
        caller's out. A row that sees no key gets 0 and lse -inf.
    """
    def validate(check_contents):
        check_flag("causal", causal)
        check_flag("return_lse", return_lse)
        return validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                               window_size, softcap, out, SUPPORTED_DTYPES,
                               check_contents=check_contents and not plans)

    entry = enter_kernel(q, validate, lambda params: cpu_attention.run_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, params, causal, return_lse, out, plans))
    if entry.ran_torch:
        return entry.result
    params = entry.params

    total_q, num_heads, head_dim = q.shape
    if out is None:
        out = torch.zeros_like(q)
    lse = torch.full((num_heads, total_q), float("-inf"), dtype=torch.float32, device=q.device) \
        if return_lse else out  # unused pointer when STORE_LSE is off
    batch = cu_seqlens_q.shape[0] - 1
    if params.max_seqlen_q == 0:
        return (out, lse) if return_lse else out

    interpreted = kernels_interpreted()
    block_d = triton.next_power_of_2(head_dim)
    cfg = _configs.flash_config(block_d, q.dtype, q.device, interpreted)
    window_right = 0 if causal else params.window_right
    score_scale, softcap_log2e = _common.score_constants(params.softmax_scale, params.softcap)
    grid = (triton.cdiv(params.max_seqlen_q, cfg.block_m), num_heads, batch)
    _fwd_kernel[grid](
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0) if return_lse else 0,
        num_heads // k.shape[1], params.window_left, window_right, score_scale, softcap_log2e,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        LOCAL_LEFT=params.window_left >= 0, LOCAL_RIGHT=window_right >= 0, USE_SOFTCAP=params.softcap > 0,
        UPCAST=interpreted and q.dtype == torch.bfloat16, STORE_LSE=return_lse,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return (out, lse) if return_lse else out
