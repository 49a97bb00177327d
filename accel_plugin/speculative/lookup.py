"""Prompt lookup: model-free drafts from an n-gram index over a request's own context.

The semantics are vLLM's n-gram speculator's (``prompt_lookup_min`` /
``prompt_lookup_max``, ``vllm/v1/spec_decode/ngram_proposer.py``): find the longest
suffix n-gram of the context, ``min_n <= n <= max_n``, that also occurs earlier in it
(starting before the suffix, with at least one token after it); propose the up to
``k`` tokens that follow that occurrence. vLLM takes the **earliest** occurrence
(``occurrence="earliest"``, the default); ``occurrence="latest"`` takes the most
recent one instead. With ``spec_factor`` (a domain's ``lookup.spec_factor``) a match of
``n`` tokens proposes at most ``spec_factor * n`` of them (suffix decoding's
``max_spec_factor``): a one-token match is weak evidence, and on a CPU at batch 8 every
draft token costs verification time. Where a cap is set and the controller is adaptive, the cap is
measured rather than fixed: each capped draft is followed to the end of its continuation
(:class:`Shadow`, :meth:`PromptLookup.follow`), which tells how many of the uncapped drafts the
target would have accepted, and the controller lifts the cap at a batch bucket where drafting the
whole continuation predicts the better speedup (:meth:`.DomainController.capped`). The whole
continuations' window reads only the drafts the uncapped policy would have made (:attr:`Shadow.free`):
while capped, a run of right tokens is drafted over many short steps, each a sample; uncapped, it
would go in one or two, so counting every capped step over-states the uncapped steps' acceptance.

:class:`NgramIndex` keeps, per n, a dict from an n-gram's bytes to the position of
the token that followed it (the earliest or the latest occurrence), and is fed only
the tokens added since the last call: an update costs ``O(new tokens * (max_n -
min_n + 1))`` dict operations, a lookup ``O(max_n - min_n + 1)`` plus ``k``, whatever
the context length. Memory grows with the context: one dict entry per position and
n-gram size (about 100-150 bytes each).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["LOOKUP_DRAFT", "NgramIndex", "PromptLookup", "Shadow", "entry_domain", "lookup_entry", "most_drafts"]

#: the "draft" id of every lookup entry in the controller (its cost is measured under it)
LOOKUP_DRAFT = "lookup"
#: what a domain's lookup entry adds to the domain's name
_ENTRY_SUFFIX = "/lookup"


def lookup_entry(domain: str) -> str:
    """The controller entry of ``domain``'s prompt lookup: ``"<domain>/lookup"``."""
    return domain + _ENTRY_SUFFIX


def entry_domain(entry: str) -> str:
    """The domain of a controller entry: ``support`` for ``support/lookup`` and for ``support``."""
    return entry.removesuffix(_ENTRY_SUFFIX)


