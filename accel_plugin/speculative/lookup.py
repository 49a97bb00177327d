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
draft token costs verification time.

:class:`NgramIndex` keeps, per n, a dict from an n-gram's bytes to the position of
the token that followed it (the earliest or the latest occurrence), and is fed only
the tokens added since the last call: an update costs ``O(new tokens * (max_n -
min_n + 1))`` dict operations, a lookup ``O(max_n - min_n + 1)`` plus ``k``, whatever
the context length. Memory grows with the context: one dict entry per position and
n-gram size (about 100-150 bytes each).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LOOKUP_DRAFT", "NgramIndex", "entry_domain", "lookup_entry", "most_drafts"]

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


class PromptLookup:
    """The prompt lookups of a proposer's domains (``lookups``: domain -> its
    :class:`~.draft_config.schema.LookupConfig`): one :class:`NgramIndex` per request
    of such a domain, kept on its state (``state.lookup``)."""

    def __init__(self, lookups: dict):
        self.lookups = lookups

    def entries(self) -> dict[str, str]:
        """Controller entry -> its draft id, one per lookup domain."""
        return {lookup_entry(name): LOOKUP_DRAFT for name in self.lookups}

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


def most_drafts(spec_factor: float | None, n: int) -> int | None:
    """The most drafts a match of ``n`` tokens gives: ``spec_factor * n``, 1 at least
    (``None``: no cap but k)."""
    return None if spec_factor is None else max(1, int(spec_factor * n))
