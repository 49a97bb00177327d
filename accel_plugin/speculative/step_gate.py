"""The step's verdict: measured whole cycles per batch bucket and domain mix.

**Cycles.** A cycle runs from the start of one ``propose`` call to the start of the next: that
call's drafting and host work, the framework's target step that verifies its drafts, and the
framework's own host work; it emitted the tokens the next call receives. It is a *drafting*
cycle when its call proposed any draft, else *plain*; cycles after a prefill or an idle engine
are not timed (and break the pairing).

**Keys.** Cycles, samples and the verdict are kept per *key*: the step's batch bucket
(:func:`.costs.batch_bucket`) and its *domain mix*, the set of entries (domains, ``<domain>/lookup``) of its
rows that may draft. A bucket where one mix pays and another loses gets one verdict per mix, not their pooled
median. The readings (:meth:`StepGate.stats`) are per bucket, each mix's verdict under ``mixes``.

**Samples.** At each key a drafting cycle is paired with the nearest plain cycle of the same number of rows at
most :data:`ADJACENT` timed cycles away (calibration steps and the controller's own plain steps make them):
one sample, its token gain (the drafting cycle's tokens over the plain one's) and time ratio (the plain one's
seconds over the drafting one's). Same rows, so that both did the same work but for drafting; moments apart,
so that a slow spell of a shared machine slows both. The measured speedup is the samples' mean gain times
their median time ratio (:func:`.costs.measured_speedup`).

**Whole batches.** A batch that starts together and that no row joins pays for drafting in its tail too (rows that
drafted finish unevenly): :mod:`.episodes` measures each such batch's *tail factor* (kept at each key of its first
bucket), and the gate reads a key's measured speedup times the median of its last 4 factors; a key with none
borrows the median of its bucket's other keys' factors (a new mix of a bucket whose whole batches lose starts
judged by them), 1 where the bucket has none or is batch 1 (no tail there, and another entry's whole-over-cycles
says nothing of this one's). A whole batch that counts also gives its *whole speedup* (plain's time for its tokens
over its measured time, everything included: the draft's prefill, catch-ups, the tail); the lower median of a key's
last 4 below ``min_speedup`` switches it off at once (two bad of 3-4, not one noisy batch after good ones); one
below its cycles times the tail factor makes its factor whole over cycles (cycles pair with rare calibration
steps). Where its last 4 whole batches paid (lower median at least ``min_speedup * (1 + hysteresis)``) an on key's
cycles do not switch it off (at batch 1 few cycles pair: a drafting one beside a calibration step); above batch 1,
where they did not, an off key's cycles do not switch it on for ``gate_window`` samples after the last (probe cycles
at batch 8 read 1.17x where the whole batches read 1.00x, and the next read 0.87x). A whole batch that starts at a
key not off, above batch 1, may run plain as its mix's *reference* (:mod:`.episodes`; the verdict ``reference``):
the drafting ones after it are priced by its plain steps.

**Gate.** Per key: ``warmup`` until ``gate_min_samples`` samples, then ``on`` or ``off`` by the measured speedup of
the last ``gate_window`` (times the factor): on goes off below ``min_speedup``, off goes on at ``min_speedup * (1 +
hysteresis)``, either after ``gate_switch_after`` consecutive samples that ask for it (a switch keeps only the last
``gate_min_samples`` samples, so the next verdict reads the new regime). A new key starts ``off`` where the nearest
smaller bucket with a verdict for its mix is off (a verified draft token per row costs more as the batch grows: no
warm-up to find that out again), or, with no such bucket, where its mix has several domains and each alone is off
at its bucket (a step that drafts for several domains pays for several drafts); from there it is an ordinary off
key: its probes' samples switch it on only at ``min_speedup * (1 + hysteresis)``, ``gate_switch_after`` times in a
row. At an off key no row drafts, except a probe after :func:`probe_interval` steps (``gate_probe_interval`` times
the bucket, at most 8): two drafting steps, the first to let the drafts catch up on the plain steps' tokens (not
paired), the second measured against its plain neighbours. The catch-up is a draft forward over every token the
rows took meanwhile (at batch 8 about a plain step), so each probe that leaves the key off doubles the interval to
the next, up to :data:`MAX_BACKOFF` doublings (at batch 1, 16 steps then 32 then 64). A whole batch's switch (its
speedups, or a factor that brings an on key below ``min_speedup`` where its cycles alone are above) starts at
:data:`MAX_BACKOFF` doublings (a whole batch is stronger evidence than a cycle), and so does a key that starts off
(a probe drafts for every row and draft of its mix); any other switch resets the interval. A key whose drafting
changed (a lifted lookup cap taken back) starts over in warm-up (:meth:`StepGate.restart`). The step model
(:func:`.step_model.plan_step`) predicts; this gate measures.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import median_low

from .costs import measured_speedup, median, nearest
from .draft_config.schema import ControllerConfig
from .episodes import REFERENCE_EVERY, REFERENCE_SETTLED, Episodes

__all__ = ["ADJACENT", "MAX_BACKOFF", "SETTLED", "GateKey", "GateState", "StepGate", "mix_name", "probe_interval"]

ADJACENT = 3  #: a drafting and a plain cycle pair when at most this many timed cycles apart
_KEPT = 64  #: times kept per bucket for the readings (cycle_ms, draft_ms ...)
MAX_BACKOFF = 2  #: doublings of the probe interval of a key a whole batch switched off
_FACTORS = 4  #: factors of whole batches kept per key
SETTLED = 1.25  #: x ``min_speedup``: no more early calibration steps (cycles), fewer reference batches (whole)


def probe_interval(base: int, bucket: int, backoff: int) -> int:
    """Steps between an off key's probes: ``base`` times the bucket (at most 8: a probe
    drafts for every row, draft prefills included), doubled ``backoff`` times."""
    return base * min(bucket, 8) << backoff


#: (batch bucket, the step's domain mix): what the gate keeps a verdict for
GateKey = tuple[int, frozenset]


def mix_name(mix: Iterable[str]) -> str:
    """``code+support``: a domain mix as the readings name it (``-``: none)."""
    return "+".join(sorted(mix)) or "-"


class GateState:
    """The step gate's verdict at a batch bucket."""

    WARMUP = "warmup"  #: fewer than gate_min_samples samples: the per-domain decisions alone
    ON = "on"  #: drafting pays by the measured cycles
    OFF = "off"  #: no row drafts, except probes
    REFERENCE = "reference"  #: no row drafts: a whole batch run plain to price the drafting ones (episodes)


