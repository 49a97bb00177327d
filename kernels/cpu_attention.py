"""The CPU path of the attention kernels: batched torch, where Triton cannot compile.

Same contracts as :func:`~accel_plugin.kernels.flash_attn_varlen_func` and
:func:`~accel_plugin.kernels.paged_attention` (the public functions dispatch here for
CPU tensors without ``TRITON_INTERPRET``), built for speed rather than clarity
(:mod:`~accel_plugin.kernels.reference` stays the clear oracle):

* Batched: a step's sequences are padded to one ``[batch, q_len, ...]`` problem,
  never looped over in Python. The index work (padding indices, masks, which
  blocks to read) is a :class:`Plan`, built once per step from the metadata and
  shared by every layer (:func:`plan_paged`, :func:`plan_varlen`).
* Fused attention: :func:`torch.nn.functional.scaled_dot_product_attention` (torch's
  fused CPU flash kernel, fp32 accumulation for fp16/bf16) computes scores, mask,
  softmax and ``p @ v`` in one call. Softcap and log-sum-exp outputs, which SDPA has
  not, take batched matmuls in fp32, chunked over the queries to bound memory.
* GQA without copies of K/V per query head: short queries (decode, speculative
  verification) are regrouped as ``[batch, kv_heads, group * q_len, head_dim]``, long
  ones use SDPA's ``enable_gqa``.
* Paged reads: one ``index_select`` of the blocks in use; when K and V are the two
  halves of one cache tensor (vLLM's layout) both come out of the same gather.
  Measured on SmolLM2's shapes, this gather costs less than any kernel that avoids
  it with torch ops (per-block matmuls, or ``torch.compile`` of a gather-fused
  attention, 10-30x slower than the gather plus SDPA on 2 cores).
* No mask tensor where none is needed: fresh prompts of one length use SDPA's own
  causal mask, and a decode batch whose sequences all fill their blocks none.

* Short queries (decode, speculative verification, small chunks: at most
  :data:`NATIVE_MAX_Q` per sequence) and the KV write go to the native C++ kernels
  (:mod:`.cpu_native`) when they could be built: they read the paged cache in place
  through the block table, with no gather, no padding and no plan. This module's torch
  path serves the rest (prefill, where SDPA's blocked matmuls win) and everything where
  the native kernels cannot be built.

Limits: those of the kernels (:mod:`~accel_plugin.kernels.limits`); memory grows
with ``batch x longest sequence`` (padding), not with the square of a length except
for the masks of mixed-length prefill.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from . import cpu_native

__all__ = ["NAME", "NATIVE_MAX_Q", "Plan", "flash_attn_varlen", "native_cpu_ops", "native_disabled", "paged_attention",
           "path_name",
           "plan_paged", "plan_varlen", "run_paged", "run_varlen", "write_kv_cache"]

#: What ``accel doctor`` and the frameworks' start-up lines call this path.
NAME = "torch CPU path (SDPA, batched)"
#: Paged calls whose sequences have at most this many queries each run the native kernel.
#: Measured on SmolLM2's shapes (9 / 3 heads, head 64): the native kernel wins at every
#: decode and verify size; SDPA's blocked matmuls win on long prompts.
NATIVE_MAX_Q = 512
_use_native = [True]


@contextmanager
def native_disabled():
    """Within the block, this process's calls take the torch path only (tests, benchmarks)."""
    before = _use_native[0]
    _use_native[0] = False
    try:
        yield
    finally:
        _use_native[0] = before


def native_cpu_ops():
    """``torch.ops.accel_cpu`` (the native kernels, :mod:`.cpu_native`), or None: disabled
    (:func:`native_disabled`) or not buildable here. Its ops check their arguments themselves
    (shapes, dtypes, every index read), so a framework's per-layer path may call them directly."""
    return cpu_native.load() if _use_native[0] else None



def path_name() -> str:
    """What serves CPU calls in this process: the native kernels with the torch path, or the torch path."""
    if cpu_native.load() is not None:
        return f"{cpu_native.NAME} + {NAME} for prefill"
    return NAME
