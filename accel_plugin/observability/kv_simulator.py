"""A simulator of KV-cache allocators on a request trace: the core of ``accel kv simulate``.

Replays a trace (:mod:`accel_plugin.observability.kv_trace`) against contiguous and
paged allocators and sums the memory of each step
(:mod:`accel_plugin.observability.kv_accounting`, where the terms are defined);
docs/observability.md shows the results. Framework-free: neither torch nor a serving
framework is imported.

Contiguous allocation follows the paper's description of earlier systems: a request
gets one contiguous chunk for its maximum possible length, ``max_model_len``
(``prompt_len + max_output_len`` when the trace gives ``max_output_len``, the
request's ``max_tokens``). ``contiguous-oracle`` reserves exactly the length the
request will reach (the paper's "Orca (Oracle)"), a lower bound for any contiguous
scheme.

Prefix sharing follows vLLM's prefix caching: requests with the same ``prefix_id``
start with the same ``prefix_len`` tokens, and only the full blocks inside that
prefix (``prefix_len // block_size`` of them) are shared, once, while at least one
running request holds them.

The time model of :func:`simulate`: discrete steps; a running request adds one token
per step. A token's K/V is written in the step that feeds it to the model, so at
each step a request runs, ``seq_len = prompt_len + sampled`` (tokens sampled before
this step): ``prompt_len`` at its first step (prefill), ``prompt_len + output_len -
1`` at its last, as vLLM's ``seq_lens``. Each step: running requests grow, oldest
first (when a paged cache has no free block, the newest running request is
preempted and recomputed later, as vLLM does); if nobody was preempted, waiting
requests are admitted first-come first-served until the first that does not fit;
then memory is accounted and the requests that sampled their last token leave.
Averages over a replay are slot-step weighted: the sum over steps of a component
divided by the sum over steps of ``held``.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from .kv_accounting import ZERO, Usage, contiguous_usage, paged_usage
from .kv_trace import Request

__all__ = [
    "DEFAULT_BLOCK_SIZES",
    "PREFIX_SHARING_BLOCK_SIZE",
    "ContiguousAllocator",
    "PagedAllocator",
    "SimResult",
    "SimulationError",
    "compare_allocators",
    "simulate",
]

#: block sizes compared by default (vLLM's default is 16)
DEFAULT_BLOCK_SIZES = (1, 8, 16, 32, 64, 256)
#: block size of the prefix-sharing row (vLLM's default block size)
PREFIX_SHARING_BLOCK_SIZE = 16


class SimulationError(ValueError):
    """The simulation cannot run as asked (e.g. a request larger than the cache)."""


@dataclass
class _Seq:
    """A request during a replay."""

    key: int
    req: Request
    sampled: int = 0
    seq_len: int = 0


class ContiguousAllocator:
    """One contiguous chunk per request, placed first-fit in ``[0, cache_tokens)``.

    The chunk holds ``min(max_model_len, prompt_len + max_output_len)`` slots
    (``max_model_len`` without ``max_output_len``), or with ``oracle`` exactly the
    request's final length.
    """

    def __init__(self, cache_tokens: int, max_model_len: int, oracle: bool = False):
        self.name = "contiguous-oracle" if oracle else "contiguous"
        self.block_size, self.prefix_sharing = None, False
        self.capacity, self.max_model_len, self.oracle = cache_tokens, max_model_len, oracle
        self._chunks: list[tuple[int, int, int]] = []  # (start, size, key), sorted by start

    def reservation(self, req: Request) -> int:
        if self.oracle:
            return req.final_len
        if req.max_output_len is None:
            return self.max_model_len
        return min(self.max_model_len, req.prompt_len + req.max_output_len)

    def need_alone(self, req: Request) -> tuple[int, int]:
        """(slots the request needs at its peak, slots it could have in an empty cache)."""
        return self.reservation(req), self.capacity

    def admit(self, seq: _Seq, seq_len: int) -> bool:
        need, end = self.reservation(seq.req), 0
        for index, (start, size, _) in enumerate(self._chunks):
            if start - end >= need:
                break
            end = start + size
        else:
            index = len(self._chunks)
            if self.capacity - end < need:
                return False
        self._chunks.insert(index, (end, need, seq.key))
        return True

    def grow(self, seq: _Seq, seq_len: int) -> bool:
        return True  # reserved up front

    def release(self, seq: _Seq) -> None:
        self._chunks = [c for c in self._chunks if c[2] != seq.key]

    def chunks(self) -> list[tuple[int, int, int]]:
        """The allocated chunks: (start, size, request key), by start."""
        return list(self._chunks)

    def usage(self, running: Sequence[_Seq], head: _Seq | None) -> Usage:
        usage = contiguous_usage([s.seq_len for s in running], [self.reservation(s.req) for s in running],
                                 [s.req.final_len for s in running])
        if head is None:
            return usage
        free, end, largest = self.capacity - usage.allocated, 0, 0
        for start, size, _ in self._chunks:
            largest, end = max(largest, start - end), start + size
        largest = max(largest, self.capacity - end)
        need = self.reservation(head.req)
        external = free if largest < need <= free else 0
        return Usage(usage.seqs, usage.used, usage.allocated, usage.blocks, usage.internal, usage.reserved, external)


class PagedAllocator:
    """``cache_tokens // block_size`` blocks; a sequence gets a block when a token needs one.

    With ``prefix_sharing``, the full blocks of a shared prefix are held once per
    ``prefix_id`` while a running request uses them.
    """

    def __init__(self, cache_tokens: int, block_size: int, prefix_sharing: bool = False):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1; got {block_size}")
        self.name = f"paged b={block_size}" + (" +prefix" if prefix_sharing else "")
        self.block_size, self.prefix_sharing = block_size, prefix_sharing
        self.num_blocks = cache_tokens // block_size
        self.capacity = self.num_blocks * block_size
        self.free_blocks = self.num_blocks
        self._groups: dict[Hashable, int] = {}  # prefix_id -> running requests holding its blocks

    def _shared(self, req: Request) -> int:
        return req.prefix_len // self.block_size if self.prefix_sharing and req.prefix_len else 0

    def _blocks(self, n: int) -> int:
        return -(-n // self.block_size)

    def need_alone(self, req: Request) -> tuple[int, int]:
        return self._blocks(req.final_len) * self.block_size, self.capacity

    def admit(self, seq: _Seq, seq_len: int) -> bool:
        shared = self._shared(seq.req)
        need = self._blocks(seq_len) - (shared if self._groups.get(seq.req.prefix_id) else 0)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        if shared:
            self._groups[seq.req.prefix_id] = self._groups.get(seq.req.prefix_id, 0) + 1
        return True

    def grow(self, seq: _Seq, seq_len: int) -> bool:
        need = self._blocks(seq_len) - self._blocks(seq.seq_len)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        return True

    def release(self, seq: _Seq) -> None:
        shared = self._shared(seq.req)
        self.free_blocks += self._blocks(seq.seq_len) - shared
        if shared:
            self._groups[seq.req.prefix_id] -= 1
            if not self._groups[seq.req.prefix_id]:
                del self._groups[seq.req.prefix_id]
                self.free_blocks += shared

    def usage(self, running: Sequence[_Seq], head: _Seq | None) -> Usage:
        prefixes = None
        if self.prefix_sharing:
            prefixes = [(s.req.prefix_id, s.req.prefix_len) if s.req.prefix_id is not None else None for s in running]
        return paged_usage([s.seq_len for s in running], self.block_size, prefixes)


@dataclass(frozen=True)
class SimResult:
    """One replay of a trace against one allocator.

    ``totals``: the sum of the per-step :class:`Usage` (``usages``, kept with
    ``record=True``). ``mean_concurrent``: running requests averaged over the steps at
    which requests waited (the cache was the limit); ``None`` if none did.
    ``concurrency``: running requests at each step.
    """

    allocator: str
    block_size: int | None
    prefix_sharing: bool
    capacity: int
    steps: int
    totals: Usage
    mean_concurrent: float | None
    peak_concurrent: int
    preemptions: int
    concurrency: tuple[int, ...] = field(repr=False)
    usages: tuple[Usage, ...] | None = field(default=None, repr=False)


def simulate(requests: Sequence[Request], allocator: ContiguousAllocator | PagedAllocator, *,
             record: bool = False) -> SimResult:
    """Replay ``requests`` against ``allocator`` (time model: module docstring)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    for i in order:
        need, capacity = allocator.need_alone(requests[i])
        if need > capacity:
            raise SimulationError(f"{allocator.name}: request {i} needs {need} slots at its peak and the cache "
                                  f"has {capacity}; raise --cache-tokens to at least {need}")
    pending = deque(_Seq(i, requests[i]) for i in order)
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    totals, usages, concurrency, limited = ZERO, [], [], []
    preemptions = step = 0
    while pending or waiting or running:
        if not (waiting or running) and pending[0].req.arrival > step:
            concurrency.extend([0] * (pending[0].req.arrival - step))
            step = pending[0].req.arrival
        while pending and pending[0].req.arrival <= step:
            waiting.append(pending.popleft())
        preempted, i = False, 0
        while i < len(running):
            seq, new_len = running[i], running[i].req.prompt_len + running[i].sampled
            if allocator.grow(seq, new_len):
                seq.seq_len, i = new_len, i + 1
                continue
            victim = running.pop()  # the newest; recomputed when admitted again
            allocator.release(victim)
            victim.seq_len, preempted = 0, True
            waiting.appendleft(victim)
            preemptions += 1
        while waiting and not preempted:
            seq = waiting[0]
            seq_len = seq.req.prompt_len + seq.sampled
            if not allocator.admit(seq, seq_len):
                break
            seq.seq_len = seq_len
            running.append(waiting.popleft())
        if not running:
            raise SimulationError(f"{allocator.name}: no request can run at step {step}")  # pragma: no cover
        usage = allocator.usage(running, waiting[0] if waiting else None)
        totals += usage
        if record:
            usages.append(usage)
        concurrency.append(len(running))
        if waiting:
            limited.append(len(running))
        for seq in running:
            seq.sampled += 1
            if seq.sampled == seq.req.output_len:
                allocator.release(seq)
        running = [s for s in running if s.sampled < s.req.output_len]
        step += 1
    return SimResult(
        allocator=allocator.name, block_size=allocator.block_size, prefix_sharing=allocator.prefix_sharing,
        capacity=allocator.capacity, steps=step, totals=totals,
        mean_concurrent=statistics.fmean(limited) if limited else None,
        peak_concurrent=max(concurrency, default=0), preemptions=preemptions,
        concurrency=tuple(concurrency), usages=tuple(usages) if record else None,
    )


def compare_allocators(requests: Sequence[Request], *, cache_tokens: int, max_model_len: int,
                       block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
                       prefix_sharing: bool = True) -> list[SimResult]:
    """Replay ``requests`` against contiguous, contiguous-oracle, paged at each block
    size and (``prefix_sharing``) paged at block 16 with prefix sharing."""
    allocators = [ContiguousAllocator(cache_tokens, max_model_len),
                  ContiguousAllocator(cache_tokens, max_model_len, oracle=True)]
    allocators += [PagedAllocator(cache_tokens, b) for b in block_sizes]
    if prefix_sharing:
        allocators.append(PagedAllocator(cache_tokens, PREFIX_SHARING_BLOCK_SIZE, prefix_sharing=True))
    return [simulate(requests, a) for a in allocators]
