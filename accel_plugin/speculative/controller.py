"""How many tokens to draft, per domain: acceptance, costs and the speedup model.

The model (Leviathan, Kalman, Matias 2023): with per-position acceptance
probability ``a`` and a draft forward costing ``c`` target forwards, drafting ``k``
tokens gives an expected speedup over plain decoding of

    S(a, k, c) = (1 - a^(k+1)) / ((1 - a) (k c + 1))

extended by one measured term, ``v = v(k)``: how much longer a target step that
verifies k drafts per request takes than a plain one (the framework's verification
path, the extra query tokens), as a fraction of a plain step::

    S(a, k, c, v) = (1 - a^(k+1)) / ((1 - a) (k c + 1 + v))     for k >= 1

Without ``v`` a poor draft sits exactly at break-even when ``a`` is about ``c``
(k = 1), and switching it on there loses the verification cost every step.

The controller keeps, per domain, a window of recent observations (one per request
and step: drafted ``k``, accepted ``n``), from which it estimates ``a`` as
accepted / tested positions (a position is tested when every earlier draft was
accepted: ``n + (n < k)`` positions per observation, the maximum-likelihood
estimate under the model, unlike accepted / drafted which is biased low). ``c`` is
the measured cost of one draft forward divided by the measured time of a plain
target step (or ``controller.draft_cost`` from the YAML); ``v`` compares the
median target step that verified k drafts per request with the median plain one
at the same batch size (or ``controller.verify_overhead``; 0 until both kinds
have been seen).

A domain's k is the ``k`` in ``0..k_max`` with the largest ``S``; ``k = 0`` (off)
when no ``k >= 1`` reaches ``min_speedup`` (break-even by default) or the windowed
acceptance is below ``min_acceptance``. An off domain drafts ``probe_k`` tokens
for one of its requests once every ``probe_interval`` of its steps, so that a change
in acceptance is seen at the cost of one short draft per interval.
A domain whose draft model failed is off for good (state ``failed``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import ControllerConfig

__all__ = [
    "AcceptanceWindow",
    "DomainController",
    "DomainState",
    "DomainStats",
    "best_k",
    "expected_speedup",
    "expected_tokens",
]


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per target step, ``(1 - a^(k+1)) / (1 - a)`` (= k + 1 at a = 1)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0; got {k}")
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float, overhead: float = 0.0) -> float:
    """``S = (1 - a^(k+1)) / ((1 - a)(k c + 1 + v))`` with ``v = overhead``; 1.0 at k = 0."""
    if c < 0:
        raise ValueError(f"c must be >= 0; got {c}")
    if overhead < 0:
        raise ValueError(f"overhead must be >= 0; got {overhead}")
    if k == 0:
        return 1.0
    return expected_tokens(alpha, k) / (k * c + 1.0 + overhead)


def best_k(alpha: float, c: float, k_max: int, min_speedup: float = 1.0,
           overhead: float | Callable[[int], float] = 0.0) -> tuple[int, float]:
    """``(k, S)`` with the largest ``S`` over ``k`` in ``1..k_max``, or ``(0, 1.0)``
    when none reaches ``min_speedup`` (ties go to the smaller k). ``overhead`` is v,
    or a function giving v for each k."""
    best, best_s = 0, 1.0
    for k in range(1, k_max + 1):
        s = expected_speedup(alpha, k, c, overhead(k) if callable(overhead) else overhead)
        if s > best_s + 1e-12:
            best, best_s = k, s
    if best and best_s < min_speedup:
        return 0, 1.0
    return best, best_s


#: step times kept per (batch size, drafts verified), such pairs kept, and the
#: samples a pair needs before it counts towards v
_BUCKET_SAMPLES, _MAX_BUCKETS, _MIN_BUCKET_SAMPLES = 32, 64, 3
#: target steps between two recomputations of v from the step times
_V_REFRESH_STEPS = 16


class AcceptanceWindow:
    """The last ``size`` observations ``(k drafted, n accepted)``, with running sums."""

    def __init__(self, size: int, k_max: int):
        self.size = size
        self._obs: deque[tuple[int, int]] = deque()
        self.tested = 0
        self.accepted = 0
        self.drafted = 0
        # per position j (0-based): how often it was tested / accepted
        self.pos_tested = [0] * k_max
        self.pos_accepted = [0] * k_max

    def __len__(self) -> int:
        return len(self._obs)

    def _apply(self, k: int, n: int, sign: int) -> None:
        tested = min(n + 1, k)
        self.tested += sign * tested
        self.accepted += sign * n
        self.drafted += sign * k
        for j in range(min(tested, len(self.pos_tested))):
            self.pos_tested[j] += sign
            if j < n:
                self.pos_accepted[j] += sign

    def add(self, k: int, n: int) -> None:
        if k <= 0:
            return
        if not 0 <= n <= k:
            raise ValueError(f"accepted must be in 0..{k}; got {n}")
        self._obs.append((k, n))
        self._apply(k, n, +1)
        if len(self._obs) > self.size:
            self._apply(*self._obs.popleft(), -1)

    @property
    def alpha(self) -> float | None:
        """Per-position acceptance (accepted / tested positions); ``None`` without data."""
        return self.accepted / self.tested if self.tested else None

    def per_position(self) -> list[float | None]:
        """Conditional acceptance at each draft position (given all earlier accepted)."""
        return [a / t if t else None for a, t in zip(self.pos_accepted, self.pos_tested)]


class DomainState:
    """What the controller does with a domain right now."""

    WARMUP = "warmup"  #: too few observations: drafting k_max
    ON = "on"  #: drafting the k that maximises S
    OFF = "off"  #: below break-even: k = 0 except probes
    FIXED = "fixed"  #: adaptive: false
    FAILED = "failed"  #: the draft model raised; off until restart
    NO_DRAFT = "no-draft"  #: the YAML gives this domain no draft


@dataclass
class DomainStats:
    """Counters of one domain, as :meth:`DomainController.stats` returns them."""

    domain: str
    draft: str | None
    state: str
    k: int
    k_max: int
    steps: int = 0  #: (request, step) pairs that drafted
    drafted: int = 0  #: draft tokens proposed
    accepted: int = 0  #: draft tokens the target accepted
    alpha: float | None = None  #: windowed per-position acceptance
    acceptance_per_pos: list[float | None] = field(default_factory=list)
    cost_ratio: float | None = None  #: c: one draft forward / one plain target step
    verify_overhead: float | None = None  #: v at the current k (k = 1 when off): extra time of a verifying step / a plain one
    draft_forward_ms: float | None = None  #: median time of one batched draft forward (last 64 rounds)
    target_step_ms: float | None = None  #: median time of one plain target step (between propose calls)
    verify_step_ms: float | None = None  #: median time of a target step that verified drafts
    expected_speedup: float | None = None
    error: str | None = None

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted over the whole run (vLLM's definition)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafting steps (vLLM's "mean acceptance length")."""
        return 1.0 + self.accepted / self.steps if self.steps else 1.0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