#: Queries of at most this many rows per kv head (group x q_len) are regrouped per kv head.
GROUPED_ROWS = 64
#: The fp32 matmul path computes at most this many scores at a time.
MAX_SCORES = 1 << 24


@dataclass(frozen=True)
class Plan:
    """One step's index work for one kernel, shared by every layer.

    Sequence ``b`` has ``q_lens[b]`` queries, the last of its ``k_lens[b]`` keys
    (bottom-right aligned); queries are padded to ``max_q`` and keys to ``max_k``.
    """

    batch: int
    max_q: int
    max_k: int
    #: int64 [batch * max_q]: the packed row of each padded query (clamped), or None: rows 0.. in order
    q_rows: torch.Tensor | None
    #: int64 [n]: the padded positions that hold a real query, and their packed rows (None: all, in order)
    valid: torch.Tensor | None
    valid_rows: torch.Tensor | None
    #: bool [batch, 1, max_q, max_k], True where a query may see a key; None: no mask needed
    mask: torch.Tensor | None
    causal_square: bool  #: no mask, SDPA's is_causal (every q_len == k_len == max_k, no window)
    empty_rows: torch.Tensor | None  #: bool [batch, max_q, 1, 1]: real rows that see no key (None: none)
    #: paged: int64 [batch * blocks] block ids to gather; varlen: int64 [batch * max_k] key rows (None: view)
    kv_index: torch.Tensor | None
    #: paged: (first, bool [batch, max_k - first, 1, 1]) the gathered slots from ``first`` on that are
    #: past their sequence's length (None: none). They hold whatever the cache holds there (TGI
    #: allocates it with torch.empty): masked scores alone let a NaN through as 0 * NaN in P @ V.
    stale: tuple[int, torch.Tensor] | None = None
    derived: dict = field(default_factory=dict, compare=False, repr=False)


def _allowed(q_lens, k_lens, max_q, max_k, causal, window_left, window_right):
    """bool [batch, max_q, max_k] mask and the bool [batch, max_q] rows that hold a query."""
    dev = q_lens.device
    i = torch.arange(max_q, device=dev)[None, :, None]
    j = torch.arange(max_k, device=dev)[None, None, :]
    pos = i + (k_lens - q_lens)[:, None, None]  # the query's position among its keys
    allowed = (j < k_lens[:, None, None]) & (i < q_lens[:, None, None])
    right = 0 if causal else window_right
    if right >= 0:
        allowed &= j <= pos + right
    if window_left >= 0:
        allowed &= j >= pos - window_left
    return allowed


def _plan(q_lens, k_lens, q_starts, max_k, causal, window, kv_index) -> Plan:
    batch = int(q_lens.numel())
    max_q = int(q_lens.max()) if batch else 0
    left, right = window
    uniform = bool((q_lens == max_q).all()) and int(q_starts[0]) == 0 and bool(
        (q_starts[1:] == q_starts[:-1] + max_q).all())
    slot = torch.arange(max_q, device=q_lens.device)
    rows = q_starts[:, None] + slot[None, :]
    in_seq = slot[None, :] < q_lens[:, None]
    q_rows = valid = valid_rows = None
    if not uniform:
        q_rows = torch.where(in_seq, rows, 0).flatten()  # row 0 exists: some query is real
        valid = torch.nonzero(in_seq.flatten()).flatten()
        valid_rows = rows.flatten()[valid]
    square = (causal and left < 0 and bool((q_lens == k_lens).all())
              and bool((k_lens == max_k).all()))
    mask = empty = None
    if not square:
        allowed = _allowed(q_lens, k_lens, max_q, max_k, causal, left, right)
        if not bool(allowed[in_seq].all()):
            mask = allowed[:, None]
        sees = allowed.any(-1) | ~in_seq
        if not bool(sees.all()):
            empty = ~sees[:, :, None, None]
    return Plan(batch, max_q, max_k, q_rows, valid, valid_rows, mask, square, empty, kv_index)


