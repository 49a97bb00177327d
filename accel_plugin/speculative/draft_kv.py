"""The KV cache of one draft model: a slot per request, sized by the live requests.

One tensor per layer and K/V, ``[num_slots, num_kv_heads, capacity, head_dim]``; a
request owns one slot (:meth:`DraftKVCache.alloc`), given back with
:meth:`DraftKVCache.free` when it finishes. ``num_slots`` and ``capacity`` grow by
doubling when needed and shrink when freeing leaves them at most a quarter used, so
memory follows the live slots and their longest cached context (the bound is in
docs/speculative.md, "Draft memory"); :attr:`DraftKVCache.nbytes` says what it
holds now.

Invariants. A request's slot is a handle; ``_row_of[handle]`` is its row in the
cache tensors, so that shrinking can compact the live rows without the holders of
handles noticing. Growth doubles (rows when none is free, positions when a forward
needs more); shrinking happens when a slot is freed and the live slots use at most
a quarter of the rows, or their longest cached context at most a quarter of the
positions: both go down to the next power of two at or above the need (never below
the initial size). A shrink leaves the cache at least half used and a grow needs
twice that, so the two cannot alternate.
"""

from __future__ import annotations

import heapq

import torch

from .host_memory import release_freed_memory

__all__ = ["DraftKVCache"]


def _next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


class DraftKVCache:
    """Per-request KV slots of a draft model of ``num_layers`` layers (see the module doc)."""

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, max_len: int, initial_slots: int):
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device, self.max_len = dtype, device, max_len
        self._capacity = 0
        self._num_slots = 0
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self._free_rows: list[int] = []  # rows of the cache tensors no request holds
        self._free_handles: list[int] = []  # a heap: the lowest free handle is reused first
        self._num_handles = 0
        self._live_rows: dict[int, int] = {}  # slot handle -> row
        self._used = torch.zeros(0, dtype=torch.long, device=self.device)  # per row: positions cached
        self._row_of = torch.zeros(1, dtype=torch.long, device=self.device)
        self._min_slots, self._min_capacity = max(1, initial_slots), min(max_len, 128)
        self.grow(slots=self._min_slots, capacity=self._min_capacity)

    def grow(self, *, slots: int | None = None, capacity: int | None = None) -> None:
        """At least ``slots`` rows and ``capacity`` positions (capped at ``max_len``)."""
        new_slots = max(slots or 0, self._num_slots)
        new_cap = min(max(capacity or 0, self._capacity), self.max_len)
        if new_slots == self._num_slots and new_cap == self._capacity:
            return
        self._resize(new_slots, new_cap)

    @torch.inference_mode()  # forward's tensors are inference tensors: update them in kind
    def _resize(self, new_slots: int, new_cap: int) -> None:
        """Reallocate every layer's K/V as ``[new_slots, Hkv, new_cap, D]``; live rows
        move to rows ``0..live-1`` (in handle order), keeping ``min(used, new_cap)``
        positions (callers never cut below a live row's used length)."""
        live = sorted(self._live_rows.items())
        old_rows = torch.tensor([row for _, row in live], dtype=torch.long, device=self.device)
        keep = min(self._capacity, new_cap)
        shape = (new_slots, self.num_kv_heads, new_cap, self.head_dim)
        for caches in (self.k_cache, self.v_cache):
            for layer in range(self.num_layers):
                # zeros, not empty: padded queries may read past a row's length
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if layer < len(caches):
                    if live:
                        fresh[: len(live), :, :keep] = caches[layer][:, :, :keep].index_select(0, old_rows)
                    caches[layer] = fresh
                else:
                    caches.append(fresh)
        used = torch.zeros(new_slots, dtype=torch.long, device=self.device)
        if live:
            used[: len(live)] = self._used.index_select(0, old_rows)
        self._used = used
        for new_row, (handle, _) in enumerate(live):
            self._live_rows[handle] = new_row
        self._free_rows = list(range(new_slots - 1, len(live) - 1, -1))  # pop() takes the lowest
        self._num_slots, self._capacity = new_slots, new_cap
        self._sync_rows()

    def _sync_rows(self) -> None:
        """Rebuild the device table handle -> row (free handles point at row 0)."""
        table = [0] * self._num_handles
        for handle, row in self._live_rows.items():
            table[handle] = row
        self._row_of = torch.tensor(table or [0], dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def alloc(self) -> int:
        """A free slot handle for a new request (grows the rows by doubling if none is free)."""
        if not self._free_rows:
            self.grow(slots=max(1, 2 * self._num_slots))
        row = self._free_rows.pop()
        if self._free_handles:
            handle = heapq.heappop(self._free_handles)
        else:
            handle, self._num_handles = self._num_handles, self._num_handles + 1
        self._live_rows[handle] = row
        self._used[row] = 0
        self._sync_rows()
        return handle

    @torch.inference_mode()
    def free(self, slot: int) -> None:
        """Give a request's slot back; shrinks the cache when it is mostly unused."""
        row = self._live_rows.pop(slot, None)
        if row is None:
            return  # freed twice, or never allocated: nothing to give back
        self._used[row] = 0
        self._free_rows.append(row)
        heapq.heappush(self._free_handles, slot)
        self._maybe_shrink()
        self._sync_rows()

    def _maybe_shrink(self) -> None:
        live = len(self._live_rows)
        longest = int(self._used.max()) if live else 0
        new_slots, new_cap = self._num_slots, self._capacity
        if 4 * live <= self._num_slots:
            new_slots = max(self._min_slots, _next_pow2(live))
        if 4 * longest <= self._capacity:
            new_cap = min(self.max_len, max(self._min_capacity, _next_pow2(longest)))
        if new_slots < self._num_slots or new_cap < self._capacity:
            self._resize(min(new_slots, self._num_slots), min(new_cap, self._capacity))
            if self.device.type == "cpu":
                release_freed_memory()  # else the C heap keeps the old, larger cache's pages

    def claim(self, slots: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """The rows of slot handles ``slots`` (``[B]`` int64), each now holding
        positions ``0..end-1`` (what lies beyond is stale: rewound drafts). Call it
        after any :meth:`grow` of the step: growing may move rows."""
        rows = self._row_of[slots]
        self._used[rows] = end
        return rows

    @property
    def num_free_slots(self) -> int:
        return len(self._free_rows)

    @property
    def num_slots(self) -> int:
        """Rows of the KV cache (live + free)."""
        return self._num_slots

    @property
    def capacity(self) -> int:
        """Positions per row of the KV cache."""
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now (K and V, every layer); O(1)."""
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return (2 * self.num_layers * self._num_slots * self.num_kv_heads * self._capacity
                * self.head_dim * itemsize)
