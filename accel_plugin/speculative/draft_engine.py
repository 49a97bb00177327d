"""Runs the draft models: per-request draft KV caches, batched drafting, timing.

One :class:`LlamaDraftModel` is loaded per distinct draft directory (two domains
may share one). Each request being drafted owns a :class:`DraftCache`: its KV slot
in that model and the tokens whose K/V the slot holds. At every step the cached
drafts fed back last step are compared with the request's new verified tokens (never
the whole context: see :class:`DraftCache`); the common prefix is kept (accepted
drafts stay, rejected ones are dropped by overwriting) and only the new tokens are
run. So the draft never recomputes a context it has seen.

Drafting one step for ``R`` requests of one draft model takes ``max k`` forwards:
the first runs every request's new tokens (1-2 tokens for a running request, 2 after
a fully accepted draft; the whole prompt for a new one; long prompts run in forwards
of their own so that short rows' attention is not padded to their length, and the
short rows' matrix products run on their real tokens only, see
:meth:`LlamaDraftModel.forward`), then ``k - 1`` one-token forwards extend every
request that still needs drafts, all rows of the model in one batch.
Drafting is greedy (argmax), which is what vLLM's own draft-model proposer does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .llama import LlamaDraftModel, resolve_precision

__all__ = ["DraftCache", "DraftEngine", "DraftJob", "DraftOutputError", "DraftResult"]

#: new-token counts above this run in forwards of their own (prompt prefills)
_LONG_ROW = 16


@dataclass
class DraftCache:
    """A request's KV slot in one draft model and the tokens cached there.

    The cached tokens are the request's context as of the last draft (``verified``
    tokens, held by reference: a request's context only grows, so its first
    ``verified`` tokens never change) followed by ``tail``, the drafts fed back into
    the model. A step compares only ``tail`` with the context's new tokens, so the
    host work does not grow with the context.
    """

    draft: str
    slot: int
    #: how many tokens of the request's context the slot holds, as drafted last
    verified: int = 0
    #: the drafts fed into the model after those (all but the last of each step)
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: the context of the last draft (a reference, not a copy) and its last token
    base: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    anchor: int = -1

    @property
    def tokens(self) -> np.ndarray:
        """Every token whose K/V the slot holds (a copy: for tests and debugging)."""
        return np.concatenate([np.asarray(self.base[: self.verified], dtype=np.int64), self.tail])

    def cached_prefix(self, context: np.ndarray) -> int:
        """How many leading tokens of ``context`` the slot already holds.

        Only the tokens after ``verified`` are compared, when ``context`` continues the
        last one (its token at ``verified - 1`` is the one seen then); a context that
        does not (a test reusing a cache, say) is compared whole."""
        v = self.verified
        if 0 < v <= len(context) and int(context[v - 1]) == self.anchor:
            return v + _common_prefix(self.tail, context[v:])
        return _common_prefix(self.tokens, context)

    def remember(self, context: np.ndarray, fed: Sequence[int]) -> None:
        """After drafting from ``context``: the slot holds it and ``fed``."""
        self.verified, self.base = len(context), context
        self.anchor = int(context[-1]) if len(context) else -1
        self.tail = np.asarray(fed, dtype=np.int64)


@dataclass
class DraftJob:
    """Draft ``k`` tokens after ``context`` (the request's verified tokens)."""

    cache: DraftCache
    context: np.ndarray
    k: int


@dataclass
class DraftResult:
    """Drafts per job (same order), and the time spent in 1-token rounds."""

    drafts: list[list[int]]
    seconds: float  #: wall time of this call, prompt prefills excluded (paid every step)
    rounds: int  #: forwards of the k loop (the cost of one draft token is seconds / rounds)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class DraftOutputError(RuntimeError):
    """A draft forward returned NaN or infinite logits (broken weights or numerics)."""


def _finite(logits: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: every row's logits are finite (no host sync).

    An argmax over NaN is a valid-looking token id: without the check, a broken
    draft would propose garbage at every step while the target quietly rejects it.
    A row's max is NaN if any entry is NaN, +inf if any is +inf (one reduction of [B]).
    """
    return torch.isfinite(logits.amax(dim=-1)).all()


class DraftEngine:
    """Loads draft models lazily (by directory) and drafts for groups of requests."""

    def __init__(self, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 max_len: int = 2048, initial_slots: int = 8, target_dir: str | None = None):
        self.dtype, self.device, self.max_len = dtype, torch.device(device), max_len
        self.initial_slots = initial_slots
        #: the target model's directory, for drafts that borrow its tensors (draft_format)
        self.target_dir = target_dir
        self.models: dict[str, LlamaDraftModel] = {}

    def load(self, draft: str) -> LlamaDraftModel:
        model = self.models.get(draft)
        if model is None:
            dtype, small_batch_weights = resolve_precision(self.dtype, self.device)
            model = LlamaDraftModel(draft, dtype=dtype, device=self.device,
                                    max_len=self.max_len, initial_slots=self.initial_slots,
                                    target_dir=self.target_dir, small_batch_weights=small_batch_weights)
            self.models[draft] = model
        return model

    def unload(self, draft: str) -> None:
        """Drop a model and its caches (after a failure)."""
        self.models.pop(draft, None)

    def new_cache(self, draft: str) -> DraftCache:
        return DraftCache(draft, self.load(draft).alloc_slot())

    def free_cache(self, cache: DraftCache) -> None:
        model = self.models.get(cache.draft)
        if model is not None:
            model.free_slot(cache.slot)

    def draft(self, draft: str, jobs: Sequence[DraftJob]) -> DraftResult:
        """Greedy drafts for ``jobs`` (all of model ``draft``); raises what the model raises,
        and :class:`DraftOutputError` when its logits are not finite."""
        model = self.load(draft)
        n = len(jobs)
        drafts: list[list[int]] = [[] for _ in range(n)]
        active = [i for i, job in enumerate(jobs) if job.k > 0 and len(job.context) > 0]
        if not active:
            return DraftResult(drafts, 0.0, 0)
        device = self.device
        t_start = time.perf_counter()
        prefill_seconds = 0.0
        # 1. catch up: each row runs the context tokens its cache lacks
        starts, news = {}, {}
        for i in active:
            job = jobs[i]
            keep = min(job.cache.cached_prefix(job.context), len(job.context) - 1)
            starts[i], news[i] = keep, job.context[keep:]
        short = [i for i in active if len(news[i]) <= _LONG_ROW]
        long = [i for i in active if len(news[i]) > _LONG_ROW]
        # drafts stay on the device until the end: one host copy per call
        pos = {i: p for p, i in enumerate(active)}
        ks = [jobs[i].k for i in active]
        out = torch.zeros(len(active), max(ks), dtype=torch.long, device=device)
        finite = torch.ones((), dtype=torch.bool, device=device)
        rounds = 0
        for group in ([short] if short else []) + [[i] for i in long]:
            t0 = time.perf_counter()
            width = max(len(news[i]) for i in group)
            tokens = torch.zeros(len(group), width, dtype=torch.long)
            for r, i in enumerate(group):
                tokens[r, : len(news[i])] = torch.from_numpy(news[i].astype(np.int64))
            logits = model.forward(
                tokens.to(device),
                torch.tensor([starts[i] for i in group], dtype=torch.long, device=device),
                torch.tensor([len(news[i]) for i in group], dtype=torch.long, device=device),
                torch.tensor([jobs[i].cache.slot for i in group], dtype=torch.long, device=device),
            )
            finite &= _finite(logits)
            if len(group) == len(active):
                out[:, 0] = model.greedy(logits)
            else:
                out[torch.tensor([pos[i] for i in group], device=device), 0] = model.greedy(logits)
            if group is short:
                rounds += 1
            else:
                # prompt prefills are one-offs; the short catch-up is paid every step
                prefill_seconds += time.perf_counter() - t0
        # 2. k - 1 one-token rounds over the rows that need more drafts; the rows of a
        # round are a subset of the last round's, so the index tensors change only
        # when a row drops out
        ends = torch.tensor([len(jobs[i].context) for i in active], dtype=torch.long, device=device)
        slots = torch.tensor([jobs[i].cache.slot for i in active], dtype=torch.long, device=device)
        ones = torch.ones(len(active), dtype=torch.long, device=device)
        rows = list(range(len(active)))
        idx = None  # None: every active row
        step = 1
        while True:
            still = [p for p in rows if ks[p] > step]
            if not still:
                break
            if len(still) != len(rows):
                rows = still
                idx = torch.tensor(rows, dtype=torch.long, device=device)
                r_ends, r_slots = ends[idx], slots[idx]
            elif idx is None:
                r_ends, r_slots = ends, slots
            prev = out[:, step - 1] if idx is None else out[idx, step - 1]
            logits = model.forward(prev[:, None], r_ends + (step - 1), ones[: len(rows)], r_slots)
            finite &= _finite(logits)
            if idx is None:
                out[:, step] = model.greedy(logits)
            else:
                out[idx, step] = model.greedy(logits)
            step += 1
            rounds += 1
        if not bool(finite):
            raise DraftOutputError(f"draft model {draft} returned non-finite logits (NaN or inf)")
        for p, row in enumerate(out.tolist()):
            drafts[active[p]] = row[: ks[p]]
        # 3. the cache now holds the context and every draft but the last
        for i in active:
            jobs[i].cache.remember(jobs[i].context, drafts[i][:-1])
        # everything but prompt prefills: forwards and the bookkeeping around them
        seconds = time.perf_counter() - t_start - prefill_seconds
        return DraftResult(drafts, seconds, rounds)