def plan_paged(cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, block_size: int,
               causal: bool, window_size: tuple[int, int]) -> Plan:
    """The plan of a :func:`paged_attention` call (arguments validated by the caller).

    Keys are padded to whole blocks: ``max_k = blocks x block_size`` for the longest sequence.
    """
    cu = cu_seqlens_q.long()
    q_lens, k_lens = cu[1:] - cu[:-1], seq_lens.long()
    blocks = int((k_lens.max() + block_size - 1) // block_size) if k_lens.numel() else 0
    used = torch.arange(blocks, device=k_lens.device)[None, :] < ((k_lens + block_size - 1) // block_size)[:, None]
    ids = torch.where(used, block_table[:, :blocks].long(), 0).flatten()
    plan = _plan(q_lens, k_lens, cu[:-1], blocks * block_size, causal, window_size, ids)
    first = int(k_lens.min()) if k_lens.numel() else 0
    if first < plan.max_k:
        past = torch.arange(first, plan.max_k, device=k_lens.device)[None, :] >= k_lens[:, None]
        plan = replace(plan, stale=(first, past[:, :, None, None]))
    return plan


def plan_varlen(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool,
                window_size: tuple[int, int]) -> Plan:
    """The plan of a :func:`flash_attn_varlen` call (arguments validated by the caller)."""
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    q_lens, k_lens = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    max_k = int(k_lens.max()) if k_lens.numel() else 0
    index = None
    if q_lens.numel() > 1 or int(cu_k[0]) != 0:
        j = torch.arange(max_k, device=cu_k.device)[None, :]
        index = torch.where(j < k_lens[:, None], cu_k[:-1, None] + j, 0).flatten()
    return _plan(q_lens, k_lens, cu_q[:-1], max_k, causal, window_size, index)


def _pad_queries(q: torch.Tensor, plan: Plan) -> torch.Tensor:
    """[batch, max_q, H, D]."""
    if plan.q_rows is None:
        return q[: plan.batch * plan.max_q].view(plan.batch, plan.max_q, *q.shape[1:])
    return q.index_select(0, plan.q_rows).view(plan.batch, plan.max_q, *q.shape[1:])


def _gather_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, plan: Plan):
    """K and V [batch, max_k, Hkv, D] of the plan's blocks, from one gather when they share a tensor."""
    nb, bs, hkv, d = k_cache.shape
    s = k_cache.stride()
    if (v_cache.stride() == s and s[3] == 1 and s[2] == 2 * d and s[1] == hkv * 2 * d and s[0] == bs * s[1]
            and v_cache.data_ptr() - k_cache.data_ptr() == d * k_cache.element_size()):
        kv = torch.as_strided(k_cache, (nb, bs, hkv, 2 * d), s).index_select(0, plan.kv_index)
        kv = kv.view(plan.batch, plan.max_k, hkv, 2 * d)
        return kv[..., :d], kv[..., d:]
    k = k_cache.index_select(0, plan.kv_index).view(plan.batch, plan.max_k, hkv, d)
    v = v_cache.index_select(0, plan.kv_index).view(plan.batch, plan.max_k, hkv, d)
    return k, v


def _grouped_mask(plan: Plan, group: int) -> torch.Tensor | None:
    """The mask for queries regrouped as [batch, Hkv, group * max_q, D] (cached per group)."""
    if plan.mask is None or group == 1:
        return plan.mask
    if group not in plan.derived:
        b, _, mq, mk = plan.mask.shape
        plan.derived[group] = plan.mask[:, :, None].expand(b, 1, group, mq, mk).reshape(b, 1, group * mq, mk)
    return plan.derived[group]


def _sdpa(q, k, v, plan: Plan, scale: float) -> torch.Tensor:
    """q [B, Mq, H, D], k/v [B, Mk, Hkv, D] -> [B, Mq, H, D] with SDPA."""
    b, mq, h, d = q.shape
    hkv = k.shape[2]
    group = h // hkv
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    if group > 1 and group * mq <= GROUPED_ROWS and not plan.causal_square:
        qg = q.view(b, mq, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, group * mq, d)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=_grouped_mask(plan, group), scale=scale)
        return o.view(b, hkv, group, mq, d).permute(0, 3, 1, 2, 4).reshape(b, mq, h, d)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=plan.mask, is_causal=plan.causal_square,
                                       scale=scale, enable_gqa=group > 1)
    return o.transpose(1, 2)


