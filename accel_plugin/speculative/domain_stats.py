"""What the controller reports of a domain: its state (:class:`DomainState`) and its
counters (:class:`DomainStats`, as :meth:`.controller.DomainController.stats` returns
them and the adapters report them; :class:`DomainCounters`, the part that changes every
step, as :meth:`.controller.DomainController.counters` returns it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["DomainCounters", "DomainState", "DomainStats"]


def _acceptance_rate(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else 0.0


def _mean_acceptance_length(accepted: int, steps: int) -> float:
    return 1.0 + accepted / steps if steps else 1.0


class DomainState:
    """What the controller does with a domain right now."""

    WARMUP = "warmup"  #: too few observations: drafting controller.warmup_k
    ON = "on"  #: drafting the k that maximises S
    OFF = "off"  #: below break-even: k = 0 except probes
    FIXED = "fixed"  #: adaptive: false
    FAILED = "failed"  #: the draft model raised; off until restart
    NO_DRAFT = "no-draft"  #: the YAML gives this domain no draft
    #: fixed states of an entry that never drafts (not part of a step's domain mix)
    NEVER_DRAFTS = (NO_DRAFT, FAILED)


@dataclass
class DomainStats:
    """Counters of one domain, as :meth:`DomainController.stats` returns them.

    ``state``, ``k``, ``cost_ratio``, ``verify_overhead``, ``target_step_ms`` and
    ``verify_step_ms`` are those of the batch bucket of the last step (``bucket``).
    """

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
    cost_ratio: float | None = None  #: c used: one draft forward / one plain target step (paired, within the size band)
    verify_overhead: float | None = None  #: v at the current k (k = 1 when off): extra time of a verifying step / a plain one
    draft_forward_ms: float | None = None  #: median time of one batched draft forward (last 64 rounds)
    target_step_ms: float | None = None  #: median time of one plain target step at this bucket
    verify_step_ms: float | None = None  #: median time of a target step that verified drafts at this bucket
    expected_speedup: float | None = None
    error: str | None = None
    bucket: int = 1  #: batch bucket of the last step: 1, 2, 4 (3-4 rows), 8 (5-8 rows) ...
    cost_ratio_measured: float | None = None  #: the paired measurement of c, before the size band
    cost_ratio_size: float | None = None  #: draft bytes / target bytes per forward (None: sizes unknown)
    by_bucket: dict[int, tuple[str, int]] = field(default_factory=dict)  #: (state, k) per bucket decided so far
    switches: int = 0  #: on/off switches so far, all buckets
    #: per bucket decided so far: state, k, c, v and the predicted S there (empty from
    #: ``stats(by_bucket=False)``, the per-step read of the live metrics)
    costs_by_bucket: dict[int, dict] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted over the whole run (vLLM's definition)."""
        return _acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafting steps (vLLM's "mean acceptance length")."""
        return _mean_acceptance_length(self.accepted, self.steps)

    def summary(self) -> str:
        """This domain's part of the controller's periodic log line."""
        alpha = "n/a" if self.alpha is None else f"{self.alpha:.2f}"
        c = "n/a" if self.cost_ratio is None else f"{self.cost_ratio:.3f}"
        v = "n/a" if self.verify_overhead is None else f"{self.verify_overhead:.3f}"
        sp = "n/a" if self.expected_speedup is None or math.isnan(self.expected_speedup) \
            else f"{self.expected_speedup:.2f}x"
        per_batch = ""
        if len(self.by_bucket) > 1:
            per_batch = " k_by_batch=" + ",".join(f"{b}:{k}" for b, (_, k) in self.by_bucket.items())
        lifted = [str(b) for b, costs in self.costs_by_bucket.items() if costs.get("cap_lifted")]
        cap = f" cap_lifted_at_batch={','.join(lifted)}" if lifted else ""
        return (f"{self.domain}: state={self.state} k={self.k}/{self.k_max} batch<={self.bucket} drafted={self.drafted} "
                f"accepted={self.accepted} alpha={alpha} c={c} v={v} S={sp}{per_batch}{cap}")


class DomainCounters(NamedTuple):
    """The part of a domain's :class:`DomainStats` that changes every step (cheap to read)."""

    drafted: int
    accepted: int
    steps: int
    state: str
    k: int

    @property
    def acceptance_rate(self) -> float:
        return _acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_acceptance_length(self) -> float:
        return _mean_acceptance_length(self.accepted, self.steps)
