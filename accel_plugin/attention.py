"""accel-plugin's attention backends, independent of any serving framework.

Two backends share one paged KV cache (``k_cache``/``v_cache``:
``[num_blocks, block_size, num_kv_heads, head_dim]``, any strides with the last
dimension contiguous) and one batch description, :class:`AttentionBatch`:

* :class:`FlashPagedAttention` (``ACCEL_FLASH``) runs the varlen FlashAttention
  kernel for prompts that have no cached context (their keys and values are this
  step's ``key``/``value``) and the paged kernel for every request that reads the
  cache: decode, chunked-prefill continuations, prefix-cache hits and speculative
  verification (k+1 queries).
* :class:`PagedAttention` (``ACCEL_PAGED``) runs the paged kernel for every token.

A framework adapter builds the :class:`AttentionBatch` once per step with
:meth:`plan_batch` (host-side work: which request goes to which kernel), then per
layer calls :meth:`write_kv` and :meth:`forward`. Steps a CUDA graph may capture
are planned by :class:`GraphBatchBuffers` instead: the same batch, read from
buffers allocated once. Nothing here imports a framework; the kernels are
imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

__all__ = [
    "AttentionBatch",
    "FlashPagedAttention",
    "GraphBatchBuffers",
    "PagedAttention",
    "TokenGroup",
    "UnsupportedAttentionConfig",
    "plan_batch",
]


class UnsupportedAttentionConfig(ValueError):
    """A layer asks for something the accel backends cannot compute."""


@dataclass(frozen=True)
class TokenGroup:
    """The requests of one step that one kernel serves, with their own metadata.

    ``rows`` selects their query rows: a ``slice`` when they are contiguous (no
    copy), else an int64 index tensor on the device (gather and scatter).
    """

    rows: slice | torch.Tensor
    cu_seqlens_q: torch.Tensor  #: int32 [n + 1], relative to the selected rows
    seq_lens: torch.Tensor  #: int32 [n], whole context including the queries
    block_table: torch.Tensor  #: int32 [n, max_blocks]
    max_seqlen_q: int
    max_seq_len: int
    num_reqs: int
    #: float32 scratch for the paged kernel's split-K partials (CUDA graphs), or None
    split_workspace: torch.Tensor | None = None
    #: the torch CPU path's index work for this step, shared by its layers (kernels' ``plans``)
    cpu_plans: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class AttentionBatch:
    """One step's batch, split by kernel. Either group may be ``None`` (no such requests)."""

    num_actual_tokens: int
    fresh: TokenGroup | None  #: prompts without cached context -> flash kernel
    cached: TokenGroup | None  #: everything that reads the KV cache -> paged kernel


def _group(
    req_ids: torch.Tensor,
    q_lens: torch.Tensor,
    qsl_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int | None,
    num_reqs: int,
) -> TokenGroup | None:
    """Metadata for the requests ``req_ids`` (ascending); ``None`` when there are none."""
    n = int(req_ids.numel())
    if n == 0:
        return None
    device = query_start_loc.device
    lens = q_lens[req_ids]
    if n == num_reqs:  # the whole batch: vLLM's tensors as they are
        return TokenGroup(
            rows=slice(0, int(qsl_cpu[-1])),
            cu_seqlens_q=query_start_loc[: num_reqs + 1],
            seq_lens=seq_lens[:num_reqs],
            block_table=block_table[:num_reqs],
            max_seqlen_q=int(lens.max()),
            max_seq_len=max_seq_len if max_seq_len is not None else int(seq_lens_cpu.max()),
            num_reqs=n,
        )
    starts = qsl_cpu[req_ids].long()
    cu = torch.zeros(n + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lens, 0)
    first, last = int(starts[0]), int(starts[-1] + lens[-1])
    if last - first == int(cu[-1]):  # the requests' rows are one contiguous range
        rows: slice | torch.Tensor = slice(first, last)
    else:
        rows = torch.repeat_interleave(starts - cu[:-1], lens) + torch.arange(int(cu[-1]))
        rows = rows.to(device, non_blocking=True)
    idx = req_ids.to(device, non_blocking=True)
    return TokenGroup(
        rows=rows,
        cu_seqlens_q=cu.to(device=device, dtype=torch.int32),
        seq_lens=seq_lens.index_select(0, idx),
        block_table=block_table.index_select(0, idx),
        max_seqlen_q=int(lens.max()),
        max_seq_len=int(seq_lens_cpu[req_ids].max()),
        num_reqs=n,
    )


