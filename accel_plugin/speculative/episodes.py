"""Whole batches: what drafting costs a batch that no single cycle shows.

A cycle sample of the step gate (:mod:`.step_gate`) compares a drafting cycle with a
plain one of the same rows, and credits each token the same. A batch whose rows
start together and that no row joins until it ends (``LLM.generate`` of a list, a
burst of clients) loses what no cycle shows: rows that draft advance unevenly, so
the batch ends in a tail of steps with few rows, where a plain batch of the same
lengths keeps its rows together to the end. Measured on a 2-core CPU (SmolLM2-135M,
support prompts, batch 8): cycles of 8 rows at 1.05x, the whole batch at 0.91x.

An **episode** is such a batch: it starts at a call whose decoding rows are all new
(the engine ran their prefill, nothing else decoded) and ends when the next one
starts; a row that joins midway, or a step that is not timed, spoils it (a server
that admits rows as others finish has no tail: its cycles tell the truth). Of a
finished episode, with ``m_i`` the tokens row ``i`` received after the first call
and ``p(r)`` a plain cycle's time at ``r`` rows (the mean of the episode's own plain cycles at ``r``
where it ran :data:`MIN_SELF`, else the lower quartile of the recent ones of the episode's domain
mix where :data:`MIN_OWN` were measured, else of every mix; a row count not measured reads as its
measured neighbours, interpolated):

- ``P``, plain's time for the same tokens: rows sorted by ``m``,
  ``sum_j (m_(j) - m_(j-1)) p(R - j + 1)`` (a plain row gets one token a step);
- ``C``, what its cycles are credited with: ``sum over cycles of p(r) tokens / r``;

(``p`` is the mix's own because a plain step's time depends on its rows' contexts, not
only on their number: at batch 8 on a 2-core CPU the support prompts' plain steps took
83-96 ms where the median over every mix the engine ran was 107 ms, which priced the
support batches' plain time, and so their whole speedup, 10-25% too high; and ``p`` is a
lower quartile, not a median, because a plain step never takes less than its work but
often more (a shape's first runs, a busy machine), and the cycles an on key keeps are
few and old: calibration steps are rare once it pays, so most of them ran in the
engine's first minute; the episode's own plain cycles, where it ran enough, are in its measured
time, so their mean prices its plain steps as they ran (lone general requests drafting by prompt
lookup in a compiled engine, most of their steps plain, no match: whole speedups 0.95-1.07x by the
lower quartile, whose lower median switched the key off; 1.04-1.14x by their own cycles). In a
sweep's sequence on a 2-core CPU (batches of 1, 2, 4 and 8
support prompts, 3 rounds), 16 of the 19 plain cycles of the drafting engine ran in its
warm-up, and their median read 91.5 ms at 8 rows and 90.4 ms at 4, where a plain step of
the same rows took 64-67 and 51-53 ms in an engine beside it that never drafted: the
whole batches of 8 read 1.03-1.25x where the batch ran at 0.86x of a plain engine's);

and its **tail factor** ``P / C`` (1 when rows keep pace, below 1 with a tail). The
gate multiplies its cycle median at the episode's key (its first step's bucket and
domain mix, and every other mix its steps began at with that bucket) by it.

With ``T`` the measured time of its cycles, ``P / T`` is the episode's **whole
speedup**: what the batch gained over plain with everything a cycle sample leaves
out (the draft's prefill of the prompts in the first call, a probe's catch-up, the
tail). It is reported for every episode that counts (a batch whose plain cycles cost what
plain does loses only by drafting: support-free at batch 8, 743 draft tokens, ran at 0.86x of a
plain engine where no batch of it drafted in half of its cycles and none was reported, so its
key stayed on); the gate switches an on key off when its last whole batches lost (the lower median of
the last 4, :mod:`.step_gate`), and reads the
whole speedup over its cycles' as the key's factor where that is below the tail factor (measured
on a 2-core CPU, batch 8 of support prompts: cycle samples 1.19x, tail factor 0.88,
whole batches 0.93x against a plain engine). An episode with fewer than :data:`MIN_DRAFTING` of its cycles
drafting says nothing about drafting and gives no factor.

**References.** Such a plain episode is its domain mix's *reference*: the means of its plain cycles per row
count are that mix's ``p(r)`` for the drafting episodes after it (before every other source but the episode's
own :data:`MIN_SELF`), measured moments before them on a batch like theirs; for the same prompts its ``P`` is
exactly its measured time. Pooled and old plain cycles do not price whole batches reliably: on a 2-core CPU a
support batch of 8 read 1.03-1.05x whole while it ran at 0.93x of a plain engine (and our own engine not
drafting ran at 0.96-1.12x of it). So the gate (:mod:`.step_gate`) runs a mix's whole batch plain (a
*reference batch*) after its first drafting one that counted, and again after every :data:`REFERENCE_EVERY`
(:data:`REFERENCE_SETTLED` where its whole batches paid :data:`.step_gate.SETTLED` times ``min_speedup``).
Per call the work is O(rows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from .costs import lower_quartile

__all__ = ["MIN_DRAFTING", "MIN_OWN", "MIN_SELF", "REFERENCE_EVERY", "REFERENCE_SETTLED", "Episodes", "plain_time",
           "tail_factor"]

#: an episode counts (its tail factor and whole speedup) when at least this fraction of its cycles drafted
MIN_DRAFTING = 0.25
#: cycles an episode may hold (beyond: dropped; a batch that long has no tail to speak of)
_MAX_CYCLES = 8192
#: plain cycle times kept per row count (and per domain mix and row count)
_KEPT = 32
#: plain cycles of an episode's own mix at a row count that make its p(r) there
MIN_OWN = 3
#: plain cycles of the episode itself at a row count that make its p(r) there (their mean)
MIN_SELF = 8
#: drafting whole batches of a mix that counted between two reference (plain) batches of it
REFERENCE_EVERY = 3
#: the same, where the mix's whole batches paid well (a reference batch gives up their gain)
REFERENCE_SETTLED = 12


@dataclass
class _Episode:
    rows: dict  #: row id -> tokens received after the first call
    key: object = None  #: the gate key of its first step
    keys: set = field(default_factory=set)  #: the keys its steps began at, at its first step's bucket
    cycles: list = field(default_factory=list)  #: (rows, tokens, drafted)
    seconds: float = 0.0  #: the time of its cycles
    plain: dict = field(default_factory=dict)  #: rows -> the times of its own plain cycles
    reference: bool = False  #: run plain, to price the mix's next drafting batches


def _plain_at(plain: Mapping[int, float], rows: int) -> float | None:
    """``p(rows)``: measured, else interpolated between the nearest measured row counts,
    else the nearest one (``None``: no plain cycle measured yet)."""
    if rows in plain:
        return plain[rows]
    below = max((r for r in plain if r < rows), default=None)
    above = min((r for r in plain if r > rows), default=None)
    if below is not None and above is not None:
        w = (rows - below) / (above - below)
        return plain[below] * (1 - w) + plain[above] * w
    if below is not None or above is not None:
        return plain[below if above is None else above]
    return None


def plain_time(counts: list[int], plain: Mapping[int, float]) -> float | None:
    """``P`` (module docstring): plain's time for rows that received ``counts`` tokens,
    with plain cycle times ``plain`` per row count; ``None`` when a needed ``p(r)`` is unknown."""
    ordered = sorted(c for c in counts if c > 0)
    total_rows, plain_s, before = len(ordered), 0.0, 0
    for j, m in enumerate(ordered):
        if m > before:
            p = _plain_at(plain, total_rows - j)
            if p is None:
                return None
            plain_s += (m - before) * p
            before = m
    return plain_s


def tail_factor(counts: list[int], cycles: list[tuple[int, int, int]], plain: Mapping[int, float]) -> float | None:
    """``P / C`` (module docstring) of an episode whose rows received ``counts`` tokens
    in ``cycles`` of (rows, tokens, drafted), with plain cycle times ``plain`` per row
    count; ``None`` when a needed ``p(r)`` is unknown or nothing was decoded."""
    return _ratio(plain_time(counts, plain), _credit(cycles, plain))


def _credit(cycles: list[tuple[int, int, int]], plain: Mapping[int, float]) -> float | None:
    """``C`` (module docstring): what the cycles are credited with at plain's time per row."""
    credit = 0.0
    for rows, tokens, _ in cycles:
        p = _plain_at(plain, rows)
        if p is None:
            return None
        credit += p * tokens / rows
    return credit