@dataclass
class _Bucket:
    bucket: int = 0  #: the batch bucket of its key
    state: str = GateState.WARMUP
    pending: int = 0
    steps: int = 0  #: steps begun at this bucket
    cycles: int = 0  #: timed cycles at this bucket
    off_steps: int = 0  #: steps since going off or since the last probe
    probe_left: int = 0  #: probe steps still to run (2: catch-up next, 1: measured next)
    samples: deque = field(default_factory=deque)
    total_samples: int = 0
    whole_at: int = 0  #: total_samples when its last whole speedup arrived
    backoff: int = 0  #: doublings of the probe interval (MAX_BACKOFF after a whole batch's switch)
    factors: deque = field(default_factory=lambda: deque(maxlen=_FACTORS))  #: what the cycles are read times
    tails: deque = field(default_factory=lambda: deque(maxlen=_FACTORS))  #: tail factors (episodes), for readings
    whole: deque = field(default_factory=lambda: deque(maxlen=_FACTORS))  #: whole speedups (drafting episodes)
    last: dict = field(default_factory=dict)  #: drafting?: (tokens, seconds, rows, cycle index)
    inherited: int | None = None  #: the bucket whose off verdict it started with (:meth:`StepGate._new_key`)
    plain_cycles: deque = field(default_factory=lambda: deque(maxlen=_KEPT))
    draft_cycles: deque = field(default_factory=lambda: deque(maxlen=_KEPT))
    draft_s: deque = field(default_factory=lambda: deque(maxlen=_KEPT))
    host_s: deque = field(default_factory=lambda: deque(maxlen=_KEPT))  #: drafting calls, beyond drafts
    plain_host_s: deque = field(default_factory=lambda: deque(maxlen=_KEPT))  #: plain calls
    predicted: deque = field(default_factory=lambda: deque(maxlen=_KEPT))


