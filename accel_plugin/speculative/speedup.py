"""The expected-speedup model of speculative decoding: pure functions, no state.

With per-position acceptance probability ``a`` and a draft forward costing ``c``
plain target steps, drafting ``k`` tokens per request gives an expected speedup
over plain decoding of (Leviathan, Kalman, Matias 2023)

    S(a, k, c) = (1 - a^(k+1)) / ((1 - a) (k c + 1))

extended by one measured term, ``v = v(k)``: how much longer a target step that
verifies k drafts per request takes than a plain one (the framework's verification
path, the extra query tokens), as a fraction of a plain step::

    S(a, k, c, v) = (1 - a^(k+1)) / ((1 - a) (k c + 1 + v))     for k >= 1

Drafts capped per row (prompt lookup with ``spec_factor``: a match of n tokens drafts at most
``spec_factor x n``) are described by an :class:`OfferProfile` instead of per-position rates: a row
offered fewer drafts than k drafts only its offer, so k costs and gains only in the rows offered that
much, and those (the longer matches) accept more than the pool::

    S = (1 + sum_{j<=k} p_j q_j) / (c D + 1 + v(D)),    D = sum_{j<=k} p_j

with ``p_j`` the share of drafting rows offered j drafts or more and ``q_j`` the chance that those
rows have their first j drafts accepted (every formula below takes either form).

Used by the controller (:mod:`.controller`) and by the tuning tools
(:mod:`accel_plugin.tuning.acceptance`), so both predict with the same formula.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["OfferProfile", "best_k", "expected_drafts", "expected_speedup", "expected_tokens", "speedup_curve"]


@dataclass(frozen=True)
class OfferProfile:
    """Acceptance of drafts capped per row: ``reach[j]``, the share of drafting rows offered more
    than ``j`` drafts (``reach[0]`` is 1), and ``accept[j]``, the chance that such a row has its
    first ``j + 1`` drafts accepted (from :meth:`.AcceptanceWindow.profile`)."""

    reach: tuple[float, ...]
    accept: tuple[float, ...]

    def __post_init__(self):
        if len(self.reach) != len(self.accept) or not self.reach:
            raise ValueError(f"reach and accept need one value per draft position; got {self.reach}, {self.accept}")
        if any(not 0.0 <= x <= 1.0 for x in self.reach + self.accept):
            raise ValueError(f"reach and accept must be in [0, 1]; got {self.reach}, {self.accept}")

    def tokens(self, k: int) -> float:
        return 1.0 + sum(p * q for p, q in zip(self.reach[:k], self.accept[:k]))

    def drafts(self, k: int) -> float:
        return float(sum(self.reach[:k]))


def expected_drafts(alpha: float | Sequence[float] | OfferProfile, k: int) -> float:
    """Drafts per drafting row at ``k``: ``k``, or fewer where rows are offered fewer (:class:`OfferProfile`)."""
    return alpha.drafts(k) if isinstance(alpha, OfferProfile) else float(k)


def _rates(alpha: float | Sequence[float]) -> list[float]:
    """``alpha`` as a list of per-position acceptances, each checked to be in [0, 1]."""
    rates = [alpha] if isinstance(alpha, (int, float)) else list(alpha)
    if not rates or any(not 0.0 <= a <= 1.0 for a in rates):
        raise ValueError(f"alpha must be in [0, 1] (or a non-empty sequence of such); got {alpha}")
    return rates


def expected_tokens(alpha: float | Sequence[float] | OfferProfile, k: int) -> float:
    """Expected tokens per target step, ``(1 - a^(k+1)) / (1 - a)`` (= k + 1 at a = 1).

    ``alpha`` may also be the conditional acceptance per draft position (position ``j``
    accepted given every earlier one was; positions past its end take its last value):
    ``1 + a_1 + a_1 a_2 + ... + a_1 ... a_k``. Drafts rarely fail independently per
    position: a prompt-lookup draft that copies its first token right tends to copy
    the next ones too, so one pooled ``a`` undervalues long drafts."""
    if k < 0:
        raise ValueError(f"k must be >= 0; got {k}")
    if isinstance(alpha, OfferProfile):
        return alpha.tokens(k)
    rates = _rates(alpha)
    if len(rates) == 1:
        a = rates[0]
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    total, run = 1.0, 1.0
    for j in range(k):
        run *= rates[min(j, len(rates) - 1)]
        total += run
    return total


def expected_speedup(alpha: float | Sequence[float] | OfferProfile, k: int, c: float, overhead: float = 0.0) -> float:
    """``S = (1 - a^(k+1)) / ((1 - a)(k c + 1 + v))`` with ``v = overhead``; 1.0 at k = 0
    (with an :class:`OfferProfile`: its tokens over ``D c + 1 + v``, D its drafts at k)."""
    if c < 0:
        raise ValueError(f"c must be >= 0; got {c}")
    if overhead < 0:
        raise ValueError(f"overhead must be >= 0; got {overhead}")
    if k == 0:
        return 1.0
    return expected_tokens(alpha, k) / (expected_drafts(alpha, k) * c + 1.0 + overhead)


def speedup_curve(alpha: float | Sequence[float] | OfferProfile, k_max: int, c: float,
                  overhead: float | Callable[[float], float] = 0.0) -> list[float]:
    """``S`` for every ``k`` in ``0..k_max`` in one pass (what :func:`expected_speedup` gives
    for each): the controller reads the whole curve of every domain at every step.
    ``overhead`` is v, or a function giving v for the drafts per row (k; fewer with an
    :class:`OfferProfile`)."""
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0; got {k_max}")
    if c < 0:
        raise ValueError(f"c must be >= 0; got {c}")
    if isinstance(alpha, OfferProfile):
        curve = [1.0]
        for k in range(1, k_max + 1):
            drafts = alpha.drafts(k)
            v = overhead(drafts) if callable(overhead) else overhead
            if v < 0:
                raise ValueError(f"overhead must be >= 0; got {v}")
            curve.append(alpha.tokens(k) / (drafts * c + 1.0 + v))
        return curve
    rates = _rates(alpha)
    curve, tokens, run, last = [1.0], 1.0, 1.0, len(rates) - 1
    for k in range(1, k_max + 1):
        run *= rates[min(k - 1, last)]
        tokens += run
        v = overhead(k) if callable(overhead) else overhead
        if v < 0:
            raise ValueError(f"overhead must be >= 0; got {v}")
        curve.append(tokens / (k * c + 1.0 + v))
    return curve


def best_k(alpha: float | Sequence[float], c: float, k_max: int, min_speedup: float = 1.0,
           overhead: float | Callable[[int], float] = 0.0) -> tuple[int, float]:
    """``(k, S)`` with the largest ``S`` over ``k`` in ``1..k_max``, or ``(0, 1.0)``
    when none reaches ``min_speedup`` (ties go to the smaller k). ``overhead`` is v,
    or a function giving v for each k."""
    best, best_s = 0, 1.0
    for k, s in enumerate(speedup_curve(alpha, k_max, c, overhead)[1:], start=1):
        if s > best_s + 1e-12:
            best, best_s = k, s
    if best and best_s < min_speedup:
        return 0, 1.0
    return best, best_s
