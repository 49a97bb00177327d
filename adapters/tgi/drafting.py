"""The step logic of draft-model speculation in TGI: the domain proposer fills ``batch.speculative_ids``.

TGI (v3.3.7) verifies whatever ``batch.speculative_ids`` (int64 ``[B, W]``) holds when
``get_speculate() > 0`` (``--speculate N``): ``FlashCausalLM.forward`` runs ``W + 1``
query rows per request, and ``HeterogeneousNextTokenChooser`` keeps the longest
prefix of drafts equal to what the target chooses (exact for greedy and sampling).
TGI fills the ids itself with n-gram (or Medusa) proposals; this module replaces
them with the drafts of the framework-neutral domain proposer (the one the accel
plugins offer to ``"tgi"``, by default ``ACCEL_DOMAIN_DRAFT``: same YAML, router,
controller and counters as under vLLM).

Per model (:func:`.speculative.attach`, called when ``FlashCausalLM.__init__`` returns):
``ACCEL_DRAFT_CONFIG`` is read and checked against the target (vocabulary,
tokenizer; ``num_speculative_tokens`` <= ``--speculate``), the drafts are loaded
(before TGI's warm-up sizes the KV cache), and the wrapped ``generate_token``
(:func:`._wrappers.wrap_generate_token`) then does, around TGI's own:

- **decode step** (the batch is not prefilling): after TGI's step returns
  ``(generations, next_batch, timings)``, row ``i`` of ``next_batch`` has
  ``cache_lengths_tensor[i] + 1`` verified tokens in ``all_input_ids_tensor[i]``
  (the last one is ``input_ids[i]``, sampled but not yet in the KV cache). Rows that
  stopped in this step (a ``Generation`` with ``generated_text``) are left out: the
  router filters them before the next step. The others go to ``propose`` with their
  request ids and the tokens each gained since the proposer last saw it (all
  generated tokens for a request it has not seen). Only those ids are copied to the
  host (one gather on the device), and a request's whole row only once, when the
  proposer first sees it: the host work of a step does not grow with the context. Drafts are padded to the widest row ``W`` (<= N; TGI
  reads the width from the tensor, and every row is verified at that width); no
  drafts at all give ``speculative_ids = None``: a plain step.
- **prefill** (a new batch, prefilled alone; speculation turns TGI's chunking off):
  ``speculative_ids = None``. The router then concatenates it with the running
  batch, and ``concatenate`` keeps ids only when every batch has them, so the
  merged batch's first step is plain and its new rows reach the proposer at the
  step after, with their whole prompt known. ``concatenate`` sizes
  ``all_input_ids_tensor`` by the batches' widths at that moment, so a decode step
  first widens it back (:func:`._tgi.make_room`).

Timing. The proposer times the target step as the interval between two of its
calls. Under TGI a prefill of another batch can run in that interval, so the
proposer's clock (:class:`PausableClock`) stops while a prefill runs; the step
after a join is untimed anyway (it has rows the proposer has not seen). Router,
gRPC and filter time stay in: they are paid per step, like the forward.

Counters: the proposer's per domain (:func:`.speculative.collect_stats`, logged every
``controller.log_interval_s`` through TGI's logger) count real drafts only; TGI's
view of the same steps (verified width, accepted drafts and pads) is in
:class:`StepCounters`. A draft model that raises switches its domains off in the
proposer; anything else that raises here switches speculation off for the model,
logged once; TGI keeps serving either way.
"""


from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from accel_plugin.speculative.token_rows import TokenRows

from ._loguru import proposer_logger
from ._tgi import get_speculate, make_room

__all__ = ["PausableClock", "StepCounters", "TGIDraftSpeculation"]


