"""KV-cache memory accounting, and a simulator of KV-cache allocators on a request trace.

The core of ``accel kv simulate`` (docs/observability.md). Framework-free: neither
torch nor a serving framework is imported.

Terms (as in the PagedAttention paper, Kwon et al., SOSP 2023, section 3 and Fig. 2),
all counted in token slots (one slot holds one token's K and V in every layer):

* **used**: slots holding a stored token: the prompt and the generated tokens whose
  K/V have been written. A sequence's length ``seq_len`` is its used slots; shared
  prefix blocks are counted once.
* **allocated**: slots handed to sequences (whole blocks for paged allocation, the
  whole reservation for contiguous allocation).
* **internal** fragmentation: allocated slots no token of the sequence will ever
  fill. Paged: the unused tail of each sequence's last block (``< block_size`` per
  sequence). Contiguous: the reservation beyond the sequence's final length.
* **reserved**: allocated slots that later tokens of the same sequence will fill,
  held before they are needed. Contiguous allocation reserves the whole maximum
  length up front; paged allocation reserves nothing (a block is allocated when the
  first token that needs it is written), so paged ``reserved`` is 0.
* **external** fragmentation: free slots that no waiting request can use because
  they are not contiguous: counted, at a step, as all free slots when the first
  waiting request needs no more slots than are free but no single hole holds it
  (first-fit contiguous allocation). Paged allocation has none by construction:
  any free block serves any sequence.
* **held** = allocated + external; **waste** = held - used = internal + reserved +
  external. For paged allocation waste / held = (allocated - used) / allocated.

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

import json
import math
import random
import statistics
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "DEFAULT_BLOCK_SIZES",
    "PREFIX_SHARING_BLOCK_SIZE",
    "SYNTHETIC",
    "ContiguousAllocator",
    "PagedAllocator",
    "Request",
    "SimResult",
    "SimulationError",
    "TraceError",
    "Usage",
    "check_requests",
    "compare_allocators",
    "contiguous_usage",
    "load_trace",
    "paged_usage",
    "simulate",
    "synthetic_trace",
]

#: block sizes compared by default (vLLM's default is 16)
DEFAULT_BLOCK_SIZES = (1, 8, 16, 32, 64, 256)
#: block size of the prefix-sharing row (vLLM's default block size)
PREFIX_SHARING_BLOCK_SIZE = 16

#: Parameters of :func:`synthetic_trace`: a parametric approximation of ShareGPT's
#: shape (no dataset is downloaded): log-normal lengths whose means (about 165 prompt,
#: 330 output tokens before clipping) are near the ShareGPT means the vLLM paper
#: reports (about 161 and 338), long right tails; Poisson arrivals; a share of
#: requests start with one of a few system prompts (ShareGPT itself has none).
SYNTHETIC = {
    "prompt_median": 100, "prompt_sigma": 1.0,
    "output_median": 200, "output_sigma": 1.0,
    "system_prompt_share": 0.5, "system_prompt_lens": (50, 100, 200, 400),
}


class TraceError(ValueError):
    """A bad trace: the message names the file, the line and the field."""


class SimulationError(ValueError):
    """The simulation cannot run as asked (e.g. a request larger than the cache)."""


@dataclass(frozen=True)
class Usage:
    """KV-cache memory of a set of sequences, in token slots (terms: module docstring).

    ``blocks``: paged blocks allocated (shared blocks once); contiguous: chunks.
    Usages add up (``a + b``), so a replay's totals are the sum over its steps.
    """

    seqs: int
    used: int
    allocated: int
    blocks: int
    internal: int
    reserved: int = 0
    external: int = 0

    @property
    def held(self) -> int:
        """Slots not available to new requests: allocated + external."""
        return self.allocated + self.external

    @property
    def waste(self) -> int:
        """held - used = internal + reserved + external."""
        return self.held - self.used

    def percent(self, part: str) -> float:
        """``part`` (internal, reserved, external, waste, used) as % of held; 0 when nothing is held."""
        return 100.0 * getattr(self, part) / self.held if self.held else 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


ZERO = Usage(0, 0, 0, 0, 0)


def paged_usage(seq_lens: Sequence[int], block_size: int,
                prefixes: Sequence[tuple[Hashable, int] | None] | None = None) -> Usage:
    """Memory of sequences of lengths ``seq_lens`` in a paged cache of ``block_size`` slots per block.

    Each sequence holds ``ceil(seq_len / block_size)`` blocks. With ``prefixes``
    (one ``(prefix_id, prefix_len)`` or ``None`` per sequence), sequences with the same
    ``prefix_id`` hold the ``prefix_len // block_size`` full blocks of their common
    prefix once. ``internal`` = allocated - used (the unused tails of last blocks);
    ``reserved`` and ``external`` are 0. Pure: the same numbers a live paged cache
    with these sequences would show.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1; got {block_size!r}")
    if prefixes is not None and len(prefixes) != len(seq_lens):
        raise ValueError(f"prefixes must have one entry per sequence: {len(prefixes)} for {len(seq_lens)}")
    blocks = used = 0
    groups: dict[Hashable, tuple[int, int]] = {}  # prefix_id -> (prefix_len, sequences)
    for i, seq_len in enumerate(seq_lens):
        if seq_len < 0:
            raise ValueError(f"seq_lens must be >= 0; got {seq_len} at index {i}")
        blocks += -(-seq_len // block_size)
        used += seq_len
        prefix = prefixes[i] if prefixes is not None else None
        if prefix is not None:
            prefix_id, prefix_len = prefix
            if not 0 <= prefix_len <= seq_len:
                raise ValueError(f"prefix_len must be in 0..seq_len ({seq_len}); got {prefix_len} at index {i}")
            known_len, count = groups.get(prefix_id, (prefix_len, 0))
            if known_len != prefix_len:
                raise ValueError(f"prefix {prefix_id!r} has prefix_len {known_len} and {prefix_len}")
            groups[prefix_id] = (prefix_len, count + 1)
    for prefix_len, count in groups.values():
        shared_blocks = (count - 1) * (prefix_len // block_size)
        blocks -= shared_blocks
        used -= shared_blocks * block_size
    allocated = blocks * block_size
    return Usage(len(seq_lens), used, allocated, blocks, allocated - used)


def contiguous_usage(seq_lens: Sequence[int], reservations: Sequence[int], final_lens: Sequence[int]) -> Usage:
    """Memory of sequences each holding one contiguous chunk of ``reservations[i]`` slots.

    ``final_lens[i]``: the length sequence i will reach. ``reserved`` = final - current
    (slots later tokens will fill), ``internal`` = reservation - final (never filled).
    ``external`` depends on the chunks' layout and is 0 here (see :class:`ContiguousAllocator`).
    """
    if not len(seq_lens) == len(reservations) == len(final_lens):
        raise ValueError("seq_lens, reservations and final_lens must have the same length")
    for i, (cur, res, final) in enumerate(zip(seq_lens, reservations, final_lens)):
        if not 0 <= cur <= final <= res:
            raise ValueError(f"need 0 <= seq_len <= final_len <= reservation; got {cur}, {final}, {res} at index {i}")
    used, allocated, final = sum(seq_lens), sum(reservations), sum(final_lens)
    return Usage(len(seq_lens), used, allocated, len(seq_lens), allocated - final, final - used)


class Request(BaseModel):
    """One request of a trace (one JSONL line). ``arrival`` is a step number (steps: module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    arrival: int = Field(ge=0)
    prompt_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    #: requests with the same prefix_id start with the same prefix_len tokens
    prefix_id: str | int | None = None
    prefix_len: int | None = Field(default=None, ge=1)
    #: the request's max_tokens: contiguous allocation reserves prompt_len + max_output_len
    max_output_len: int | None = Field(default=None, ge=1)
    id: str | int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Request:
        if (self.prefix_id is None) != (self.prefix_len is None):
            raise ValueError("prefix_id and prefix_len go together: give both or neither")
        if self.prefix_len is not None and self.prefix_len > self.prompt_len:
            raise ValueError(f"prefix_len ({self.prefix_len}) must be <= prompt_len ({self.prompt_len})")
        if self.max_output_len is not None and self.max_output_len < self.output_len:
            raise ValueError(f"max_output_len ({self.max_output_len}) must be >= output_len ({self.output_len})")
        return self

    @property
    def final_len(self) -> int:
        """Its length at its last step: prompt_len + output_len - 1 (the last sampled token is never fed)."""
        return self.prompt_len + self.output_len - 1


def check_requests(requests: Sequence[Request], max_model_len: int, labels: Sequence[str] | None = None) -> None:
    """Raise :class:`TraceError` unless every request fits ``max_model_len`` and each
    ``prefix_id`` has one ``prefix_len``; ``labels`` name the requests (default ``request N``)."""
    first_len: dict[Hashable, tuple[int, str]] = {}
    for i, req in enumerate(requests):
        label = labels[i] if labels else f"request {i}"
        if req.prompt_len + req.output_len > max_model_len:
            raise TraceError(f"{label}: prompt_len + output_len = {req.prompt_len + req.output_len} "
                             f"exceeds --max-model-len {max_model_len}")
        if req.prefix_id is not None:
            known = first_len.setdefault(req.prefix_id, (req.prefix_len, label))
            if known[0] != req.prefix_len:
                raise TraceError(f"{label}: prefix_len: prefix_id {req.prefix_id!r} has prefix_len {known[0]} "
                                 f"at {known[1]}; got {req.prefix_len}")


def load_trace(path: str | Path, max_model_len: int) -> list[Request]:
    """Read a JSONL trace (one :class:`Request` per line, blank lines skipped).

    Raises :class:`TraceError` naming the file, the line and the field of the first problem.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"--trace: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    requests, labels = [], []
    valid = ", ".join(Request.model_fields)
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise TraceError(f"{where}: expected a JSON object with {valid}; got {type(data).__name__}")
        try:
            requests.append(Request.model_validate(data))
        except ValidationError as exc:
            raise TraceError(f"{where}: {_problems(exc, valid)}") from None
        labels.append(where)
    if not requests:
        raise TraceError(f"{path}: no requests (expected JSONL lines with {valid})")
    check_requests(requests, max_model_len, labels)
    return requests


def _problems(exc: ValidationError, valid: str) -> str:
    """One line: each field's problem, unknown fields first (a typo explains a missing field)."""
    problems = []
    for err in sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden"):
        name = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = f"unknown field (valid fields: {valid})"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["loc"]:
            message += f", got {err['input']!r}"
        problems.append(f"{name}: {message}" if name else message)
    return "; ".join(problems)


def synthetic_trace(requests: int = 1000, seed: int = 0, max_model_len: int = 2048,
                    arrival_rate: float = 1.0) -> list[Request]:
    """A seeded ShareGPT-like trace (parameters and their source: :data:`SYNTHETIC`).

    Arrivals: Poisson, ``arrival_rate`` requests per step. A request with a system
    prompt has ``prompt_len = system prompt + user prompt``; lengths are clipped so
    that ``prompt_len + output_len <= max_model_len``.
    """
    if requests < 1 or max_model_len < 2 or not 0 < arrival_rate < math.inf:
        raise ValueError("need requests >= 1, max_model_len >= 2, 0 < arrival_rate < inf; "
                         f"got {requests}, {max_model_len}, {arrival_rate}")
    rng, p = random.Random(seed), SYNTHETIC
    out, clock = [], 0.0
    for _ in range(requests):
        arrival = int(clock)
        clock += rng.expovariate(arrival_rate)
        user = max(1, round(rng.lognormvariate(math.log(p["prompt_median"]), p["prompt_sigma"])))
        output = max(1, round(rng.lognormvariate(math.log(p["output_median"]), p["output_sigma"])))
        system = rng.random() < p["system_prompt_share"]
        which = rng.randrange(len(p["system_prompt_lens"]))
        prefix_len = p["system_prompt_lens"][which] if system else 0
        if prefix_len + 2 > max_model_len:
            prefix_len = 0
        prompt = min(prefix_len + user, max_model_len - 1)
        output = min(output, max_model_len - prompt)
        out.append(Request(arrival=arrival, prompt_len=prompt, output_len=output,
                           prefix_id=f"system-{which}" if prefix_len else None, prefix_len=prefix_len or None))
    return out


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