def _matmul(q, k, v, plan: Plan, scale: float, softcap: float):
    """fp32 batched matmuls (softcap, log-sum-exp): ([B, Mq, H, D] out, [B, Mq, H] lse)."""
    b, mq, h, d = q.shape
    hkv = k.shape[2]
    group = h // hkv
    kt = k.permute(0, 2, 3, 1).float()  # [B, Hkv, D, Mk]
    vt = v.transpose(1, 2).float()  # [B, Hkv, Mk, D]
    out = torch.empty(b, mq, h, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, mq, h, dtype=torch.float32, device=q.device)
    step = max(1, MAX_SCORES // max(1, b * h * plan.max_k))
    if plan.causal_square:
        keys = torch.arange(plan.max_k, device=q.device)
    for lo in range(0, mq, step):
        hi = min(mq, lo + step)
        m = hi - lo
        qc = q[:, lo:hi].float().view(b, m, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, group * m, d)
        s = torch.matmul(qc, kt).mul_(scale).view(b, hkv, group, m, plan.max_k)
        if softcap > 0:
            s = s.div_(softcap).tanh_().mul_(softcap)
        if plan.causal_square:
            s.masked_fill_(keys[None, :] > torch.arange(lo, hi, device=q.device)[:, None], float("-inf"))
        elif plan.mask is not None:
            s.masked_fill_(~plan.mask[:, :, None, lo:hi], float("-inf"))
        chunk_lse = torch.logsumexp(s, -1)  # [B, Hkv, G, m]
        p = torch.exp(s.sub_(chunk_lse.nan_to_num(neginf=0.0)[..., None]))
        o = torch.matmul(p.view(b, hkv, group * m, plan.max_k), vt).view(b, hkv, group, m, d)
        out[:, lo:hi] = o.permute(0, 3, 1, 2, 4).reshape(b, m, h, d)
        lse[:, lo:hi] = chunk_lse.permute(0, 3, 1, 2).reshape(b, m, h)
    return out, lse


def _attend(q, k, v, plan: Plan, scale: float, softcap: float, want_lse: bool):
    if softcap > 0 or want_lse:
        out, lse = _matmul(q, k, v, plan, scale, softcap)
    else:
        out, lse = _sdpa(q, k, v, plan, scale), None
    if plan.empty_rows is not None:  # rows that see no key: 0, lse -inf
        out = out.masked_fill(plan.empty_rows, 0.0)
        if lse is not None:
            lse = lse.masked_fill(plan.empty_rows[..., 0], float("-inf"))
    return out, lse


def _scatter(padded: torch.Tensor, plan: Plan, out: torch.Tensor) -> None:
    """Write the real rows of ``padded`` [B, Mq, ...] into the packed ``out``."""
    flat = padded.reshape(plan.batch * plan.max_q, *padded.shape[2:])
    if plan.valid is None:
        out[: flat.shape[0]] = flat
    else:
        out.index_copy_(0, plan.valid_rows, flat.index_select(0, plan.valid).to(out.dtype))


def flash_attn_varlen(q, k, v, plan: Plan, softmax_scale: float, softcap: float, return_lse: bool, out=None):
    """:func:`~accel_plugin.kernels.flash_attn_varlen_func` on validated inputs and its plan."""
    if out is None:
        out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
    if plan.batch and plan.max_q:
        if plan.kv_index is None:
            kp, vp = k[: plan.max_k][None], v[: plan.max_k][None]
        else:
            kp = k.index_select(0, plan.kv_index).view(plan.batch, plan.max_k, *k.shape[1:])
            vp = v.index_select(0, plan.kv_index).view(plan.batch, plan.max_k, *v.shape[1:])
        o, seq_lse = _attend(_pad_queries(q, plan), kp, vp, plan, softmax_scale, softcap, return_lse)
        _scatter(o.to(q.dtype), plan, out)
        if return_lse:
            _scatter(seq_lse, plan, lse.T)
    return (out, lse) if return_lse else out


def paged_attention(q, k_cache, v_cache, plan: Plan, softmax_scale: float, softcap: float, out=None):
    """:func:`~accel_plugin.kernels.paged_attention` on validated inputs and its plan."""
    if out is None:
        out = torch.zeros_like(q)
    if plan.batch and plan.max_q and q.shape[0]:
        k, v = _gather_blocks(k_cache, v_cache, plan)  # fresh tensors: zeroing their stale slots is safe
        if plan.stale is not None:
            first, past = plan.stale
            k[:, first:].masked_fill_(past, 0.0)
            v[:, first:].masked_fill_(past, 0.0)
        o, _ = _attend(_pad_queries(q, plan), k, v, plan, softmax_scale, softcap, False)
        _scatter(o.to(q.dtype), plan, out)
    return out


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    """:func:`~accel_plugin.kernels.write_kv_cache` on validated inputs: the native kernel, else one
    index_copy per cache."""
    native = native_cpu_ops()
    if native is not None:
        native.write_kv_cache(k, v, k_cache, v_cache, slot_mapping.contiguous())
        return
    slots = slot_mapping.long()
    if slots.numel() and int(slots.min()) < 0:
        keep = slots >= 0
        k, v, slots = k[keep], v[keep], slots[keep]
    for cache, new in ((k_cache, k), (v_cache, v)):
        if cache.stride(0) == cache.shape[1] * cache.stride(1):
            cache.flatten(0, 1).index_copy_(0, slots, new)  # a view: blocks and slots are one axis
        else:
            bs = cache.shape[1]
            cache[slots // bs, slots % bs] = new


def run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, params, causal: bool, return_lse: bool, out=None,
               plans: dict | None = None):
    """:func:`flash_attn_varlen` with its plan taken from ``plans`` (a step's cache, keyed by the
    options) or built and stored there; ``params``: what ``validate_varlen`` returned."""
    window = (params.window_left, params.window_right)
    key = ("varlen", causal, window)
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = plan_varlen(cu_seqlens_q, cu_seqlens_k, causal, window)
        if plans is not None:
            plans[key] = plan
    return flash_attn_varlen(q, k, v, plan, params.softmax_scale, params.softcap, return_lse, out)


def run_paged(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, params, causal: bool, out=None,
              plans: dict | None = None):
    """:func:`paged_attention` on the native kernel for short queries, else with its plan taken from,
    or stored in, ``plans`` (see :func:`run_varlen`)."""
    native = native_cpu_ops() if params.max_seqlen_q <= NATIVE_MAX_Q else None
    if native is not None:
        if out is None:
            out = torch.zeros_like(q)
        if q.shape[0] and seq_lens.shape[0]:
            native.paged_attention(out, q, k_cache, v_cache, cu_seqlens_q.contiguous(), seq_lens.contiguous(),
                                   block_table, params.softmax_scale, params.softcap, params.window_left,
                                   0 if causal else params.window_right)
        if plans is not None:
            plans["native"] = True  # the step's contents were checked once: later layers skip that
        return out
    window = (params.window_left, params.window_right)
    key = ("paged", causal, window, k_cache.shape[1])
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = plan_paged(cu_seqlens_q, seq_lens, block_table, k_cache.shape[1], causal, window)
        if plans is not None:
            plans[key] = plan
    return paged_attention(q, k_cache, v_cache, plan, params.softmax_scale, params.softcap, out)