class StepGate:
    """Per key (batch bucket, domain mix): cycle samples, the gate's state, the readings.

    Per ``propose`` call: :meth:`record_cycle` (the cycle that ended now, counted
    under the key its step began with), :meth:`begin` (this step's key and verdict),
    :meth:`record_call` (this call's host and draft time) and, for a drafting step,
    :meth:`record_prediction`. A step that did not :meth:`begin` (the gate is not
    consulted) counts under its bucket with the empty mix.
    """

    def __init__(self, cfg: ControllerConfig):
        self.cfg = cfg
        self._buckets: dict[GateKey, _Bucket] = {}
        self._index = 0  #: timed cycles so far
        self._current: tuple[GateKey, bool] | None = None  #: (key, catch-up probe) of the step running now
        self.episodes = Episodes()

    def _at(self, key: GateKey) -> _Bucket:
        if key not in self._buckets:
            self._buckets[key] = _Bucket(bucket=key[0], samples=deque(maxlen=self.cfg.gate_window))
        return self._buckets[key]

    def _new_key(self, key: GateKey) -> _Bucket:
        """A new key: ``off`` where the nearest smaller bucket with a verdict for its mix is off (its
        probes backed off at once), or, with none, where each domain of its mix is off alone there (the same)."""
        at = self._at(key)
        bucket, mix = key
        smaller = [(b, other) for (b, m), other in self._buckets.items()
                   if m == mix and b < bucket and other.state != GateState.WARMUP]
        if smaller:
            b, other = max(smaller, key=lambda item: item[0])
            if other.state == GateState.OFF:  # a probe drafts for every row: at 64 rows about 3 plain steps
                at.state, at.inherited, at.backoff = GateState.OFF, b, MAX_BACKOFF
        elif len(mix) > 1:
            alone = [self._buckets.get((bucket, frozenset({m}))) for m in mix]
            if all(one is not None and one.state == GateState.OFF for one in alone):
                at.state, at.inherited, at.backoff = GateState.OFF, bucket, MAX_BACKOFF  # a probe runs every draft
        return at

    def _key(self, bucket: int) -> GateKey:
        """The key of the step running now, if it began at ``bucket``; else the bucket alone."""
        if self._current is not None and self._current[0][0] == bucket:
            return self._current[0]
        return bucket, frozenset()

    # ------------------------------------------------------------------ recording

    def record_cycle(self, seconds: float | None, rows: int, bucket: int, tokens: int, drafted: int) -> None:
        """The cycle that ended now: ``seconds`` (None: not comparable), ``rows`` that
        decoded, at ``bucket``, ``tokens`` emitted, ``drafted`` draft tokens verified.
        It counts under the key its step began with."""
        key = self._key(bucket)
        current, self._current = self._current, None
        self.episodes.record_cycle(seconds, rows, tokens, drafted, key[1])
        if seconds is None or seconds <= 0 or rows <= 0 or tokens <= 0:
            for b in self._buckets.values():
                b.last.clear()
            return
        self._index += 1
        at = self._at(key)
        at.cycles += 1
        drafting = drafted > 0
        (at.draft_cycles if drafting else at.plain_cycles).append(seconds)
        if drafting and current is not None and current == (key, True):
            return  # a probe's catch-up step: the drafts ran the plain steps' tokens too
        at.last[drafting] = (tokens, seconds, rows, self._index)
        other = at.last.get(not drafting)
        if other is None or other[2] != rows or self._index - other[3] > ADJACENT:
            return
        d, p = (at.last[True], other) if drafting else (other, at.last[False])
        self._add_sample(at, (d[0] / p[0], p[1] / d[1]))  # (token gain, time ratio)

    def record_rows(self, tokens: dict, joined: int) -> None:
        """This call's decoding rows (an id each -> tokens received), ``joined`` of them new
        (after :meth:`record_cycle`, before :meth:`begin`): the whole batches (:mod:`.episodes`)."""
        done = self.episodes.record_rows(tokens, joined)
        for key in done[0] if done is not None else ():
            self.record_episode(key, done[1], done[2])

    def record_episode(self, key: GateKey, factor: float, speedup: float | None = None) -> None:
        """A whole batch began at ``key``: its tail ``factor``, where known its whole ``speedup`` (module docstring)."""
        at = self._at(key)
        at.tails.append(min(1.0, factor))
        if speedup is not None and len(at.samples) >= self.cfg.gate_min_samples:
            factor = min(factor, speedup / measured_speedup(at.samples))
        at.factors.append(min(1.0, factor))
        if speedup is not None:
            at.whole.append(speedup)
            at.whole_at = at.total_samples
            if at.state == GateState.ON and median_low(at.whole) < self.cfg.min_speedup:
                self._switch(at, GateState.OFF, backoff=MAX_BACKOFF)
                return
        self._judge(at, at_once=True)
        for other in self._buckets.values():  # the mixes of this bucket that borrow the bucket's factor
            if other.bucket == at.bucket and not other.factors:
                self._judge(other, at_once=True)

    def factor(self, key: GateKey) -> float:
        """What ``key``'s cycles are read times: the median of its last whole batches' factors; with none,
        that of its bucket's other mixes (the tail is the batch's, whichever domains drafted); else 1. At
        batch 1 there is no tail and each key's factor is its own requests' (another entry's says nothing)."""
        return self._factor(key[0], self._buckets.get(key))

    def _factor(self, bucket: int, at: _Bucket | None) -> float:
        if at is not None and at.factors:
            return median(at.factors)
        pooled = [f for other in self._buckets.values() if bucket > 1 and other.bucket == bucket for f in other.factors]
        return median(pooled) if pooled else 1.0

    def record_call(self, bucket: int, seconds: float, draft_seconds: float, drafted: int) -> None:
        """This ``propose`` call took ``seconds``, ``draft_seconds`` of them in draft models."""
        at = self._at(self._key(bucket))
        if drafted:
            at.draft_s.append(draft_seconds)
            at.host_s.append(max(0.0, seconds - draft_seconds))
        else:
            at.plain_host_s.append(seconds)

    def record_prediction(self, bucket: int, speedup: float) -> None:
        self._at(self._key(bucket)).predicted.append(speedup)

    def _add_sample(self, at: _Bucket, sample: tuple[float, float]) -> None:
        at.samples.append(sample)
        at.total_samples += 1
        self._judge(at)

    def _judge(self, at: _Bucket, at_once: bool = False) -> None:
        """Re-read the verdict from the samples times the factor. ``at_once``: a whole batch's factor
        arrived; it switches an on key off at once only where the cycles alone keep it on."""
        cfg = self.cfg
        if len(at.samples) < cfg.gate_min_samples:
            return
        cycles = measured_speedup(at.samples)
        m = cycles * self._factor(at.bucket, at)
        if at_once:
            if at.state == GateState.ON and cycles >= cfg.min_speedup > m:
                self._switch(at, GateState.OFF, backoff=MAX_BACKOFF)  # a whole batch needs no quick recheck
            return
        if at.state == GateState.WARMUP:  # an inherited off is an ordinary off: hysteresis, switch_after
            at.state, at.off_steps, at.backoff = GateState.ON if m >= cfg.min_speedup else GateState.OFF, 0, 0
            return
        is_on = at.state == GateState.ON
        want_on = m >= cfg.min_speedup * (1.0 if is_on else 1.0 + cfg.hysteresis)
        recent = at.bucket > 1 and at.whole and at.total_samples - at.whole_at < cfg.gate_window
        if (is_on and not want_on and len(at.whole) == _FACTORS) or (want_on and not is_on and recent):
            want_on = median_low(at.whole) >= cfg.min_speedup * (1.0 + cfg.hysteresis)  # whole batches hold it
        if want_on == is_on:
            at.pending = 0
            return
        at.pending += 1
        if at.pending >= cfg.gate_switch_after:
            self._switch(at, GateState.ON if want_on else GateState.OFF)

    def _switch(self, at: _Bucket, state: str, backoff: int = 0, keep: int | None = None) -> None:
        """Keep only the last ``gate_min_samples`` (or ``keep``) samples: the next verdict reads the new regime."""
        at.state, at.pending, at.off_steps, at.backoff = state, 0, 0, backoff
        for _ in range(len(at.samples) - (self.cfg.gate_min_samples if keep is None else keep)):
            at.samples.popleft()

    # ------------------------------------------------------------------ deciding

    def begin(self, bucket: int, mix: Iterable[str] = ()) -> str:
        """This step's verdict at ``bucket`` for the domain ``mix`` of its rows: ``on``/``warmup`` (draft as
        planned), ``off`` (no row drafts), ``probe`` (draft, to re-measure) or ``reference`` (no row drafts)."""
        key = (bucket, frozenset(mix))
        at = self._buckets.get(key) or self._new_key(key)
        at.steps += 1
        self._current = (key, False)
        every = 0 if not self.episodes.starting or bucket == 1 or not key[1] or at.state == GateState.OFF else (
            REFERENCE_SETTLED if median_low(at.whole or [0.0]) >= SETTLED * self.cfg.min_speedup else REFERENCE_EVERY)
        if self.episodes.set_key(key, every):
            return GateState.REFERENCE
        if at.state != GateState.OFF:
            at.probe_left = 0
            return at.state
        if at.probe_left:
            at.probe_left -= 1
            return "probe"
        at.off_steps += 1
        if at.off_steps >= probe_interval(self.cfg.gate_probe_interval, bucket, at.backoff):
            # the next probe of a key this one leaves off waits twice as long (catch-up costs)
            at.off_steps, at.probe_left, at.backoff = 0, 1, min(MAX_BACKOFF, at.backoff + 1)
            self._current = (key, True)
            return "probe"
        return GateState.OFF

    def restart(self, bucket: int, mix: Iterable[str]) -> str:
        """Warm-up again with no samples kept: the key's drafting changed (a lifted cap taken back)."""
        self._switch(at := self._at((bucket, frozenset(mix))), GateState.WARMUP, keep=0)
        at.whole.clear()
        return at.state

    def state(self, bucket: int, mix: Iterable[str] = ()) -> str:
        return getattr(self._buckets.get((bucket, frozenset(mix))), "state", GateState.WARMUP)

    def samples(self, bucket: int, mix: Iterable[str] | None = None) -> int:
        """Samples at ``bucket`` so far (not only the window), for ``mix`` (``None``: every mix)."""
        return sum(at.total_samples for at in self._of(bucket, mix))

    def settled(self, bucket: int, mix: Iterable[str]) -> bool:
        """On, with ``gate_min_samples`` samples measuring (factor included) :data:`SETTLED`
        times ``min_speedup`` or more: the controller's early calibration steps stop there."""
        at = self._buckets.get((bucket, frozenset(mix)))
        if at is None or at.state != GateState.ON or len(at.samples) < self.cfg.gate_min_samples:
            return False
        return measured_speedup(at.samples) * self._factor(bucket, at) >= SETTLED * self.cfg.min_speedup

    def timed_cycles(self, bucket: int, mix: Iterable[str] | None = None) -> int:
        return sum(at.cycles for at in self._of(bucket, mix))

    def _of(self, bucket: int, mix: Iterable[str] | None) -> list[_Bucket]:
        if mix is not None:
            return [at for at in (self._buckets.get((bucket, frozenset(mix))),) if at is not None]
        return [at for (b, _), at in self._buckets.items() if b == bucket]

    def host_fraction(self, bucket: int, plain_step_s: float | None) -> float:
        """h: a drafting call's host time beyond its drafts and beyond a plain call's,
        over ``plain_step_s`` (0 while unknown); the nearest bucket with it measured."""
        near = nearest({b for (b, _), at in self._buckets.items() if at.host_s}, bucket)
        if near is None or not plain_step_s:
            return 0.0
        host = [x for at in self._of(near, None) for x in at.host_s]
        base = median([x for at in self._of(near, None) for x in at.plain_host_s]) or 0.0
        return max(0.0, median(host) - base) / plain_step_s

    # ------------------------------------------------------------------- reading

    def stats(self) -> dict[int, dict]:
        """Per bucket: the keys of :meth:`.DomainProposer.step_stats` (times in ms), every
        mix pooled, and ``mixes``: per mix (:func:`mix_name`) its ``gate``,
        ``measured_speedup``, ``samples`` and ``steps``."""
        def ms(values: Iterable[float]) -> float | None:
            m = median(values)
            return None if m is None else m * 1e3

        out = {}
        for b in sorted({b for b, _ in self._buckets}):
            mixes = sorted(((mix, at) for (bb, mix), at in self._buckets.items() if bb == b),
                           key=lambda item: -item[1].steps)
            ats = [at for _, at in mixes]

            def pooled(name: str) -> list[float]:
                return [x for at in ats for x in getattr(at, name)]

            states = {at.state for at in ats if at.steps}
            out[b] = {
                "gate": states.pop() if len(states) == 1 else ("per-mix" if states else GateState.WARMUP),
                "predicted_speedup": median(pooled("predicted")),
                "measured_speedup": measured_speedup(pooled("samples")),
                "samples": sum(at.total_samples for at in ats),
                "plain_step_ms": ms(pooled("plain_cycles")),
                "cycle_ms": ms(pooled("draft_cycles")),
                "draft_ms": ms(pooled("draft_s")),
                "host_ms": ms(pooled("host_s")),
                "steps": sum(at.steps for at in ats),
                "mixes": {mix_name(mix): {"gate": at.state, "measured_speedup": measured_speedup(at.samples),
                                          "samples": at.total_samples, "steps": at.steps,
                                          "tail_factor": median(at.tails), "whole_speedup": median(at.whole),
                                          "inherited": at.inherited} for mix, at in mixes},
            }
        return out

    def summary(self) -> list[str]:
        """One part per bucket (and per mix where a bucket has several), for the periodic log."""
        x = lambda value: "n/a" if value is None else f"{value:.2f}x"  # noqa: E731
        parts = []
        for b, g in self.stats().items():
            mixes = "" if len(g["mixes"]) < 2 else " (" + ", ".join(
                f"{name}: {m['gate']} {x(m['measured_speedup'])}" for name, m in g["mixes"].items()) + ")"
            tails = [f"{name} {m['tail_factor']:.2f}" for name, m in g["mixes"].items() if m["tail_factor"] is not None]
            mixes += f" tail={', '.join(tails)}" if tails else ""
            parts.append(f"batch<={b}: gate={g['gate']} predicted={x(g['predicted_speedup'])} "
                         f"measured={x(g['measured_speedup'])} samples={g['samples']}{mixes}")
        return parts