def plan_batch(
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_actual_tokens: int,
    max_seq_len: int | None = None,
    query_start_loc_cpu: torch.Tensor | None = None,
    seq_lens_cpu: torch.Tensor | None = None,
    split_fresh_prompts: bool,
) -> AttentionBatch:
    """Decide which kernel serves which request of a step.

    ``query_start_loc`` int32 ``[R + 1]``, ``seq_lens`` int32 ``[R]`` (whole
    context including this step's queries), ``block_table`` int32
    ``[R, max_blocks]`` live on the compute device; the ``*_cpu`` copies, when
    given, avoid a device-to-host copy (``seq_lens_cpu`` may be an upper bound
    for requests that have cached context). Requests with no query tokens
    (padding) are skipped. With ``split_fresh_prompts`` the requests whose whole
    context is this step's queries form the ``fresh`` group; the rest form the
    ``cached`` group.
    """
    qsl_cpu = (query_start_loc_cpu if query_start_loc_cpu is not None else query_start_loc.cpu()).long()
    sl_cpu = (seq_lens_cpu if seq_lens_cpu is not None else seq_lens.cpu()).long()
    num_reqs = int(sl_cpu.numel())
    qsl_cpu = qsl_cpu[: num_reqs + 1]
    q_lens = qsl_cpu[1:] - qsl_cpu[:-1]
    active = q_lens > 0
    empty = torch.zeros(0, dtype=torch.long)
    if not bool(active.any()):
        return AttentionBatch(num_actual_tokens, None, None)
    every = torch.arange(num_reqs)
    fresh = active & (sl_cpu == q_lens) if split_fresh_prompts else torch.zeros_like(active)
    cached = active & ~fresh
    # When every active request is in one group, padding requests (no queries) ride
    # along: the kernels skip empty sequences, and vLLM's tensors need no copy.
    if not bool(fresh.any()):
        fresh_ids, cached_ids = empty, every
    elif not bool(cached.any()):
        fresh_ids, cached_ids = every, empty
    else:
        fresh_ids, cached_ids = torch.nonzero(fresh).flatten(), torch.nonzero(cached).flatten()
    args = (q_lens, qsl_cpu, sl_cpu, query_start_loc, seq_lens, block_table)
    # max_seq_len from the framework is an upper bound; only the whole batch uses it.
    return AttentionBatch(
        num_actual_tokens=num_actual_tokens,
        fresh=_group(fresh_ids, *args, max_seq_len, num_reqs),
        cached=_group(cached_ids, *args, max_seq_len, num_reqs),
    )


