"""Paged attention over a block-table KV cache, with split-K (flash-decoding).

One kernel serves decode (q_len 1), speculative verification (q_len k+1),
chunked prefill over a cached context and mixed batches of these: each
sequence's queries are the last ``q_len`` of its ``seq_len`` tokens, so causal
masks are bottom-right aligned. The design follows vLLM's Triton unified
attention and FlashDecoding (Dao et al., 2023):

* A program owns BLOCK_Q queries of one sequence times all ``H / Hkv`` query
  heads of one kv head, so every K/V tile is loaded once per GQA group; this is
  what lets decode approach memory bandwidth.
* Keys are gathered token by token through ``block_table`` (any block size in
  [16, 256], tiles may straddle blocks), with int64 offsets into the cache.
* Split-K: with few programs (small batch, long context) each sequence's keys
  are cut into ``num_splits`` ranges processed in parallel; a second kernel
  merges the partial (output, log-sum-exp) pairs.
* The grid over query tiles is sized from ``q.shape[0]`` and the batch without a
  host sync; each program finds its sequence by binary search in cu_seqlens_q.
* CUDA graphs: every launch choice (grid, tile sizes, ``num_splits``) is a function
  of shapes and of the ``max_seqlen_q`` / ``max_seq_len`` bounds the caller passes
  (:func:`auto_num_splits`), never of tensor contents, and with a ``workspace`` the
  split-K partials need no allocation: a step captured with fixed shapes and bounds
  replays correctly whatever lengths and block tables its buffers hold then.

Limits: no ALiBi, sinks or fp8 caches. Rows of q at or beyond cu_seqlens_q[-1]
are never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common, _configs, cpu_attention
from ._runtime import TORCH, enter_kernel, kernels_interpreted, runtime_mode
from ._validation import SUPPORTED_DTYPES, check_flag, validate_paged
from .flash_attn import dot_precision


@triton.jit
def _find_sequence(cu_seqlens_q, num_seqs, tile, BLOCK_Q: tl.constexpr):
    # Sequence s owns global tiles from cu_seqlens_q[s] // BLOCK_Q + s on (strictly increasing in s).
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_seqlens_q + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_inner(acc, m_i, l_i, q, k_base, v_base, bt_row, q_pos, offs_n, offs_d, start, end,
                 stride_kb, stride_ks, stride_vb, stride_vs, seq_len, window_left, window_right,
                 score_scale, softcap_log2e,
                 HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 EVEN_D: tl.constexpr, MASKED: tl.constexpr, LOCAL_LEFT: tl.constexpr,
                 LOCAL_RIGHT: tl.constexpr, USE_SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    d_ok = offs_d < HEAD_DIM
    for start_n in range(start, end, TILE_N):
        k_idx = start_n + offs_n
        k_ok = k_idx < seq_len
        if MASKED:
            block = tl.load(bt_row + k_idx // BLOCK_SIZE, mask=k_ok, other=0)
        else:
            block = tl.load(bt_row + k_idx // BLOCK_SIZE)
        slot = k_idx % BLOCK_SIZE
        # int64: block index x block stride exceeds 2**31 in caches of a few GB.
        k_off = block.to(tl.int64) * stride_kb + slot * stride_ks
        v_off = block.to(tl.int64) * stride_vb + slot * stride_vs
        if MASKED:
            k_t = tl.load(k_base + k_off[None, :] + offs_d[:, None], mask=k_ok[None, :] & d_ok[:, None], other=0.0)
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        elif EVEN_D:
            k_t = tl.load(k_base + k_off[None, :] + offs_d[:, None])
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :])
        else:
            k_t = tl.load(k_base + k_off[None, :] + offs_d[:, None], mask=d_ok[:, None], other=0.0)
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        if UPCAST:
            k_t = k_t.to(tl.float32)
            v = v.to(tl.float32)
        acc, m_i, l_i = _common.attend_tile(acc, m_i, l_i, q, k_t, v, q_pos, k_idx, seq_len, window_left,
                                            window_right, score_scale, softcap_log2e, MASKED, LOCAL_LEFT,
                                            LOCAL_RIGHT, USE_SOFTCAP, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _paged_kernel(Out, PartOut, PartLse, Q, KCache, VCache, cu_seqlens_q, seq_lens, block_table,
                  stride_qt, stride_qh, stride_ot, stride_oh,
                  stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                  stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                  num_seqs, num_splits, window_left, window_right, score_scale, softcap_log2e,
                  GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  LOCAL_LEFT: tl.constexpr, LOCAL_RIGHT: tl.constexpr, USE_SOFTCAP: tl.constexpr,
                  UPCAST: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = _find_sequence(cu_seqlens_q, num_seqs, tile, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q + seq)
    q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
    q_first = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if q_first >= q_len:
        return
    seq_len = tl.load(seq_lens + seq)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D

    # Row r of the tile is query q_first + r // GROUP of head kv_head * GROUP + r % GROUP.
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_idx = q_first + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_idx < q_len)
    d_ok = offs_d < HEAD_DIM
    q_rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # Queries are the last q_len tokens: absolute position = context length + index.
    context = seq_len - q_len
    q_pos = context + q_idx
    pos_lo = context + q_first
    pos_hi = context + tl.minimum(q_first + BLOCK_Q, q_len) - 1
    lo = 0
    hi = seq_len
    full_lo = 0
    full_hi = seq_len
    if LOCAL_LEFT:
        lo = tl.maximum(pos_lo - window_left, 0)
        full_lo = tl.maximum(pos_hi - window_left, 0)
    if LOCAL_RIGHT:
        hi = tl.minimum(pos_hi + window_right + 1, seq_len)
        full_hi = tl.minimum(pos_lo + window_right + 1, seq_len)
    # This split's share of the key tiles [lo, hi).
    first_tile = lo // TILE_N
    tiles_per_split = tl.cdiv(tl.cdiv(hi, TILE_N) - first_tile, num_splits)
    lo = (first_tile + split * tiles_per_split) * TILE_N
    hi = tl.minimum((first_tile + (split + 1) * tiles_per_split) * TILE_N, hi)
    b, c = _common.key_segments(lo, hi, full_lo, full_hi, TILE_N)

    k_base = KCache + kv_head.to(tl.int64) * stride_kh
    v_base = VCache + kv_head.to(tl.int64) * stride_vh
    bt_row = block_table + seq.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, m_i, l_i = _paged_inner(acc, m_i, l_i, q, k_base, v_base, bt_row, q_pos, offs_n, offs_d, lo, b,
                                 stride_kb, stride_ks, stride_vb, stride_vs, seq_len, window_left, window_right,
                                 score_scale, softcap_log2e, HEAD_DIM, TILE_N, BLOCK_SIZE, EVEN_D, True,
                                 LOCAL_LEFT, LOCAL_RIGHT, USE_SOFTCAP, UPCAST, DOT_PRECISION)
    acc, m_i, l_i = _paged_inner(acc, m_i, l_i, q, k_base, v_base, bt_row, q_pos, offs_n, offs_d, b, c,
                                 stride_kb, stride_ks, stride_vb, stride_vs, seq_len, window_left, window_right,
                                 score_scale, softcap_log2e, HEAD_DIM, TILE_N, BLOCK_SIZE, EVEN_D, False,
                                 LOCAL_LEFT, LOCAL_RIGHT, USE_SOFTCAP, UPCAST, DOT_PRECISION)
    acc, m_i, l_i = _paged_inner(acc, m_i, l_i, q, k_base, v_base, bt_row, q_pos, offs_n, offs_d, c, hi,
                                 stride_kb, stride_ks, stride_vb, stride_vs, seq_len, window_left, window_right,
                                 score_scale, softcap_log2e, HEAD_DIM, TILE_N, BLOCK_SIZE, EVEN_D, True,
                                 LOCAL_LEFT, LOCAL_RIGHT, USE_SOFTCAP, UPCAST, DOT_PRECISION)
    out, lse2 = _common.finalize(acc, m_i, l_i)
    mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        p_ptrs = PartOut + q_rows[:, None] * stride_pt + head[:, None] * stride_ph + split * stride_ps
        tl.store(p_ptrs + offs_d[None, :], out, mask=mask)
        tl.store(PartLse + q_rows * stride_lt + head * stride_lh + split, lse2, mask=row_ok)
    else:
        o_ptrs = Out + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _merge_splits_kernel(Out, PartOut, PartLse, cu_seqlens_q,
                         stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                         num_seqs, num_heads, num_splits,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_S: tl.constexpr):
    token = tl.program_id(0)
    if token >= tl.load(cu_seqlens_q + num_seqs):
        return
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    splits = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = heads < num_heads
    hs_ok = h_ok[:, None] & (splits < num_splits)[None, :]
    row = token.to(tl.int64)
    lse2 = tl.load(PartLse + row * stride_lt + heads[:, None] * stride_lh + splits[None, :],
                   mask=hs_ok, other=float("-inf"))
    m = tl.max(lse2, 1)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse2 - m[:, None])  # empty splits (lse -inf) weigh 0
    denom = tl.sum(w, 1)
    p_ptrs = (PartOut + row * stride_pt + heads[:, None, None] * stride_ph + splits[None, :, None] * stride_ps
              + offs_d[None, None, :])
    part = tl.load(p_ptrs, mask=hs_ok[:, :, None] & (offs_d < HEAD_DIM)[None, None, :], other=0.0)
    out = tl.sum(part * w[:, :, None], 1) / tl.where(denom == 0.0, 1.0, denom)[:, None]
    o_ptrs = Out + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=h_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


def _launch_shape(num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int,
                  dtype: torch.dtype, device: torch.device, max_seqlen_q: int, interpreted: bool):
    """(config, block_q, block_m, num_tiles, padded head dim) of a launch: shapes and bounds only."""
    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    cfg = _configs.paged_config(block_d, dtype, device, interpreted)
    block_q = max(1, min(cfg.block_m // group, max_seqlen_q))
    block_m = max(16, triton.next_power_of_2(block_q * group))
    return cfg, block_q, block_m, num_tokens // block_q + num_seqs, block_d


def auto_num_splits(num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, device: torch.device, max_seqlen_q: int, max_seq_len: int) -> int:
    """The split-K count ``num_splits=0`` chooses for ``q`` ``[num_tokens, num_heads, head_dim]``
    and ``num_seqs`` sequences: a function of the shapes and of the bounds ``max_seqlen_q``
    and ``max_seq_len`` only. For a CUDA graph pass the padded batch and the model's
    maximum length as the bound: the split is then the same at capture and at every replay.
    """
    if runtime_mode(device) == TORCH:
        return 1  # the torch CPU path computes the call: nothing to split
    interpreted = kernels_interpreted()
    cfg, block_q, _, num_tiles, _ = _launch_shape(num_tokens, num_seqs, num_heads, num_kv_heads, head_dim,
                                                  dtype, device, max_seqlen_q, interpreted)
    busy_tiles = min(num_tiles, num_seqs * triton.cdiv(max_seqlen_q, block_q))
    return _configs.choose_num_splits(busy_tiles * num_kv_heads, max_seq_len, cfg.tile_n,
                                      _configs.num_sms(device, interpreted))


def split_workspace_numel(num_tokens: int, num_heads: int, head_dim: int, num_splits: int) -> int:
    """float32 elements a ``workspace`` needs for ``num_splits`` split-K partials
    (output and log-sum-exp per token, head and split); 0 without splitting."""
    return 0 if num_splits <= 1 else num_tokens * num_heads * num_splits * (head_dim + 1)


def _split_buffers(workspace, num_tokens: int, num_heads: int, head_dim: int, num_splits: int, device):
    """(part_out, part_lse): views of ``workspace`` when given, else fresh tensors."""
    if workspace is None:
        return (torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
                torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=device))
    n_out = num_tokens * num_heads * num_splits * head_dim
    part_out = workspace[:n_out].view(num_tokens, num_heads, num_splits, head_dim)
    part_lse = workspace[n_out:n_out + num_tokens * num_heads * num_splits].view(num_tokens, num_heads, num_splits)
    return part_out, part_lse


def _check_workspace(workspace, q) -> None:
    if workspace is None:
        return
    ok = (isinstance(workspace, torch.Tensor) and workspace.dim() == 1 and workspace.dtype == torch.float32
          and workspace.is_contiguous() and workspace.device == q.device)
    if not ok:
        got = (f"{workspace.dtype} {tuple(workspace.shape)} on {workspace.device}"
               if isinstance(workspace, torch.Tensor) else type(workspace).__name__)
        raise ValueError(f"workspace must be a contiguous 1-D torch.float32 tensor on q's device ({q.device}), "
                         f"sized with split_workspace_numel; got {got}")


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len,
                    softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0, num_splits=0,
                    out=None, workspace=None, *, plans=None):
    """Attention of packed queries over a paged KV cache.

    Args:
        q: [total_q, num_heads, head_dim], fp16/bf16/fp32; any strides, last dim contiguous.
            Sequence b's queries are rows cu_seqlens_q[b]:cu_seqlens_q[b+1], its LAST q_len tokens.
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], dtype of q, any
            strides with the last dim contiguous (views such as kv_cache[0], kv_cache[1] work).
        cu_seqlens_q: int32 [batch + 1]. Rows at or beyond cu_seqlens_q[-1] are left untouched.
        seq_lens: int32 [batch], whole context per sequence including its queries.
        block_table: int32 [batch, max_blocks_per_seq]; entries past a sequence's last block
            are never read. Row stride may be anything, last dim contiguous.
        max_seqlen_q, max_seq_len: int, at least max(q_len) and max(seq_lens).
        softmax_scale, causal, window_size, softcap: as in flash_attn_varlen_func.
        num_splits: split-K pieces per sequence; 0 = automatic (fills the GPU; from the shapes
            and the bounds max_seqlen_q, max_seq_len only: :func:`auto_num_splits`), 1 = off.
        out: optional preallocated output, the shape and dtype of q (may be a view).
        workspace: optional 1-D float32 tensor on q's device holding the split-K partials
            instead of allocating them (CUDA graphs). The automatic choice splits no more
            than it holds; an explicit num_splits that does not fit raises ValueError.
        plans: optional dict, one per step, in which the torch CPU path keeps the step's index
            work for the step's other layers (keyword only; the Triton kernels ignore it). The
            first call with a dict checks the index tensors' contents, later ones do not.

    Returns:
        out [total_q, num_heads, head_dim] (the ``out`` passed in, if any).
    """
    def validate(check_contents):
        check_flag("causal", causal)
        _check_workspace(workspace, q)
        return validate_paged(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q,
                              max_seq_len, softmax_scale, window_size, softcap, num_splits, out,
                              SUPPORTED_DTYPES, check_contents=check_contents and not plans)

    entry = enter_kernel(q, validate, lambda params: cpu_attention.run_paged(
        q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, params, causal, out, plans))
    if entry.ran_torch:
        return entry.result
    params = entry.params
    if out is None:
        out = torch.zeros_like(q)
    num_seqs = seq_lens.shape[0]
    max_seqlen_q, max_seq_len, num_splits = params.max_seqlen_q, params.max_seqlen_k, int(num_splits)
    if max_seqlen_q == 0 or num_seqs == 0 or q.shape[0] == 0:
        return out

    interpreted = kernels_interpreted()
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[2]
    cfg, block_q, block_m, num_tiles, block_d = _launch_shape(q.shape[0], num_seqs, num_heads, k_cache.shape[2],
                                                              head_dim, q.dtype, q.device, max_seqlen_q, interpreted)
    per_split = q.shape[0] * num_heads * (head_dim + 1)  # workspace values per split
    if num_splits == 0:
        num_splits = auto_num_splits(q.shape[0], num_seqs, num_heads, k_cache.shape[2], head_dim, q.dtype,
                                     q.device, max_seqlen_q, max_seq_len)
        if workspace is not None:  # as many splits as the workspace holds (shapes only: graph-safe)
            num_splits = max(1, min(num_splits, workspace.numel() // per_split))
    elif workspace is not None and num_splits > 1 and workspace.numel() < num_splits * per_split:
        raise ValueError(f"workspace holds {workspace.numel()} float32 values; num_splits={num_splits} needs "
                         f"{num_splits * per_split} (split_workspace_numel)")
    split = num_splits > 1
    if split:
        part_out, part_lse = _split_buffers(workspace, q.shape[0], num_heads, head_dim, num_splits, q.device)
    else:
        part_out = part_lse = out  # unused pointers when SPLIT is off
    window_right = 0 if causal else params.window_right
    score_scale, softcap_log2e = _common.score_constants(params.softmax_scale, params.softcap)
    _paged_kernel[(num_tiles, k_cache.shape[2], num_splits)](
        out, part_out, part_lse, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if split else 0,
        part_lse.stride(0), part_lse.stride(1),
        num_seqs, num_splits, params.window_left, window_right, score_scale, softcap_log2e,
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, TILE_N=cfg.tile_n, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, BLOCK_D=block_d, LOCAL_LEFT=params.window_left >= 0, LOCAL_RIGHT=window_right >= 0,
        USE_SOFTCAP=params.softcap > 0, UPCAST=interpreted and q.dtype == torch.bfloat16, SPLIT=split,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split:
        block_h = triton.next_power_of_2(num_heads) if interpreted else 1
        _merge_splits_kernel[(q.shape[0], triton.cdiv(num_heads, block_h))](
            out, part_out, part_lse, cu_seqlens_q,
            out.stride(0), out.stride(1), part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), num_seqs, num_heads, num_splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_H=block_h, BLOCK_S=triton.next_power_of_2(num_splits),
            num_warps=4 if interpreted else max(1, min(8, block_d * num_splits // 256)),
        )
    return out
