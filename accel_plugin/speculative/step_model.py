"""The step model: the predicted speedup of drafting one step, over all its rows.

:func:`plan_step` predicts the speedup of drafting a step, over all
its rows and every draft model that runs in it::

    S_step = (sum over rows of E(a_row, k_row)) / rows
             / (1 + v(drafts per row) + sum over drafts run of k_d c_d + h)

``E`` is :func:`.speedup.expected_tokens` (``a_row``: its domain's acceptance per draft
position, or its :class:`.speedup.OfferProfile` where rows are offered fewer drafts, which also
gives its drafts per row; 1 for a row that drafts nothing), ``k_d``
the most tokens draft ``d`` drafts for a row (its forwards), ``c_d`` its cost ratio
at this bucket, ``h`` the host time of a drafting ``propose`` call beyond its draft
forwards and beyond a plain call's, in plain target steps. It keeps the subset of
domains (and their k) with the largest ``S_step``; none when that is below
``min_speedup``. Host work per step is O(domains in the step), not O(context).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import combinations

from .speedup import OfferProfile, expected_drafts, expected_tokens

__all__ = ["plan_step", "step_speedup"]

#: domains in one step up to which every subset is tried (beyond: greedy drop)
_ENUMERATE = 4


Alpha = float | Sequence[float] | OfferProfile


def step_speedup(rows: int, plan: dict[str, int], counts: dict[str, int], alphas: dict[str, Alpha],
                 costs: dict[str, float], draft_of: dict[str, str], verify: Callable[[float], float],
                 host: float) -> float:
    """``S_step`` (module docstring) of drafting ``plan[d]`` tokens for the ``counts[d]``
    rows of each domain ``d`` (the other rows of the ``rows`` draft nothing);
    ``costs`` holds c per domain, ``verify(drafts per row)`` gives v."""
    drafted = sum(counts[d] * expected_drafts(alphas[d], k) for d, k in plan.items() if k)
    if not drafted:
        return 1.0
    tokens = rows - sum(counts[d] for d, k in plan.items() if k)
    forwards: dict[str, tuple[int, float]] = {}
    for d, k in plan.items():
        if k:
            tokens += counts[d] * expected_tokens(alphas[d], k)
            k_run, c_run = forwards.get(draft_of[d], (0, 0.0))  # a draft shared by domains runs once
            forwards[draft_of[d]] = (max(k_run, k), max(c_run, costs[d]))
    cost = 1.0 + verify(drafted / rows) + sum(k * c for k, c in forwards.values()) + host
    return tokens / rows / cost


def plan_step(rows: int, ks: dict[str, int], counts: dict[str, int], alphas: dict[str, Alpha],
              costs: dict[str, float], draft_of: dict[str, str], verify: Callable[[float], float],
              host: float, k_max: dict[str, int]) -> tuple[dict[str, int], float]:
    """The plan (domain -> k, 0 = dropped) among the domains of ``ks`` (their
    per-domain k) with the largest :func:`step_speedup`, and that speedup.

    Every subset of up to :data:`_ENUMERATE` domains is tried (a greedy drop beyond),
    then each kept domain's k once over ``1..k_max``. The plan may predict below 1:
    the caller compares it with ``min_speedup``.
    """
    names = sorted(d for d, k in ks.items() if k > 0)

    def score(plan: dict[str, int]) -> float:
        return step_speedup(rows, plan, counts, alphas, costs, draft_of, verify, host)

    def of(subset: Iterable[str]) -> dict[str, int]:
        keep = set(subset)
        return {d: (ks[d] if d in keep else 0) for d in names}

    if not names:
        return {}, 1.0
    if len(names) <= _ENUMERATE:
        subsets = [c for n in range(1, len(names) + 1) for c in combinations(names, n)]
        best = max((of(s) for s in subsets), key=score)
    else:
        best = of(names)
        while sum(1 for k in best.values() if k) > 1:
            drops = [{**best, d: 0} for d, k in best.items() if k]
            better = max(drops, key=score)
            if score(better) <= score(best):
                break
            best = better
    best_s = score(best)
    for d in [d for d, k in best.items() if k]:
        for k in range(1, k_max[d] + 1):
            s = score({**best, d: k})
            if s > best_s + 1e-12:
                best, best_s = {**best, d: k}, s
    return best, best_s