class _Domain:
    def __init__(self, name: str, draft: str | None, k_max: int, cfg: ControllerConfig):
        self.name, self.draft, self.k_max = name, draft, k_max
        self.window = AcceptanceWindow(cfg.window, k_max)
        self.state = DomainState.NO_DRAFT if draft is None else (
            DomainState.WARMUP if cfg.adaptive else DomainState.FIXED
        )
        self.k = 0 if draft is None else k_max
        self.steps = self.drafted = self.accepted = 0
        self.idle_steps = 0  #: steps spent off since the last probe
        self.probed = False  #: a request of this domain probes in the current step
        self.speedup: float | None = None
        self.error: str | None = None


class DomainController:
    """Chooses k per domain; learns from observed acceptance and measured costs.

    ``c`` is ``draft_time / target_time`` where ``draft_time`` is the median time of
    one batched draft forward of the domain's draft model and ``target_time`` the
    median time of one plain target step; ``v(k)`` is ``verify_time / target_time - 1``
    with ``verify_time`` the median time of a target step that verified ``k`` drafts
    per request, both taken at the same batch size (the median over the batch sizes
    seen with both kinds of step; for a k never verified, the nearest k that was).
    The proposer feeds them through :meth:`record_draft_time` and
    :meth:`record_target_time`.
    """

    def __init__(self, cfg: ControllerConfig, drafts: dict[str, str | None], k_max: dict[str, int]):
        self.cfg = cfg
        self._domains = {name: _Domain(name, draft, k_max[name], cfg) for name, draft in drafts.items()}
        self._draft_times: dict[str, deque[float]] = {}
        self._target_times: deque[float] = deque(maxlen=64)  # plain steps
        self._verify_times: deque[float] = deque(maxlen=64)  # steps that verified drafts
        # per (rows, k): a step's time grows with its batch and, on some hardware,
        # with the drafts it verifies; plain (k = 0) and verifying steps are only
        # compared at equal batch sizes, and v is kept per k
        self._steps: OrderedDict[tuple[int, int], deque[float]] = OrderedDict()
        # v(k) from those, recomputed every _V_REFRESH_STEPS steps (not on every call)
        self._v_by_k: dict[int, float] | None = None
        self._steps_since_v = 0

    # ---------------------------------------------------------------- measurement

    def record_draft_time(self, draft: str, seconds_per_forward: float) -> None:
        self._draft_times.setdefault(draft, deque(maxlen=64)).append(seconds_per_forward)

    def record_target_time(self, seconds: float, k: int = 0, rows: int = 1) -> None:
        """One target step of ``rows`` requests took ``seconds``; it verified up to
        ``k`` drafts per request (0: a plain step)."""
        (self._verify_times if k else self._target_times).append(seconds)
        key = (rows, k)
        bucket = self._steps.get(key)
        if bucket is None:
            bucket = self._steps[key] = deque(maxlen=_BUCKET_SAMPLES)
            if len(self._steps) > _MAX_BUCKETS:
                self._steps.popitem(last=False)
        self._steps.move_to_end(key)
        bucket.append(seconds)
        self._steps_since_v += 1

    def draft_forward_s(self, domain: str) -> float | None:
        # the median, like the target step: a one-off slow first forward (allocation,
        # first-call warm-up) must not make a good draft look expensive for 64 rounds
        times = self._draft_times.get(self._domains[domain].draft or "")
        return sorted(times)[len(times) // 2] if times else None

    @staticmethod
    def _median(times: deque[float]) -> float | None:
        return sorted(times)[len(times) // 2] if times else None

    def target_step_s(self) -> float | None:
        """Median plain target step (a verifying one until a plain one is seen)."""
        return self._median(self._target_times) or self._median(self._verify_times)

    def verify_step_s(self) -> float | None:
        return self._median(self._verify_times)

    def verify_overhead(self, k: int = 1) -> float:
        """v for verifying ``k`` drafts per request: configured, or measured (the
        nearest measured k; 0 until a plain and a verifying step of one batch size
        have been timed)."""
        if self.cfg.verify_overhead is not None:
            return self.cfg.verify_overhead
        # until something is measured, every new step may complete a pair: look again
        stale = self._steps_since_v >= (_V_REFRESH_STEPS if self._v_by_k else 1)
        if self._v_by_k is None or stale:
            self._v_by_k, self._steps_since_v = self._measure_verify_overhead(), 0
        if not self._v_by_k:
            return 0.0
        return self._v_by_k[min(self._v_by_k, key=lambda j: (abs(j - k), j))]

    def _measure_verify_overhead(self) -> dict[int, float]:
        """{k: v(k)} for every k measured at a batch size that also has plain steps."""
        ratios: dict[int, list[float]] = {}
        for (rows, j), times in self._steps.items():
            plain = self._steps.get((rows, 0))
            if j and len(times) >= _MIN_BUCKET_SAMPLES and plain and len(plain) >= _MIN_BUCKET_SAMPLES:
                ratios.setdefault(j, []).append(self._median(times) / self._median(plain))
        return {j: max(0.0, sorted(r)[len(r) // 2] - 1.0) for j, r in ratios.items()}

    def cost_ratio(self, domain: str) -> float | None:
        """c for ``domain``: configured, or measured (``None`` until both are measured)."""
        if self.cfg.draft_cost is not None:
            return self.cfg.draft_cost
        draft, target = self.draft_forward_s(domain), self.target_step_s()
        if draft is None or not target:
            return None
        return draft / target

    # -------------------------------------------------------------------- decisions

    def observe(self, domain: str, k: int, accepted: int) -> None:
        """A request of ``domain`` drafted ``k`` tokens last step; ``accepted`` were kept."""
        d = self._domains[domain]
        if k <= 0:
            return
        accepted = max(0, min(accepted, k))
        d.window.add(k, accepted)
        d.steps += 1
        d.drafted += k
        d.accepted += accepted

    def step(self) -> None:
        """Re-decide every domain's k (called once per framework step)."""
        for d in self._domains.values():
            self._decide(d)

    def _decide(self, d: _Domain) -> None:
        if d.state in (DomainState.NO_DRAFT, DomainState.FAILED, DomainState.FIXED):
            return
        alpha = d.window.alpha
        c = self.cost_ratio(d.name)
        if alpha is None or len(d.window) < self.cfg.min_samples or c is None:
            d.state, d.k = DomainState.WARMUP, d.k_max
            return
        k, s = best_k(alpha, c, d.k_max, self.cfg.min_speedup, self.verify_overhead)
        if alpha < self.cfg.min_acceptance:
            k, s = 0, 1.0
        d.speedup = s if k else expected_speedup(alpha, 1, c, self.verify_overhead(1))
        if k:
            d.state, d.k, d.idle_steps = DomainState.ON, k, 0
        else:
            d.state, d.k = DomainState.OFF, 0

    def k_for(self, domain: str) -> int:
        """Tokens to draft this step for a request of ``domain`` (probes included).

        An off domain's probe goes to the first of its requests asked for in a step;
        the others draft nothing. Call :meth:`end_step` once per framework step after
        the last ``k_for``.
        """
        d = self._domains[domain]
        if d.state == DomainState.OFF:
            if d.probed or d.idle_steps + 1 < self.cfg.probe_interval:
                return 0
            d.probed = True
            return min(self.cfg.probe_k, d.k_max)
        return d.k

    def end_step(self, domains_seen: set[str]) -> None:
        """Count a step of every off domain that had requests (towards its next probe)."""
        for d in self._domains.values():
            d.probed = False
        for name in domains_seen:
            d = self._domains[name]
            if d.state == DomainState.OFF:
                d.idle_steps = 0 if d.idle_steps + 1 >= self.cfg.probe_interval else d.idle_steps + 1

    def fail(self, draft: str, error: str) -> list[str]:
        """Switch off every domain served by ``draft``; returns their names."""
        names = []
        for d in self._domains.values():
            if d.draft == draft and d.state != DomainState.FAILED:
                d.state, d.k, d.error = DomainState.FAILED, 0, error
                names.append(d.name)
        return names

    # ------------------------------------------------------------------- reading

    def stats(self) -> dict[str, DomainStats]:
        out = {}
        for d in self._domains.values():
            v = self.verify_overhead(max(d.k, 1))
            c = self.cost_ratio(d.name)
            alpha = d.window.alpha
            speedup = None
            if alpha is not None and c is not None:
                speedup = expected_speedup(alpha, d.k, c, v)
            out[d.name] = DomainStats(
                domain=d.name, draft=d.draft, state=d.state, k=d.k, k_max=d.k_max,
                steps=d.steps, drafted=d.drafted, accepted=d.accepted, alpha=alpha,
                acceptance_per_pos=d.window.per_position(), cost_ratio=c, verify_overhead=v,
                draft_forward_ms=_ms(self.draft_forward_s(d.name)), target_step_ms=_ms(self.target_step_s()),
                verify_step_ms=_ms(self.verify_step_s()),
                expected_speedup=speedup, error=d.error,
            )
        return out

    def summary(self) -> str:
        """One line per domain, for the periodic log."""
        parts = []
        for s in self.stats().values():
            alpha = "n/a" if s.alpha is None else f"{s.alpha:.2f}"
            c = "n/a" if s.cost_ratio is None else f"{s.cost_ratio:.3f}"
            v = "n/a" if s.verify_overhead is None else f"{s.verify_overhead:.3f}"
            sp = "n/a" if s.expected_speedup is None or math.isnan(s.expected_speedup) else f"{s.expected_speedup:.2f}x"
            parts.append(
                f"{s.domain}: state={s.state} k={s.k}/{s.k_max} drafted={s.drafted} "
                f"accepted={s.accepted} alpha={alpha} c={c} v={v} S={sp}"
            )
        return "; ".join(parts)
