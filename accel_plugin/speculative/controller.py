"""How many tokens to draft, per domain and batch size, on a machine whose speed varies.

The speedup model is :mod:`.speedup`: ``S(a, k, c, v) = (1 - a^(k+1)) / ((1 - a)
(k c + 1 + v(k)))``. Per domain the controller estimates ``a`` from a window of
observations (:mod:`.acceptance`: one per request and step, drafted ``k`` and accepted ``n``, as
accepted / tested positions). ``c`` and ``v`` come from paired timings per batch bucket (:mod:`.costs`:
a draft call with the target step right after it, a plain step with its verifying neighbours; buckets
of rows 1, 2, 3-4, 5-8, ...; a band around the weight-size ratio): a spell of a shared machine moves neither.

Per domain and bucket the controller decides on or off and k:

- **Hysteresis.** A domain that is on goes off when the best ``S`` over ``k = 1..k_max`` is below
  ``min_speedup``; one that is off goes on when it reaches ``min_speedup * (1 + hysteresis)``; either
  switch needs its condition in ``switch_after`` consecutive decisions, so one odd step never flips
  it. While on, k changes only for an ``S`` more than 1% above the current k's.
- **Warm-up.** A domain drafts k_max until it has ``min_samples`` observations, a measured ``c`` and
  (while calibration is on) a measured ``v``, waiting for ``v`` at most 32 steps. Then each bucket
  starts undecided: off at the first decision below the band, on after ``switch_after`` decisions
  above it (meanwhile it drafts as the nearest decided bucket does, or k_max), as does a bucket seen first later.
- **Calibration steps.** When some request would draft and the last ``calibration_interval - 1``
  timed steps of the bucket all verified drafts (every other step until the bucket has 3 samples of
  ``v``), no request drafts: that plain step's time against its verifying neighbours gives ``v``.
  Probes due then wait for the next step. (With every domain of a batch off, plain steps happen.)
- **Lookup caps.** A prompt lookup with a ``spec_factor`` cap is measured both ways (:mod:`.entries`);
  per bucket it drafts capped or the whole continuation, whichever predicts the higher best ``S``; where
  the step gate goes off there, the cap comes back for good first.
- **Probing.** An off domain drafts ``probe_k`` tokens for one of its requests once every
  ``probe_interval`` of its steps. A domain whose draft model failed is off for good (``failed``).

Per step, the step model (:func:`.step_model.plan_step`, given every row's domain)
drops domains whose drafting costs the step more than its rows gain; the measured
step gate (:class:`.step_gate.StepGate`) wins over all: at a bucket and domain mix
it switched off, no row drafts but its probes. Calibration steps come every other step until a
bucket has ``gate_min_samples`` samples, every 8th until ``gate_window`` (unless it is settled).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

from .costs import MIN_PAIRS, StepCosts, batch_bucket, nearest
from .domain_stats import DomainCounters, DomainState, DomainStats
from .draft_config.schema import ControllerConfig
from .entries import Choice, Entry, lift_cap, take_back_caps
from .lookup import entry_domain
from .speedup import best_k, expected_drafts, expected_speedup, expected_tokens, speedup_curve
from .step_gate import GateState, StepGate
from .step_model import plan_step

__all__ = ["DomainController", "batch_bucket", "best_k", "expected_speedup", "expected_tokens"]  # from .costs, .speedup

#: a bucket with fewer than MIN_PAIRS samples of v calibrates every other step
_EARLY_CALIBRATION = 2
#: steps warm-up waits for a measured v at most (then v = 0 until measured)
_WARMUP_WAIT = 32
#: a new k must predict more than this much (relative) above the current k
_K_MARGIN = 0.01
#: calibration interval (at most) while a bucket's gate has fewer than gate_window samples
_GATE_CALIBRATION = 8
#: timed cycles of a bucket after which the gate's early calibration stops (rows never pair)
_GATE_EARLY_CYCLES = (64, 512)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _drafts(rates, k: int) -> float:
    """Drafts per drafting row at ``k`` (1 at least; fewer than k for capped offers): what v is read for."""
    return max(k, 1) if rates is None else expected_drafts(rates, max(k, 1))


class DomainController:
    """Chooses k per domain and batch bucket from acceptance and paired costs.

    Per framework step, the proposer calls :meth:`record_step` (the target step that
    just ran), :meth:`observe` per request, :meth:`step` with the new batch, then
    :meth:`k_for` per request, :meth:`end_step`, and :meth:`record_draft` per draft
    model that ran. ``target_bytes`` and :meth:`set_draft_bytes` give the weight
    sizes of the plausibility band (optional). Methods taking ``rows`` read the
    bucket of that batch size, by default the current step's.
    """

    def __init__(self, cfg: ControllerConfig, drafts: dict[str, str | None], k_max: dict[str, int], *,
                 target_bytes: int | None = None, logger: logging.Logger | None = None, capped: Iterable[str] = ()):
        self.cfg = cfg
        self.costs = StepCosts(cfg, target_bytes=target_bytes, logger=logger)
        capped = set(capped)  # the lookup entries with a spec_factor cap
        self._domains = {name: Entry(name, draft, k_max[name], cfg, name in capped) for name, draft in drafts.items()}
        self._bucket = 1  #: bucket of the current step
        self.calibrating = False  #: the current step drafts nothing, to time a plain step
        self.gate = StepGate(cfg)
        self.gated = False  #: the step gate keeps the current step from drafting
        self._plan: dict[str, int] | None = None  #: the step model's k per domain, this step
        self._mix: frozenset = frozenset()  #: the current step's domain mix: the domains of its rows that may draft
        self.predicted: float | None = None  #: the step model's S_step for this step

    # ---------------------------------------------------------------- measurement

    def set_target_bytes(self, nbytes: int | None) -> None:
        """Bytes of weights one target forward reads (the sum of its parameters' will do)."""
        self.costs.target_bytes = nbytes

    def set_draft_bytes(self, draft: str, nbytes: int) -> None:
        """Bytes of weights one forward of ``draft`` reads (the embedding table excluded)."""
        self.costs.draft_bytes[draft] = nbytes

    def record_draft(self, draft: str, rows: int, seconds_per_forward: float) -> None:
        """This call drafted with ``draft`` for ``rows`` requests, ``seconds_per_forward``
        per forward (paired with the step the next :meth:`record_step` reports)."""
        self.costs.record_draft(draft, rows, seconds_per_forward)

    def record_step(self, seconds: float | None, rows: int, drafted_tokens: int) -> None:
        """The target step since the last call decoded ``rows`` requests and verified ``drafted_tokens``
        drafts in all (0: plain) in ``seconds`` (``None``: not comparable, e.g. it ran a prefill)."""
        self.costs.record_step(seconds, rows, drafted_tokens)

    def record_cycle(self, seconds: float | None, rows: int, tokens: int, drafted: int) -> None:
        """The cycle since the last call's start (its drafting, the target step, host work) decoded ``rows``
        requests into ``tokens`` tokens and verified ``drafted`` drafts (``None`` seconds: not comparable)."""
        self.gate.record_cycle(seconds, rows, batch_bucket(rows), tokens, drafted)

    def record_call(self, rows: int, seconds: float, draft_seconds: float, drafted: int) -> None:
        """This call, for ``rows`` requests, took ``seconds``, ``draft_seconds`` in draft models."""
        if rows > 0:
            self.gate.record_call(batch_bucket(rows), seconds, draft_seconds, drafted)

    @property
    def _gating(self) -> bool:
        return self.cfg.step_gate and self.cfg.adaptive

    def _bucket_of(self, rows: int | None) -> int:
        return self._bucket if rows is None else batch_bucket(rows)

    def _draft_of(self, domain: str) -> str:
        return self._domains[domain].draft or ""

    def verify_overhead(self, k: int = 1, rows: int | None = None) -> float:
        """v for verifying ``k`` drafts per request: configured, or measured (0 until then)."""
        return self.costs.verify_overhead(k, self._bucket_of(rows))

    def cost_ratio(self, domain: str, rows: int | None = None) -> float | None:
        """c of ``domain``: configured, or paired and within the size band (``None`` until measured)."""
        return self.costs.cost_ratio(self._draft_of(domain), self._bucket_of(rows))

    def measured_cost_ratio(self, domain: str, rows: int | None = None) -> float | None:
        """The paired c of ``domain``, before the size band."""
        return self.costs.measured_cost_ratio(self._draft_of(domain), self._bucket_of(rows))

    def size_cost_ratio(self, domain: str) -> float | None:
        """Draft bytes / target bytes per forward (``None``: sizes unknown)."""
        return self.costs.size_cost_ratio(self._draft_of(domain))

    # -------------------------------------------------------------------- decisions

    def observe(self, domain: str, k: int, accepted: int, offer: int | None = None) -> None:
        """A request of ``domain`` drafted ``k`` tokens last step, ``accepted`` were kept; ``offer``: the most it
        would have drafted at any k (a lookup's ``spec_factor`` cap; ``None``: k_max)."""
        d = self._domains[domain]
        if k <= 0:
            return
        accepted = max(0, min(accepted, k))
        if d.free is None:  # a measured cap's windows learn from observe_lookup
            d.window.add(k, accepted, offer)
        d.steps, d.drafted, d.accepted = d.steps + 1, d.drafted + k, d.accepted + accepted

    def observe_lookup(self, entry: str, avail: int, accepted: int, cap: int, free: bool = True) -> None:
        """A capped lookup's draft followed to its end (:class:`.lookup.Shadow`): the target produced the first
        ``accepted`` of the ``avail`` tokens after its match; the capped window learns it (``cap``: what the cap
        drafts), the whole continuations' too if ``free`` (a step the uncapped policy would make)."""
        d = self._domains[entry]
        if d.free is None or avail <= 0:
            return
        avail, capped = min(avail, d.k_max), min(cap, avail)
        d.window.add(capped, min(accepted, capped), capped)
        if free:
            d.free.add(avail, min(accepted, avail), avail)

    def capped(self, entry: str) -> bool:
        """Whether ``entry``'s lookup keeps its cap at the current bucket (False: lifted, see :mod:`.entries`)."""
        d = self._domains[entry]
        return d.window_of(self._choice(d, self._bucket)) is d.window

    def follows(self, entry: str) -> bool:
        """Whether ``entry``'s capped drafts are followed to their end (a measured cap: :meth:`observe_lookup`)."""
        return self._domains[entry].free is not None

    def step(self, rows: int = 1, domains: Iterable[str] | None = None,
             row_domains: Sequence[str] | None = None) -> None:
        """Start a framework step of ``rows`` requests of ``domains`` (default: all; with lookup entries):
        re-decide those and ``row_domains`` at this batch bucket (no other changed); ask the step gate;
        maybe make it a calibration step. ``row_domains`` (every row's entry) lets the step model plan
        the step. A step without requests decides nothing."""
        self.calibrating, self.gated, self._plan, self.predicted = False, False, None, None
        if rows <= 0:
            return
        self._bucket = b = batch_bucket(rows)
        seen = set(self._domains if domains is None else domains) | set(row_domains or ())
        for name in seen:  # a domain with no request here has nothing new to decide at this bucket
            self._decide(self._domains[name], b)
        names = set(row_domains) if row_domains is not None else seen
        # a lookup entry counts as its domain (matches come and go from step to step), but in a one-row
        # step, a single entry: there a draft that loses beside a lookup that pays goes off alone
        self._mix = mix = frozenset(n if b == 1 else entry_domain(n) for n in names
                                    if self._domains[n].fixed not in DomainState.NEVER_DRAFTS)
        verdict = self.gate.begin(b, mix) if self._gating else GateState.WARMUP
        if verdict == GateState.OFF and take_back_caps(self._domains[n].choices.get(b) for n in names):
            verdict = self.gate.restart(b, mix)  # measured again, capped
        if verdict in (GateState.OFF, GateState.REFERENCE):
            self.gated = True
            return
        probe = verdict == "probe"
        self.calibrating = (not probe and self._calibration_due(b)
                            and any(self._state(self._domains[n], b)[1] for n in names))
        if row_domains is not None and not self.calibrating and self.cfg.adaptive:
            self._plan_step(b, Counter(row_domains), probe)

    def _plan_step(self, bucket: int, counts: Counter, probe: bool) -> None:
        """The step model's plan; none while a domain of the step is warming up."""
        ks, alphas, costs = {}, {}, {}
        for name in counts:
            d = self._domains[name]
            state, k = self._state(d, bucket)
            if not k or d.fixed is not None:
                continue
            rates, c = d.window_of(self._choice(d, bucket)).profile(), self.cost_ratio(name)  # per draft position
            if state == DomainState.WARMUP or rates is None or c is None:
                return
            ks[name], alphas[name], costs[name] = k, rates, c
        if not ks:
            return
        host = self.gate.host_fraction(bucket, self.costs.target_step_s(bucket))
        plan, s = plan_step(sum(counts.values()), ks, counts, alphas, costs, {n: self._draft_of(n) for n in ks},
                            lambda per_row: self.costs.verify_overhead(per_row, bucket), host,
                            {n: self._domains[n].k_max for n in ks})
        if s < self.cfg.min_speedup and not probe:
            plan = {n: 0 for n in ks}
        else:
            self.gate.record_prediction(bucket, s)
        self._plan, self.predicted = plan, s

    def _calibration_due(self, bucket: int) -> bool:
        interval = self.cfg.calibration_interval
        if not interval or not self.cfg.adaptive or self.cfg.verify_overhead is not None:
            return False
        if self.costs.overhead_samples(bucket) < MIN_PAIRS:
            interval = min(interval, _EARLY_CALIBRATION)
        elif self._gating and 0 < (cycles := self.gate.timed_cycles(bucket, self._mix)) < _GATE_EARLY_CYCLES[1]:
            samples = self.gate.samples(bucket, self._mix)
            if samples < self.cfg.gate_min_samples and cycles < _GATE_EARLY_CYCLES[0]:
                interval = min(interval, _EARLY_CALIBRATION)
            elif samples < self.cfg.gate_window and not self.gate.settled(bucket, self._mix):
                interval = min(interval, _GATE_CALIBRATION)
        return self.costs.steps_since_plain(bucket) >= interval - 1

    def _overhead_known(self, d: Entry) -> bool:
        """v is configured, measured at some bucket, or will not be (or not soon)."""
        return (self.cfg.verify_overhead is not None or not self.cfg.calibration_interval
                or self.costs.overhead_samples() >= MIN_PAIRS or d.warmup_steps > _WARMUP_WAIT)

    def _decide(self, d: Entry, bucket: int) -> None:
        if d.fixed is not None:
            return
        alpha, rates, c = d.window.alpha, d.window.profile(), self.cost_ratio(d.name)
        if not d.warm:
            d.warmup_steps += 1
            if alpha is None or len(d.window) < self.cfg.min_samples or c is None or not self._overhead_known(d):
                return
            d.warm = True
        speedups = speedup_curve(rates, d.k_max, c, self.verify_overhead)
        choice = d.choices.setdefault(bucket, Choice(DomainState.WARMUP, 0))
        if d.free is not None and not choice.pinned and (free := d.free.profile()) is not None:  # which way pays
            free_speedups = speedup_curve(free, d.k_max, c, self.verify_overhead)
            choice.free = lift_cap(choice.free, speedups, free_speedups, _K_MARGIN)
            if choice.free:
                alpha, speedups = d.free.alpha, free_speedups
        k = max(range(1, d.k_max + 1), key=lambda j: (speedups[j], -j))
        s = speedups[k] if alpha >= self.cfg.min_acceptance else 0.0
        is_on, undecided = choice.state == DomainState.ON, choice.state == DomainState.WARMUP
        want_on = s >= self.cfg.min_speedup * (1.0 if is_on else 1.0 + self.cfg.hysteresis)
        if want_on == is_on and not undecided:
            choice.pending = 0
            if is_on and k != choice.k and speedups[k] > speedups[choice.k] * (1.0 + _K_MARGIN):
                choice.k = k
            return
        choice.pending += 1
        # undecided -> off at once: drafting k_max for a poor draft is the costly mistake
        if choice.pending >= self.cfg.switch_after or undecided and not want_on:
            d.switches += not undecided
            choice.state, choice.k, choice.pending = (DomainState.ON, k, 0) if want_on else (DomainState.OFF, 0, 0)
            d.idle_steps = 0

    def _choice(self, d: Entry, bucket: int) -> Choice | None:
        """``d``'s decision at ``bucket`` (undecided: the nearest decided bucket's; None: none decided)."""
        choice = d.choices.get(bucket)  # decided here: the usual case, read several times a step
        if choice is None or choice.state == DomainState.WARMUP:
            near = nearest((b for b, ch in d.choices.items() if ch.state != DomainState.WARMUP), bucket)
            return None if near is None else d.choices[near]
        return choice

    def _state(self, d: Entry, bucket: int) -> tuple[str, int]:
        """(state, k) of ``d`` at ``bucket`` (undecided: the nearest decided bucket's, or warm-up)."""
        if d.fixed is not None:
            return d.fixed, d.k_max if d.fixed == DomainState.FIXED else 0
        choice = self._choice(d, bucket)
        if choice is None:  # warm-up: a few drafts, enough to measure, cheap if the draft is poor
            return DomainState.WARMUP, min(self.cfg.warmup_k, d.k_max)
        return choice.state, choice.k

    def state(self, domain: str, rows: int | None = None) -> tuple[str, int]:
        """(state, k) of ``domain`` at batch size ``rows``, probes and calibration aside."""
        return self._state(self._domains[domain], self._bucket_of(rows))

    def k_for(self, domain: str) -> int:
        """Tokens to draft this step for a request of ``domain`` (probes included; 0 in a calibration step
        or when the step gate is off; the step model's k if it planned). An off domain's probe goes to the
        first of its requests asked for in a step; the others draft nothing. Call :meth:`end_step` once
        per framework step after the last ``k_for``."""
        if self.calibrating or self.gated:
            return 0
        d = self._domains[domain]
        state, k = self._state(d, self._bucket)
        if state == DomainState.OFF:
            if d.probed or d.idle_steps + 1 < self.cfg.probe_interval:
                return 0
            d.probed = True
            return min(self.cfg.probe_k, d.k_max)
        return k if self._plan is None else self._plan.get(domain, k)

    def end_step(self, domains_seen: set[str]) -> None:
        """Count a step of every off domain that had requests (towards its next probe);
        a calibration step or one the gate kept from drafting does not count."""
        for d in self._domains.values():
            d.probed = False
        if self.calibrating or self.gated:
            return
        for name in domains_seen:
            d = self._domains[name]
            if self._state(d, self._bucket)[0] == DomainState.OFF:
                d.idle_steps = 0 if d.idle_steps + 1 >= self.cfg.probe_interval else d.idle_steps + 1

    def fail(self, draft: str, error: str) -> list[str]:
        """Switch off every domain served by ``draft``; returns their names."""
        names = []
        for d in self._domains.values():
            if d.draft == draft and d.fixed != DomainState.FAILED:
                d.fixed, d.error = DomainState.FAILED, error
                names.append(d.name)
        return names

    # ------------------------------------------------------------------- reading

    def stats(self, *, by_bucket: bool = True) -> dict[str, DomainStats]:
        out = {}
        b = self._bucket
        for d in self._domains.values():
            state, k = self._state(d, b)
            window = d.window_of(self._choice(d, b))
            alpha, rates = window.alpha, window.profile()
            v, c = self.verify_overhead(_drafts(rates, k)), self.cost_ratio(d.name)
            speedup = None if alpha is None or c is None else expected_speedup(rates, k, c, v)
            out[d.name] = DomainStats(
                domain=d.name, draft=d.draft, state=state, k=k, k_max=d.k_max,
                steps=d.steps, drafted=d.drafted, accepted=d.accepted, alpha=alpha,
                acceptance_per_pos=window.per_position(), cost_ratio=c, verify_overhead=v,
                draft_forward_ms=_ms(self.costs.draft_forward_s(self._draft_of(d.name))),
                target_step_ms=_ms(self.costs.target_step_s(b)), verify_step_ms=_ms(self.costs.verify_step_s(b)),
                expected_speedup=speedup, error=d.error, bucket=b,
                cost_ratio_measured=self.measured_cost_ratio(d.name), cost_ratio_size=self.size_cost_ratio(d.name),
                by_bucket={bk: (ch.state, ch.k) for bk, ch in sorted(d.choices.items())}, switches=d.switches,
                costs_by_bucket={bk: self._costs_at(d, bk) for bk in sorted(d.choices)} if by_bucket else {},
            )
        return out

    def counters(self) -> dict[str, DomainCounters]:
        """Per domain: counters, state and k at the last step's bucket (a cheap per-step read)."""
        return {d.name: DomainCounters(d.drafted, d.accepted, d.steps, *self._state(d, self._bucket))
                for d in self._domains.values()}

    def _costs_at(self, d: Entry, bucket: int) -> dict:
        state, k = self._state(d, bucket)
        c = self.costs.cost_ratio(self._draft_of(d.name), bucket)
        rates = d.window_of(self._choice(d, bucket)).profile()
        v = self.costs.verify_overhead(_drafts(rates, k), bucket)
        speedup = None if rates is None or c is None else expected_speedup(rates, k, c, v)
        out = {"state": state, "k": k, "c": c, "v": v, "expected_speedup": speedup}
        if d.free is not None:  # a capped lookup: whether the cap is lifted here, or back here for good
            out["cap_lifted"], out["cap_pinned"] = d.window_of(d.choices[bucket]) is d.free, d.choices[bucket].pinned
        return out

    def step_stats(self) -> dict[int, dict]:
        """Per batch bucket: the step gate and the step model (:meth:`.StepGate.stats`)."""
        return self.gate.stats()

    def summary(self) -> str:
        """One part per domain, then one per batch bucket of the step gate, for the periodic log."""
        return "; ".join([s.summary() for s in self.stats().values()] + self.gate.summary())