class NgramIndex:
    """The n-gram index of one request's context (tokens only ever appended)."""

    def __init__(self, min_n: int, max_n: int, occurrence: str = "earliest"):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n; got min_n={min_n}, max_n={max_n}")
        if occurrence not in ("earliest", "latest"):
            raise ValueError(f"occurrence must be 'earliest' or 'latest'; got {occurrence!r}")
        self.min_n, self.max_n, self.occurrence = min_n, max_n, occurrence
        #: per n: n-gram bytes -> position of the token that followed it
        self._follow: dict[int, dict[bytes, int]] = {n: {} for n in range(min_n, max_n + 1)}
        self.indexed = 0  #: tokens of the context the index has seen

    def update(self, tokens: np.ndarray) -> None:
        """Index ``tokens[self.indexed:]`` (``tokens``: the whole context, int64, of which
        the first ``self.indexed`` are the ones seen before)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        end = len(tokens)
        first = max(self.indexed, 1)  # a token at position p follows the n-grams ending at p - 1
        if end <= first:
            self.indexed = max(self.indexed, end)
            return
        latest, tail, lo = self.occurrence == "latest", None, 0
        for n, follow in self._follow.items():
            start = max(first, n)
            if start >= end:
                continue
            if not follow and end - start > 32:  # bulk (a prompt): one vectorised pass
                windows = np.lib.stride_tricks.sliding_window_view(tokens[: end - 1], n)[start - n:]
                keys = np.ascontiguousarray(windows).view(f"V{8 * n}").ravel().tolist()
                positions = range(start, end)
                if latest:
                    follow.update(zip(keys, positions))
                else:
                    follow.update(zip(reversed(keys), reversed(positions)))
                continue
            if tail is None:  # the few new tokens: one bytes object, sliced per n-gram
                lo = max(first - self.max_n, 0)
                tail = tokens[lo:end].tobytes()
            for p in range(start, end):
                key = tail[8 * (p - n - lo): 8 * (p - lo)]
                if latest:
                    follow[key] = p
                else:
                    follow.setdefault(key, p)
        self.indexed = end

    def find(self, tokens: np.ndarray) -> tuple[int, int] | None:
        """``(position, n)``: where in ``tokens`` (the indexed context) the first token to
        propose is, and the length of the suffix n-gram that matched; ``None`` when no
        suffix n-gram of length ``min_n..max_n`` occurred earlier."""
        length = len(tokens)
        top = min(self.max_n, length - 1)
        if top < self.min_n:
            return None
        tail = np.asarray(tokens[length - top:], dtype=np.int64).tobytes()  # sliced per n: one conversion
        for n in range(top, self.min_n - 1, -1):
            found = self._follow[n].get(tail[8 * (top - n):])
            if found is not None:
                return found, n
        return None

    def propose(self, tokens: np.ndarray, k: int, spec_factor: float | None = None) -> list[int]:
        """Up to ``k`` tokens after the longest suffix match (``[]``: no match), at most
        :func:`most_drafts` of them; indexes the tokens it has not seen first."""
        if k <= 0:
            return []
        self.update(tokens)
        hit = self.find(tokens)
        if hit is None:
            return []
        start, n = hit
        return [int(t) for t in tokens[start: start + min(k, most_drafts(spec_factor, n) or k)]]


class Shadow(NamedTuple):
    """A capped lookup's draft, followed to its end: the ``avail`` tokens of the context at ``at`` were
    the whole continuation when the context had ``start`` tokens; the cap allowed ``cap`` of them. Once
    the context has moved on, the target's tokens from ``start`` tell how many it would have accepted.

    ``free``: a step the uncapped policy (drafting up to k_max) makes too. Greedy outputs do not depend on the
    drafts, so that policy's steps follow from the context alone: after one at ``start`` whose
    continuation the target kept ``a`` tokens of, its next is at ``start + a + 1`` (the kept tokens
    and the step's own); the first capped step there or later stands for it (``RequestState.free_from``).
    On the demo's repeat answers (``python -m benchmarks.lookup_replay --shadows``): every capped step's
    whole continuation read 2.52 tokens a step, these 2.35, the uncapped policy itself 2.37."""

    entry: str
    at: int
    start: int
    avail: int
    cap: int
    free: bool = True


def follow_shadows(context: np.ndarray, shadows: list[Shadow]) -> tuple[list[tuple[Shadow, int]], list[Shadow]]:
    """``(done, open)``: each shadow the ``context`` settles, with the number of its continuation's tokens
    the target produced in a row (from the first), and those it cannot settle yet (every token so far
    matched, fewer than ``avail`` known)."""
    done, still = [], []
    for s in shadows:  # a few tokens each: Python lists beat numpy's per-call cost (3 us against 8 for two)
        known = min(s.avail, len(context) - s.start)
        drafted, produced = context[s.at: s.at + known].tolist(), context[s.start: s.start + known].tolist()
        same = 0
        while same < known and drafted[same] == produced[same]:
            same += 1
        if same < known:
            done.append((s, same))
        elif known >= s.avail:
            done.append((s, s.avail))
        else:
            still.append(s)
    return done, still


class PromptLookup:
    """The prompt lookups of a proposer's domains (``lookups``: domain -> its
    :class:`~.draft_config.schema.LookupConfig`): one :class:`NgramIndex` per request
    of such a domain, kept on its state (``state.lookup``)."""

    def __init__(self, lookups: dict, k_max: dict[str, int] | None = None):
        self.lookups = lookups
        self.k_max = k_max or {}  #: domain -> its k_max (a followed draft's continuation is cut there)

    def entries(self) -> dict[str, str]:
        """Controller entry -> its draft id, one per lookup domain."""
        return {lookup_entry(name): LOOKUP_DRAFT for name in self.lookups}

    def capped(self) -> set[str]:
        """The entries of the lookups with a ``spec_factor`` cap."""
        return {lookup_entry(name) for name, cfg in self.lookups.items() if cfg.spec_factor is not None}

    def match_rows(self, rows) -> dict[int, tuple[int, int | None]]:
        """Row -> ``(position, most)``: the context position to copy drafts from and the
        most tokens to copy (``spec_factor`` times the matched n-gram's length, at least 1;
        ``None``: no limit but k), for the rows (``(row, state)``) of lookup domains whose
        context has a match; indexes their new tokens first."""
        found = {}
        for i, state in rows:
            cfg = self.lookups.get(state.domain)
            if cfg is None:
                continue
            if state.lookup is None:
                state.lookup = NgramIndex(cfg.min, cfg.max, cfg.occurrence)
            context = state.context
            state.lookup.update(context)
            hit = state.lookup.find(context)
            if hit is not None:
                found[i] = hit[0], most_drafts(cfg.spec_factor, hit[1])
        return found

    def draft(self, state, hit: tuple[int, int | None], controller, max_len: int) -> list[int]:
        """The drafts of ``state``'s row from its match ``hit`` (:meth:`match_rows`) at the controller's k
        for its lookup entry, at most the cap unless the controller lifted it; sets the state's
        ``last_drafts``, ``drafter`` and ``offer``, and follows a capped draft (:class:`Shadow`)."""
        (at, cap), entry, context = hit, lookup_entry(state.domain), state.context
        room = max_len - len(context)
        most = cap if cap is None or controller.capped(entry) else None
        k = min(controller.k_for(entry), room, most or room)
        if k <= 0:
            return []
        drafts = [int(t) for t in context[at: at + k]]
        state.last_drafts, state.drafter = tuple(drafts), entry
        state.offer = most and min(most, len(context) - at)  # what any k would draft
        if controller.follows(entry):  # a measured cap (a fixed controller keeps it)
            most_k = self.k_max.get(state.domain, room)
            # the uncapped policy steps here too: its last step has settled (an open one ends past here) before here
            free = len(context) >= state.free_from and not any(s.free for s in state.shadows)
            state.shadows.append(Shadow(entry, at, len(context), min(len(context) - at, room, most_k), cap, free))
        return drafts

    @staticmethod
    def follow(state, observe) -> None:
        """Give ``observe(entry, avail, accepted, cap, free)`` every shadow of ``state`` its context now settles;
        a settled ``free`` one sets where the uncapped policy's next step is (``state.free_from``)."""
        done, state.shadows = follow_shadows(state.context, state.shadows)
        for shadow, accepted in done:
            if shadow.free:
                state.free_from = shadow.start + accepted + 1
            observe(shadow.entry, shadow.avail, accepted, shadow.cap, shadow.free)


def most_drafts(spec_factor: float | None, n: int) -> int | None:
    """The most drafts a match of ``n`` tokens gives: ``spec_factor * n``, 1 at least
    (``None``: no cap but k)."""
    return None if spec_factor is None else max(1, int(spec_factor * n))