def _read_rows(batch, rows: list[int], starts: list[int], num_tokens: np.ndarray) -> TokenRows:
    """The tokens the proposer reads, copied to the host in at most two transfers:
    ``all_input_ids_tensor[rows[j], starts[j]:num_tokens[j]]`` of a request it has
    seen (the tokens since), the whole row of one it has not (``starts[j] < 0``)."""
    import torch

    all_ids = batch.all_input_ids_tensor
    out: dict[int, tuple[int, np.ndarray]] = {}
    fresh = [j for j, start in enumerate(starts) if start < 0]
    if fresh:  # once per request: its prompt and what it generated before it joined
        width = int(max(num_tokens[j] for j in fresh))
        block = all_ids[[rows[j] for j in fresh], :width].cpu().numpy()
        out.update({j: (0, block[r, : int(num_tokens[j])]) for r, j in enumerate(fresh)})
    seen = [j for j, start in enumerate(starts) if start >= 0]
    if seen:  # the new ids only: one gather on the device of [rows, widest gain], indices built on the host
        start = np.array([starts[j] for j in seen], dtype=np.int64)
        gain = num_tokens[seen] - start
        width = max(1, int(gain.max()))
        cols = np.minimum(start[:, None] + np.arange(width), all_ids.shape[1] - 1)
        flat = np.array([rows[j] for j in seen], dtype=np.int64)[:, None] * all_ids.shape[1] + cols
        block = torch.take(all_ids, torch.from_numpy(flat).to(all_ids.device)).cpu().numpy()
        out.update({j: (starts[j], block[r, : int(gain[r])]) for r, j in enumerate(seen)})
    return TokenRows(out)


class PausableClock:
    """``time.perf_counter`` that does not advance while paused (prefills of other batches)."""

    def __init__(self) -> None:
        self._paused = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self._paused

    def pause(self, seconds: float) -> None:
        self._paused += max(0.0, seconds)


@dataclass
class StepCounters:
    """TGI's side of the speculation of one model (all rows, pads included)."""

    decode_steps: int = 0  #: decode calls of generate_token
    prefills: int = 0  #: prefill calls (not timed by the proposer)
    verify_steps: int = 0  #: decode steps that verified drafts (speculative_ids set)
    verified_tokens: int = 0  #: width x rows, summed over those steps: what TGI verified
    draft_tokens: int = 0  #: real drafts handed to TGI
    pad_tokens: int = 0  #: pads (rows whose domain drafted fewer than the widest row)
    accepted: int = 0  #: real drafts TGI accepted (rows that went on; TGI's own count)
    pad_accepted: int = 0  #: pads TGI accepted (free tokens: the target chose the pad)