class GraphBatchBuffers:
    """A step's metadata in tensors allocated once, for steps a CUDA graph captures.

    A replayed graph reads the addresses it read at capture, so the paged kernel of a
    captured step reads ``query_start_loc`` ``[max_num_seqs + 1]``, ``seq_lens``
    ``[max_num_seqs]``, ``block_table`` ``[max_num_seqs, max_blocks_per_seq]`` (int32)
    and the split-K ``split_workspace`` from here. :meth:`plan` copies a step into their
    leading rows in place (``copy_``; no allocation, no host read of device data) and
    sends the whole step to the paged kernel. Its launch then depends only on what a
    capture size fixes: the padded token and request counts, ``max_query_len``, and
    ``max_seq_len``, the model's maximum length (never the step's), from which split-K
    is chosen (:func:`accel_plugin.kernels.auto_num_splits`).
    """

    def __init__(self, *, max_num_seqs: int, max_blocks_per_seq: int, max_seq_len: int,
                 device: torch.device | str, split_workspace_numel: int = 0) -> None:
        sizes = {"max_num_seqs": max_num_seqs, "max_blocks_per_seq": max_blocks_per_seq, "max_seq_len": max_seq_len}
        bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 1}
        if bad or split_workspace_numel < 0:
            raise ValueError(f"GraphBatchBuffers needs sizes >= 1 and split_workspace_numel >= 0; got {bad or sizes}"
                             f", split_workspace_numel={split_workspace_numel}")
        self.max_seq_len = max_seq_len
        self.query_start_loc = torch.zeros(max_num_seqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_num_seqs, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(max_num_seqs, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.split_workspace = (torch.empty(split_workspace_numel, dtype=torch.float32, device=device)
                                if split_workspace_numel else None)

    @property
    def max_num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def plan(self, *, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
             num_actual_tokens: int, max_query_len: int) -> AttentionBatch:
        """Copy a step (tensors as for :func:`plan_batch`; padding requests have no
        queries) into the buffers; the batch it returns views them."""
        n = seq_lens.shape[0]
        if n > self.max_num_seqs:
            raise ValueError(f"a step of {n} requests does not fit buffers for {self.max_num_seqs} (max_num_seqs)")
        width = min(block_table.shape[1], self.block_table.shape[1])
        self.query_start_loc[: n + 1].copy_(query_start_loc[: n + 1], non_blocking=True)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.block_table[:n, :width].copy_(block_table[:n, :width], non_blocking=True)
        group = TokenGroup(
            rows=slice(0, num_actual_tokens), cu_seqlens_q=self.query_start_loc[: n + 1],
            seq_lens=self.seq_lens[:n], block_table=self.block_table[:n], max_seqlen_q=max_query_len,
            max_seq_len=self.max_seq_len, num_reqs=n, split_workspace=self.split_workspace,
        )
        return AttentionBatch(num_actual_tokens=num_actual_tokens, fresh=None, cached=group)


class _AccelAttention:
    """Shared state and the paged path; subclasses choose the kernel per request."""

    #: name under which frameworks register this backend (see accel_plugin.plugins.builtin)
    name: ClassVar[str]
    #: whether prompts without cached context go to the flash kernel
    split_fresh_prompts: ClassVar[bool]

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: int,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        from accel_plugin import kernels

        if head_size not in kernels.SUPPORTED_HEAD_SIZES:
            sizes = ", ".join(map(str, kernels.SUPPORTED_HEAD_SIZES))
            raise UnsupportedAttentionConfig(
                f"{self.name}: head size {head_size} is not supported (supported: {sizes})"
            )
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise UnsupportedAttentionConfig(
                f"{self.name}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = float(scale)
        # A window of N tokens includes the query itself: flash-attn's (N - 1, 0).
        self.window_size = (-1, -1) if not sliding_window else (int(sliding_window) - 1, 0)
        self.softcap = float(softcap or 0.0)
        # Bound once: the package resolves its names lazily (PEP 562), a cost on every layer call.
        self._flash_fn = kernels.flash_attn_varlen_func
        self._paged_fn = kernels.paged_attention
        self._write_fn = kernels.write_kv_cache
        self._native_cpu_ops = kernels.native_cpu_ops
        self._native_max_q = kernels.NATIVE_MAX_Q
        self._cpu_mode = kernels.runtime_mode("cpu")  # fixed per process: TRITON_INTERPRET is read at import

    def _native(self, t: torch.Tensor):
        """The native CPU kernels where they serve ``t`` (a CPU tensor, no Triton interpreter, the
        kernels built), else None. They check every argument themselves, so the per-layer path
        calls them without the public functions' Python validation."""
        if t.device.type != "cpu" or self._cpu_mode != "torch":
            return None
        return self._native_cpu_ops()

    def plan_batch(self, **kwargs) -> AttentionBatch:
        """:func:`plan_batch` with this backend's split rule."""
        return plan_batch(split_fresh_prompts=self.split_fresh_prompts, **kwargs)

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store ``key``/``value`` ``[T, Hkv, D]`` at ``slot_mapping`` (int64 ``[T]``, -1 = skip)."""
        n = slot_mapping.shape[0]
        native = self._native(key)
        if native is not None:
            native.write_kv_cache(key[:n], value[:n], k_cache, v_cache, slot_mapping)
        else:
            self._write_fn(key[:n], value[:n], k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        output: torch.Tensor,
    ) -> torch.Tensor:
        """Attention of ``query`` ``[T, H, D]`` into ``output`` ``[T, H, D]``.

        The cache must already hold this step's K/V (:meth:`write_kv`). ``key`` and
        ``value`` (``[T, Hkv, D]``) are this step's; ``None`` (a layer that shares
        another layer's cache) sends fresh prompts to the paged kernel too. Rows at
        or past the batch's last query are left untouched.
        """
        if batch.fresh is not None:
            if key is None or value is None:
                self._paged(query, k_cache, v_cache, batch.fresh, output)
            else:
                self._flash(query, key, value, batch.fresh, output)
        if batch.cached is not None:
            self._paged(query, k_cache, v_cache, batch.cached, output)
        return output

    def _flash(self, query, key, value, group: TokenGroup, output) -> None:
        rows = group.rows
        q, k, v = (_take(t, rows) for t in (query, key, value))
        out = output[rows] if isinstance(rows, slice) else None
        result = self._flash_fn(
            q, k, v, group.cu_seqlens_q, group.cu_seqlens_q, group.max_seqlen_q, group.max_seqlen_q,
            softmax_scale=self.scale, causal=True, window_size=self.window_size, softcap=self.softcap,
            plans=group.cpu_plans, **({"out": out} if out is not None else {}),
        )
        _put(output, rows, result, out)

    def _paged(self, query, k_cache, v_cache, group: TokenGroup, output) -> None:
        rows = group.rows
        q = _take(query, rows)
        out = output[rows] if isinstance(rows, slice) else None
        native = self._native(query) if group.max_seqlen_q <= self._native_max_q else None
        if native is not None:
            result = out if out is not None else torch.zeros_like(q)
            native.paged_attention(result, q, k_cache, v_cache, group.cu_seqlens_q, group.seq_lens,
                                   group.block_table, self.scale, self.softcap, self.window_size[0], 0)
            _put(output, rows, result, out)
            return
        result = self._paged_fn(
            q, k_cache, v_cache, group.cu_seqlens_q, group.seq_lens, group.block_table,
            group.max_seqlen_q, group.max_seq_len, softmax_scale=self.scale, causal=True,
            window_size=self.window_size, softcap=self.softcap, out=out, plans=group.cpu_plans,
            **({"workspace": group.split_workspace} if group.split_workspace is not None else {}),
        )
        _put(output, rows, result, out)


def _take(t: torch.Tensor, rows: slice | torch.Tensor) -> torch.Tensor:
    return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)


def _put(output: torch.Tensor, rows, result: torch.Tensor, out: torch.Tensor | None) -> None:
    if out is not None and result.data_ptr() == out.data_ptr():
        return  # the kernel wrote into output's rows directly
    if isinstance(rows, slice):
        output[rows] = result
    else:
        output.index_copy_(0, rows, result)


class FlashPagedAttention(_AccelAttention):
    """``ACCEL_FLASH``: flash kernel for fresh prompts, paged kernel for cached context."""

    name = "ACCEL_FLASH"
    split_fresh_prompts = True


class PagedAttention(_AccelAttention):
    """``ACCEL_PAGED``: the paged (split-K) kernel for every token."""

    name = "ACCEL_PAGED"
    split_fresh_prompts = False
