"""The domain proposer, framework-neutral: rows in, drafts out.

A framework adapter calls :meth:`DomainProposer.propose` once per decoding step
with the batch as the framework sees it (the vLLM adapter passes vLLM's arguments
through unchanged):

- ``sampled_token_ids[i]``: the tokens row ``i`` received this step (accepted drafts
  plus one sampled token; ``[]`` = the row did not decode this step);
- ``num_tokens[i]``: the row's verified length, sampled tokens included;
- ``token_ids[i, :num_tokens[i]]``: the row's tokens.

Rows carry no request id and may move between steps, so a row is matched to its
request state by a key of its tokens: the state's context at the last step must be
the row's first ``num_tokens[i] - len(sampled_token_ids[i])`` tokens, and the key
reads 48 of them (:mod:`.request_states`; the row that held the state last step is
tried first). An adapter that knows request ids passes them
(``request_ids=``) and rows are matched by id. Either way a step reads only the
new tokens of a known row, ``token_ids[i, known:num_tokens[i]]``, so its host work
does not grow with the context (``python -m benchmarks.proposer_overhead``). A row
that matches nothing is a new request: its tokens are copied once and its prompt
is routed to a domain, decoding only the prefix the router reads (:meth:`.DomainRouter.route_tokens`).
States that no row matched are finished (or preempted) and freed at once, so memory is bounded by the batch.

Per row and step: how many of last step's drafts were accepted goes to the
controller; the controller's k for the row's domain decides how many tokens to
draft; rows are grouped by draft model and drafted in one batch per model. The
controller also gets the time of the target step that ran since the last call
(with its batch size and the drafts it verified) and each draft model's time per
forward in this call, which it pairs with the next target step (see
:mod:`.controller`); in a calibration step it asks for no drafts at all. If a
draft model raises (an exception, out of memory, non-finite logits: the engine's
``DraftOutputError``), every domain it serves is switched off with one logged
error and its rows get no drafts: decoding goes on without speculation for them,
and nothing else changes.

Thread safety: :meth:`DomainProposer.propose`, the readers (:meth:`~DomainProposer.stats`,
:meth:`~DomainProposer.stats_dict`, :meth:`~DomainProposer.counters`, :attr:`~DomainProposer.num_states`,
:attr:`~DomainProposer.draft_kv_bytes`) and :meth:`~DomainProposer.close` hold one lock, so a reader in
another thread (a metrics endpoint, vLLM's worker extension) never sees a step half done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .draft_config.issues import ConfigIssue, DraftConfigError
from .draft_config.loading import load_draft_config
from .draft_config.schema import DraftConfig
from .draft_config.target import DraftTarget
from .controller import DomainController
from .domain_stats import DomainCounters, DomainState, DomainStats
from .draft_engine import DraftEngine, DraftJob
from .lookup import LOOKUP_DRAFT, PromptLookup, lookup_entry
from .request_states import RequestState, StateIndex, row_keys
from .router import DomainRouter

__all__ = ["DomainProposer", "RequestState"]

_logger = logging.getLogger("accel_plugin.speculative")

class DomainProposer:
    """Router + controller + draft engine behind one ``propose`` call.

    ``detokenize`` turns a prompt's token ids into text for the router;
    ``max_len`` is the framework's maximum sequence length (drafts never go past it);
    ``target_bytes`` the bytes of weights one target forward reads (the sum of its
    parameters' bytes will do), which bounds the measured cost ratios to what the
    model sizes make plausible (``None``: no bound); ``target_dir`` the target
    model's directory, for drafts that borrow its tensors (:mod:`.draft_format`);
    ``clock`` times the target steps.
    """

    def __init__(self, config: DraftConfig, detokenize: Callable[[Sequence[int]], str], *,
                 max_len: int = 2048, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", initial_slots: int = 8,
                 clock: Callable[[], float] = time.perf_counter, logger: logging.Logger | None = None,
                 target_bytes: int | None = None, target_dir: str | None = None):
        self.config = config
        self.logger = logger or _logger
        self.detokenize = detokenize
        self.max_len = max_len
        self.router = DomainRouter.from_config(config)
        drafts = config.drafts()
        lookups = config.lookups()  # each lookup is an entry of its own: "<domain>/lookup"
        self.lookup = PromptLookup(lookups, {name: config.k_max(name) for name in lookups})
        k_max = {name: config.k_max(name) for name in drafts}
        k_max.update({lookup_entry(name): most for name, most in self.lookup.k_max.items()})
        self.controller = DomainController(
            config.controller, {**drafts, **self.lookup.entries()}, k_max,
            target_bytes=target_bytes, logger=self.logger, capped=self.lookup.capped(),
        )
        self.engine = DraftEngine(dtype=dtype, device=device, max_len=max_len + config.num_speculative_tokens + 1,
                                  initial_slots=initial_slots, target_dir=target_dir)
        self._drafts = drafts
        self._failed: set[str] = set()
        self._states = StateIndex()
        self._lock = threading.Lock()  #: held by propose, the readers and close (module docstring)
        self._clock = clock
        self._sized: set[str] = set()  # drafts whose weight size the controller knows
        self._last_return: float | None = None
        self._last_start: float | None = None  #: start of the last call (a cycle runs start to start)
        self._last_drafted = 0  #: draft tokens proposed last call (the target step since verified them)
        self._last_rows = 0  #: requests that decoded in the last step
        self._last_log = clock()
        self.num_steps = 0
        self.propose_seconds = 0.0  #: total time spent in propose (all drafting overhead)

    @classmethod
    def for_target(cls, config: DraftConfig | str | Path, target: DraftTarget, *,
                   detokenize: Callable[[Sequence[int]], str], logger: logging.Logger | None = None,
                   initial_slots: int = 8, clock: Callable[[], float] | None = None,
                   extra_issues: Sequence[ConfigIssue] = ()) -> DomainProposer:
        """The proposer of ``config`` (a loaded config, or the YAML's path) for ``target``.

        Checks the config against the target (:meth:`DraftTarget.issues`) and raises
        one :class:`DraftConfigError` with ``extra_issues`` (the adapter's own, first)
        and those; resolves ``dtype: auto`` to the target's dtype; gives the controller
        the target's weight bytes, counted from its checkpoint (frameworks may repack
        weights out of ``parameters()``). The drafts are not loaded: call :meth:`load`.
        A subclass (a third-party proposer from the registry) is built by its own
        ``__init__`` with the same arguments.
        """
        from .draft_format import checkpoint_parameters

        if not isinstance(config, DraftConfig):
            config = load_draft_config(config)
        issues = [*extra_issues, *target.issues(config)]
        if issues:
            raise DraftConfigError(issues)
        dtype = target.dtype if config.dtype == "auto" else getattr(torch, config.dtype)
        params = checkpoint_parameters(target.model_dir)
        return cls(
            config, detokenize, max_len=target.max_len, dtype=dtype, device=target.device,
            initial_slots=initial_slots, clock=clock or time.perf_counter, logger=logger,
            target_bytes=params * target.dtype.itemsize if params else None, target_dir=str(target.model_dir),
        )

    def load(self) -> None:
        """Load every draft model now (start-up) rather than at first use."""
        for draft in set(self._drafts.values()):
            if draft is not None:
                self.engine.load(draft)

    # ------------------------------------------------------------------ states

    def _match(self, row: int, key, token_ids, claimed: set[RequestState]) -> RequestState | None:
        return self._states.find(row, key, token_ids, claimed)  # (why the key holds the length: StateIndex.find)

    def _new_state(self, row: int, token_ids, num_tokens: int, num_sampled: int,
                   request_id: Hashable | None) -> RequestState:
        # a copy, once per request: the framework reuses its buffer when rows move
        tokens = np.asarray(token_ids[row, :num_tokens], dtype=np.int64)
        prompt = tokens[: max(1, num_tokens - num_sampled)]
        domain = self.router.route_tokens(prompt, self.detokenize)
        state = RequestState.start(domain, tokens, request_id=request_id)
        self._states.add(state)
        return state

    def _free(self, state: RequestState) -> None:
        if state.cache is not None:
            self.engine.free_cache(state.cache)
            state.cache = None

    @property
    def num_states(self) -> int:
        with self._lock:
            return len(self._states)

    @property
    def draft_kv_bytes(self) -> int:
        """Bytes held by the draft models' KV caches now (every loaded draft); cheap."""
        with self._lock:
            return sum(model.kv_bytes for model in self.engine.models.values())

    # ----------------------------------------------------------------- propose

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens: np.ndarray, token_ids, *,
                request_ids: Sequence[Hashable] | None = None) -> list[list[int]]:
        """Drafts per row (``[]`` = none); see the module docstring for the arguments.

        ``token_ids`` is a 2-D token array (vLLM's ``token_ids_cpu``) or anything
        indexed as ``token_ids[i, start:stop]`` (:class:`.token_rows.TokenRows`) when
        ``request_ids`` (one per row) are given: then only a known request's new
        tokens and a new request's whole row are read.
        """
        with self._lock:
            return self._propose(sampled_token_ids, num_tokens, token_ids, request_ids)

    def _propose(self, sampled_token_ids, num_tokens, token_ids, request_ids) -> list[list[int]]:
        start = self._clock()
        self.num_steps += 1
        num_rows = len(sampled_token_ids)
        if request_ids is not None and len(request_ids) != num_rows:
            raise ValueError(f"request_ids has {len(request_ids)} ids for {num_rows} rows; give one per row")
        out: list[list[int]] = [[] for _ in range(num_rows)]
        lengths = np.asarray(num_tokens[:num_rows], dtype=np.int64)
        sampled_counts = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=num_rows)
        known = np.maximum(lengths - sampled_counts, 0)  # the tokens of a row its state holds
        keys = after = None
        if request_ids is None:  # one gather: the keys of the rows now and of their states after this step
            both = np.arange(num_rows)
            keys = row_keys(token_ids, np.concatenate([both, both]), np.concatenate([known, lengths]))
            keys, after = keys[:num_rows], keys[num_rows:]
        claimed: set[RequestState] = set()
        rows: list[tuple[int, RequestState]] = []
        prefilled, joined = False, 0  # the target step since the last call ran a prompt (or part); new rows
        for i in range(num_rows):
            n, num_sampled, have = int(lengths[i]), int(sampled_counts[i]), int(known[i])
            if request_ids is None:
                state = self._match(i, keys[i], token_ids, claimed)
            else:
                state = self._states.find_request(request_ids[i], have, claimed)
            if state is None:
                prefilled = True
                if not num_sampled:
                    continue  # a prompt still being prefilled in chunks
                state = self._new_state(i, token_ids, n, num_sampled,
                                        None if request_ids is None else request_ids[i])
                joined += 1
            elif num_sampled:
                self._learn(state, token_ids[i, have:n], num_sampled)
            if after is not None:
                state.key = after[i]  # its context is now the row's n tokens
            claimed.add(state)
            state.row = i
            if num_sampled:
                rows.append((i, state))

        for state in self._states.keep_only(claimed):
            self._free(state)

        if self._last_return is not None:
            # a step with a prefill, or after an idle engine, is no decoding step's time
            timed = bool(rows) and self._last_rows > 0 and not prefilled
            self.controller.record_step(start - self._last_return if timed else None, len(rows), self._last_drafted)
            self.controller.record_cycle(start - self._last_start if timed else None, len(rows),
                                         sum(int(sampled_counts[i]) for i, _ in rows), self._last_drafted)
        self.controller.gate.record_rows({id(s): int(sampled_counts[i]) for i, s in rows}, joined)
        t_lookup = self._clock()
        matched = self.lookup.match_rows(rows) if LOOKUP_DRAFT not in self._failed else {}
        lookup_seconds = self._clock() - t_lookup
        # a matched row counts under its lookup entry unless that is off and a draft serves it (seen all the same)
        entries = [lookup_entry(s.domain) if i in matched and (self._drafts[s.domain] is None or self.controller.state(
            lookup_entry(s.domain), len(rows))[0] != DomainState.OFF) else s.domain for i, s in rows]
        seen_domains = {s.domain for _, s in rows} | {lookup_entry(s.domain) for i, s in rows if i in matched}
        self.controller.step(len(rows), seen_domains, entries)
        jobs_by_draft: dict[str, list[tuple[int, RequestState, DraftJob]]] = {}
        lookup_rows = lookup_k = 0
        for i, state in rows:
            draft = self._drafts[state.domain]
            state.last_drafts, state.drafter, state.offer = (), None, None
            if i in matched:  # prompt lookup first (its probes too); the draft model if it drafts nothing
                t0 = self._clock()
                out[i] = self.lookup.draft(state, matched[i], self.controller, self.max_len)
                lookup_seconds += self._clock() - t0
                if out[i]:
                    lookup_rows, lookup_k = lookup_rows + 1, max(lookup_k, len(out[i]))
                    continue
            k = self.controller.k_for(state.domain) if draft is not None and draft not in self._failed else 0
            k = min(k, self.max_len - len(state.context))
            if k <= 0:
                continue
            if state.cache is None:
                try:
                    state.cache = self.engine.new_cache(draft)
                except Exception as exc:  # noqa: BLE001 - any failure switches the draft off
                    self._fail(draft, exc)
                    continue
            jobs_by_draft.setdefault(draft, []).append((i, state, DraftJob(state.cache, state.context, k)))
        self.controller.end_step(seen_domains)
        if lookup_rows:  # its c: host time per drafted position, as a draft model's per forward
            self.controller.record_draft(LOOKUP_DRAFT, lookup_rows, lookup_seconds / lookup_k)

        draft_seconds = 0.0  # wall time in the draft models, this call
        for draft, entries in jobs_by_draft.items():
            if draft in self._failed:
                continue
            try:
                t0 = self._clock()
                result = self.engine.draft(draft, [job for _, _, job in entries])
                draft_seconds += self._clock() - t0
            except Exception as exc:  # noqa: BLE001 - a draft failure must not stop serving
                self._fail(draft, exc)
                continue
            self._tell_size(draft)
            if result.rounds:
                self.controller.record_draft(draft, len(entries), result.seconds / result.rounds)
            for (i, state, _), drafts in zip(entries, result.drafts):
                out[i] = drafts
                state.last_drafts = tuple(drafts)

        self._maybe_log()
        self._last_drafted = sum(map(len, out))
        self._last_rows = len(rows)
        self._last_return, self._last_start = self._clock(), start
        self.propose_seconds += self._last_return - start
        self.controller.record_call(len(rows), self._last_return - start, draft_seconds, self._last_drafted)
        return out

    def _learn(self, state: RequestState, new: np.ndarray, num_sampled: int) -> None:
        """Compare last step's drafts with ``new``, the tokens the target kept; move the context on."""
        if state.last_drafts:
            limit = min(len(state.last_drafts), max(0, num_sampled - 1), len(new))
            accepted = 0
            while accepted < limit and int(new[accepted]) == state.last_drafts[accepted]:
                accepted += 1
            self.controller.observe(state.drafter or state.domain, len(state.last_drafts), accepted, state.offer)
        state.extend(new)
        if state.shadows:
            self.lookup.follow(state, self.controller.observe_lookup)

    def _tell_size(self, draft: str) -> None:
        """Give the controller the weight bytes one forward of ``draft`` reads (once)."""
        if draft in self._sized or draft not in self.engine.models:
            return
        self._sized.add(draft)
        self.controller.set_draft_bytes(draft, int(self.engine.models[draft].forward_bytes))

    def _fail(self, draft: str, exc: BaseException) -> None:
        self._failed.add(draft)
        domains = self.controller.fail(draft, f"{type(exc).__name__}: {exc}")
        self.logger.error(
            "draft model %s failed (%s: %s); speculation is off for domain(s) %s, "
            "which continue with plain decoding",
            draft, type(exc).__name__, exc, ", ".join(domains), exc_info=exc,
        )
        for state in self._states:
            if state.cache is not None and state.cache.draft == draft:
                state.cache = None
            if self._drafts.get(state.domain) == draft:
                state.last_drafts = ()
        self.engine.unload(draft)
        if isinstance(exc, torch.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ reading

    def stats(self, *, by_bucket: bool = True) -> dict[str, DomainStats]:
        """Per-domain counters; ``by_bucket=False``: without the per-bucket costs (the live metrics' periodic read)."""
        with self._lock:
            return self.controller.stats(by_bucket=by_bucket)

    def counters(self) -> dict[str, DomainCounters]:
        """:meth:`.DomainController.counters`: the cheap per-step read of the live metrics."""
        with self._lock:
            return self.controller.counters()

    def stats_dict(self) -> dict[str, dict]:
        """:meth:`stats` as plain dicts (JSON-able), with the derived rates and the
        proposer's own time per step: what the adapters report per domain."""
        with self._lock:
            stats = self.controller.stats()
            propose_ms = 1e3 * self.propose_seconds / self.num_steps if self.num_steps else None
        return {
            name: {**asdict(s), "acceptance_rate": s.acceptance_rate,
                   "mean_acceptance_length": s.mean_acceptance_length, "propose_ms_per_step": propose_ms}
            for name, s in stats.items()
        }

    def step_stats(self) -> dict[int, dict]:
        """Per batch bucket (1, 2, 4, 8, ...): the step gate's verdict and the step model,
        JSON-able: ``gate`` (``on``, ``off`` or ``warmup``), ``predicted_speedup`` (median
        S_step of its drafting steps), ``measured_speedup`` (median of the paired cycle
        samples in the gate's window), ``samples`` (all so far), ``plain_step_ms`` and
        ``cycle_ms`` (median plain and drafting cycle, start of one ``propose`` call to
        the next), ``draft_ms`` and ``host_ms`` (median per drafting call: in the draft
        models, and the rest of ``propose``), ``steps``, and ``mixes``: per domain mix of the
        bucket's steps (``code+support``; ``-``: none that drafts) its own ``gate``,
        ``measured_speedup``, ``samples``, ``steps``, ``tail_factor``, ``whole_speedup``
        (whole batches, :mod:`.episodes`) and ``inherited`` (the bucket whose off verdict it
        started with: a smaller one, or its own where each of its domains alone was off); the
        gate decides per mix, ``gate`` above reads ``per-mix`` where they disagree; ``None``
        where not measured."""
        with self._lock:
            return self.controller.step_stats()

    def _maybe_log(self) -> None:
        interval = self.config.controller.log_interval_s
        now = self._clock()
        if interval and now - self._last_log >= interval:
            self._last_log = now
            self.logger.info("speculation: %s", self.controller.summary())

    def close(self) -> None:
        """Free every state and its draft KV slot; log the final counters."""
        with self._lock:
            for state in self._states.keep_only(()):
                self._free(state)
            self.logger.info("speculation (final): %s", self.controller.summary())