class TGIDraftSpeculation:
    """The domain proposer of one TGI model, and the step logic around TGI's ``generate_token``."""

    def __init__(self, model, *, config, config_path: str, num_speculative_tokens: int, proposer_name: str,
                 core, clock: PausableClock) -> None:
        self.config = config
        self.config_path = config_path
        self.num_speculative_tokens = num_speculative_tokens  #: TGI's --speculate at start-up
        self.proposer_name = proposer_name
        self.core = core
        self.clock = clock  #: the proposer's clock (paused during prefills)
        self.counters = StepCounters()
        self.error: str | None = None  #: set when speculation was switched off for this model
        #: False: TGI's own proposals (n-gram) until set again, e.g. to compare both in one process
        self.enabled = True
        self._model = weakref.ref(model)
        #: request id -> tokens the proposer saw at the last call: the next reads only those after
        self._seen: dict[int, int] = {}
        self._last_k: dict[int, int] = {}  #: request id -> real drafts of the last step
        #: the target's prepacked copies (:mod:`.packed_linears`), dropped by ``speculative.detach``
        self.packing = None

    # ------------------------------------------------------------------ steps

    def step(self, original: Callable, model, batch) -> tuple:
        """TGI's ``generate_token(batch)``, then drafts for ``next_batch``."""
        if getattr(batch, "prefilling", False):
            for request in batch.requests:  # new requests (an id may come back in an in-process loop)
                self._seen.pop(request.id, None)
            start = time.perf_counter()
            try:
                generations, next_batch, timings = original(model, batch)
            finally:
                self.clock.pause(time.perf_counter() - start)
            self.counters.prefills += 1
            if next_batch is not None:
                next_batch.speculative_ids = None  # TGI's n-gram ids: a plain first step (see module doc)
            return generations, next_batch, timings
        make_room(batch)
        verifying = batch.speculative_ids
        generations, next_batch, timings = original(model, batch)
        self.counters.decode_steps += 1
        if verifying is not None:
            self._count_verified(int(verifying.shape[1]), len(batch), generations)
        if next_batch is not None:
            next_batch.speculative_ids = None if self.error else self._safe_propose(next_batch, generations)
        return generations, next_batch, timings

    def _count_verified(self, width: int, rows: int, generations) -> None:
        c = self.counters
        c.verify_steps += 1
        c.verified_tokens += width * rows
        for generation in generations:
            if generation.generated_text is not None:
                continue  # stopped: TGI cut its tokens at the stop
            extra = len(generation.tokens.token_ids) - 1
            k = self._last_k.get(generation.request_id, 0)
            c.accepted += min(extra, k)
            c.pad_accepted += max(0, extra - k)

    def _safe_propose(self, batch, generations):
        try:
            return self._propose(batch, generations)
        except Exception as exc:  # noqa: BLE001 - speculation must never stop serving
            self.error = f"{type(exc).__name__}: {exc}"
            proposer_logger().error("accel-plugin: draft-model speculation failed (%s); it is off for this model, "
                            "which continues with plain decoding", self.error, exc_info=exc)
            return None

    def _propose(self, batch, generations):
        """``speculative_ids`` for ``batch`` (``[B, W]`` int64 on its device) or ``None``."""
        import torch

        limit = min(get_speculate(), self.num_speculative_tokens)
        stopped = {g.request_id for g in generations if g.generated_text is not None}
        requests = batch.requests
        rows = [i for i, r in enumerate(requests) if r.id not in stopped]
        self._last_k = {}
        if not rows or limit <= 0:
            self._seen = {}
            return None
        # one transfer: the verified lengths (the last sampled token included) and the last ids (the pads)
        lengths, last_ids = torch.stack([batch.cache_lengths_tensor.to(torch.int64) + 1,
                                         batch.input_ids.to(torch.int64)]).cpu().numpy()
        num_tokens = lengths[rows]
        ids = [requests[i].id for i in rows]
        starts = [self._seen.get(rid, -1) for rid in ids]  # -1: a request the proposer has not seen
        token_rows = _read_rows(batch, rows, starts, num_tokens)
        sampled = []
        for j, i in enumerate(rows):
            start = starts[j] if starts[j] >= 0 else int(batch.prompt_lengths[i])
            sampled.append(token_rows[j, start:int(num_tokens[j])].tolist())
        self._seen = dict(zip(ids, num_tokens.tolist()))
        drafts = self.core.propose(sampled, num_tokens, token_rows, request_ids=ids)
        width = min(max(map(len, drafts)), limit)
        if width == 0:
            return None
        # Any id is correct as a pad (TGI verifies exactly); a pad the target happens to
        # choose is a free token, counted apart from the drafts (StepCounters.pad_accepted).
        out = [[pad] * width for pad in last_ids.tolist()]  # rows left out or without drafts: pads only
        for j, i in enumerate(rows):
            row = drafts[j][:width]
            if row:
                out[i] = [*row, *[row[-1]] * (width - len(row))]
            self._last_k[requests[i].id] = len(row)
        real = sum(self._last_k.values())
        self.counters.draft_tokens += real
        self.counters.pad_tokens += width * len(requests) - real
        return torch.tensor(out, dtype=torch.int64, device=batch.input_ids.device)  # one copy to the device

    # ---------------------------------------------------------------- reading

    def stats(self) -> dict[str, dict]:
        """Per-domain counters of the proposer, as plain dicts (the vLLM adapter's format)."""
        return self.core.stats_dict()

    def close(self) -> None:
        close = getattr(self.core, "close", None)
        if close is not None:
            close()