def _ratio(plain_s: float | None, credit: float | None) -> float | None:
    return plain_s / credit if plain_s and credit else None


class Episodes:
    """Tracks the episode running now; returns each finished one's key and tail factor.

    Per ``propose`` call: :meth:`record_cycle` (the cycle that ended now, as the
    step gate gets it), then :meth:`record_rows` (this call's rows and the tokens
    each received, how many are new), then, once the step's key is known,
    :meth:`set_key`.
    """

    def __init__(self) -> None:
        self._plain: dict[int, deque] = {}  #: rows -> plain cycle times, every mix
        self._own: dict[tuple[frozenset, int], deque] = {}  #: (mix, rows) -> plain cycle times
        self._current: _Episode | None = None
        self._fresh: dict[frozenset, dict[int, float]] = {}  #: mix -> its last plain episode's p(r)
        self._drafted: dict[frozenset, int] = {}  #: mix -> drafting episodes counted since its last plain one
        self._cycle: tuple[float | None, int, int, int] | None = None

    def record_cycle(self, seconds: float | None, rows: int, tokens: int, drafted: int,
                     mix: frozenset = frozenset()) -> None:
        """The cycle that ended now, of a step whose key had domain ``mix``."""
        self._cycle = (seconds, rows, tokens, drafted)
        if seconds is not None and seconds > 0 and rows > 0 and not drafted:
            self._plain.setdefault(rows, deque(maxlen=_KEPT)).append(seconds)
            self._own.setdefault((mix, rows), deque(maxlen=_KEPT)).append(seconds)

    def plain_times(self, mix: frozenset | None = None) -> dict[int, float]:
        """``p(r)`` per measured row count: of ``mix`` where it has :data:`MIN_OWN` plain
        cycles at ``r``, else of every mix (``None``: every mix)."""
        plain = {r: lower_quartile(times) for r, times in self._plain.items() if times}
        if mix is not None:
            plain.update({r: lower_quartile(times) for (m, r), times in self._own.items()
                          if m == mix and len(times) >= MIN_OWN})
        return plain

    def record_rows(self, tokens: Mapping[Hashable, int], joined: int) -> tuple[list, float, float] | None:
        """This call's decoding rows (id -> tokens received) of which ``joined`` are new.
        Returns ``(keys, tail factor, speedup)`` of the episode this call ended, if it
        counts: the keys its steps began at with its first step's bucket (a mix may change
        from step to step), and ``P / T``, its whole speedup over plain."""
        cycle, self._cycle = self._cycle, None
        ep = self._current
        if joined and joined == len(tokens):  # every row new: a new episode
            self._current = _Episode(rows=dict.fromkeys(tokens, 0))
            return None if ep is None else self._finish(ep)
        if ep is None:
            return None
        if joined or cycle is None or cycle[0] is None or len(ep.cycles) >= _MAX_CYCLES:
            self._current = None  # a row joined, or a step was not timed: no clean batch
            return None
        for row, n in tokens.items():
            if row not in ep.rows:
                self._current = None
                return None
            ep.rows[row] += n
        ep.cycles.append(cycle[1:])
        ep.seconds += cycle[0]
        if not cycle[3]:
            ep.plain.setdefault(cycle[1], []).append(cycle[0])
        return None

    @property
    def starting(self) -> bool:
        """Whether the step that begins now is the first of a whole batch (:meth:`set_key` decides its reference)."""
        return self._current is not None and self._current.key is None

    def set_key(self, key: tuple, every: int = 0) -> bool:
        """The gate key (bucket, mix) of the step that begins now; whether it runs plain, its batch being
        a reference: at its first step ``every`` > 0 makes it one where its mix has none yet after a
        drafting episode that counted, or had ``every`` drafting episodes since its last."""
        ep = self._current
        if ep is None:
            return False
        if ep.key is None:
            ep.key, n = key, self._drafted.get(key[1], 0)
            ep.reference = every > 0 and n >= (every if key[1] in self._fresh else 1)
        if key[0] == ep.key[0]:
            ep.keys.add(key)
        return ep.reference

    def _finish(self, ep: _Episode) -> tuple[list, float, float] | None:
        if ep.key is None or not ep.cycles:
            return None
        drafting, mix = sum(1 for _, _, d in ep.cycles if d), ep.key[1]
        if drafting < MIN_DRAFTING * len(ep.cycles):
            self._fresh[mix], self._drafted[mix] = {r: sum(t) / len(t) for r, t in ep.plain.items()}, 0
            return None
        plain = self.plain_times(mix)
        plain.update(self._fresh.get(mix, {}))
        plain.update({r: sum(times) / len(times) for r, times in ep.plain.items() if len(times) >= MIN_SELF})
        plain_s = plain_time(list(ep.rows.values()), plain)
        factor = _ratio(plain_s, _credit(ep.cycles, plain))
        if factor is None:
            return None
        self._drafted[mix] = self._drafted.get(mix, 0) + 1
        return sorted(ep.keys, key=repr), factor, plain_s / ep.seconds
