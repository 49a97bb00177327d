"""Draft-model speculation inside TGI: the domain proposer fills ``batch.speculative_ids``.

TGI (v3.3.7) verifies whatever ``batch.speculative_ids`` (int64 ``[B, W]``) holds when
``get_speculate() > 0`` (``--speculate N``): ``FlashCausalLM.forward`` runs ``W + 1``
query rows per request, and ``HeterogeneousNextTokenChooser`` keeps the longest
prefix of drafts equal to what the target chooses (exact for greedy and sampling).
TGI fills the ids itself with n-gram (or Medusa) proposals; this module replaces
them with the drafts of the framework-neutral domain proposer (the one the accel
plugins offer to ``"tgi"``, by default ``ACCEL_DOMAIN_DRAFT``: same YAML, router,
controller and counters as under vLLM).

Per model (:func:`attach`, called when ``FlashCausalLM.__init__`` returns):
``ACCEL_DRAFT_CONFIG`` is read and checked against the target (vocabulary,
tokenizer; ``num_speculative_tokens`` <= ``--speculate``), the drafts are loaded
(before TGI's warm-up sizes the KV cache), and the wrapped ``generate_token``
(:func:`wrap_generate_token`) then does, around TGI's own:

- **decode step** (the batch is not prefilling): after TGI's step returns
  ``(generations, next_batch, timings)``, row ``i`` of ``next_batch`` has
  ``cache_lengths_tensor[i] + 1`` verified tokens in ``all_input_ids_tensor[i]``
  (the last one is ``input_ids[i]``, sampled but not yet in the KV cache). Rows that
  stopped in this step (a ``Generation`` with ``generated_text``) are left out: the
  router filters them before the next step. The others go to ``propose`` with the
  tokens each gained since the proposer last saw it (all generated tokens for a
  request it has not seen). Drafts are padded to the widest row ``W`` (<= N; TGI
  reads the width from the tensor, and every row is verified at that width); no
  drafts at all give ``speculative_ids = None``: a plain step.
- **prefill** (a new batch, prefilled alone; speculation turns TGI's chunking off):
  ``speculative_ids = None``. The router then concatenates it with the running
  batch, and ``concatenate`` keeps ids only when every batch has them, so the
  merged batch's first step is plain and its new rows reach the proposer at the
  step after, with their whole prompt known. ``concatenate`` sizes
  ``all_input_ids_tensor`` by the batches' widths at that moment, so a decode step
  first widens it back (:func:`_make_room`).

Timing. The proposer times the target step as the interval between two of its
calls. Under TGI a prefill of another batch can run in that interval, so the
proposer's clock (:class:`PausableClock`) stops while a prefill runs; the step
after a join is untimed anyway (it has rows the proposer has not seen). Router,
gRPC and filter time stay in: they are paid per step, like the forward.

Counters: the proposer's per domain (:func:`collect_stats`, logged every
``controller.log_interval_s`` through TGI's logger) count real drafts only; TGI's
view of the same steps (verified width, accepted drafts and pads) is in
:class:`StepCounters`. A draft model that raises switches its domains off in the
proposer; anything else that raises here switches speculation off for the model,
logged once; TGI keeps serving either way.
"""

from __future__ import annotations

import functools
import logging
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MODEL_ATTR",
    "PausableClock",
    "SpeculationConfigError",
    "StepCounters",
    "TGIDraftSpeculation",
    "attach",
    "collect_stats",
    "detach",
    "detach_all",
    "live",
    "of",
    "with_full_max_k",
    "wrap_generate_token",
    "wrap_init",
]

#: The attribute of a FlashCausalLM instance that holds its :class:`TGIDraftSpeculation`.
MODEL_ATTR = "_accel_draft_speculation"
LOGGER_NAME = "text_generation_server.accel_plugin.speculative"

_LIVE: weakref.WeakSet = weakref.WeakSet()


class SpeculationConfigError(ValueError):
    """Draft-model speculation cannot run with this TGI configuration (names the setting)."""


# ------------------------------------------------------------------- TGI details
# (TGI v3.3.7; with the attention details in _compat.py)


def get_speculate() -> int:
    """TGI's ``--speculate`` (``utils/speculate.py``; 0 when not given)."""
    from text_generation_server.utils.speculate import (
        get_speculate as tgi_get_speculate,
    )

    return int(tgi_get_speculate() or 0)


def _target_dir(model) -> str:
    """The target's local directory: TGI keeps the ``--model-id`` as given (a hub id or a path)."""
    model_id = str(model.model_id)
    if Path(model_id).is_dir():
        return model_id
    from huggingface_hub import snapshot_download

    return snapshot_download(model_id, local_files_only=True)


def _make_room(batch) -> None:
    """Widen ``all_input_ids_tensor`` to ``prompt + max_new_tokens + --speculate`` per row.

    ``FlashCausalLMBatch.from_pb`` sizes it so, but ``concatenate`` sizes it by each
    batch's speculative width at that moment (0 without ids): after a join with our
    ``None`` (or a width below N), a later step that accepts drafts near a request's
    ``max_new_tokens`` would write past its end (``generate_token`` raises). TGI's
    n-gram always has width N, so TGI never meets this.
    """
    import torch

    need = max(p + s.max_new_tokens for p, s in zip(batch.prompt_lengths, batch.stopping_criterias)) + get_speculate()
    have = batch.all_input_ids_tensor.shape[1]
    if have < need:
        batch.all_input_ids_tensor = torch.nn.functional.pad(batch.all_input_ids_tensor, (0, need - have))


def _check_model(model) -> None:
    """Refuse targets whose batches or heads this adapter does not drive."""
    batch_type = getattr(model, "batch_type", None)
    if getattr(batch_type, "__name__", None) != "FlashCausalLMBatch":
        raise SpeculationConfigError(
            f"accel-plugin's draft-model speculation drives text-only FlashCausalLM models; "
            f"{type(model).__name__} batches are {getattr(batch_type, '__name__', batch_type)}; "
            "unset ACCEL_DRAFT_CONFIG for this model")
    if getattr(getattr(model.model, "lm_head", None), "speculator", None) is not None:
        raise SpeculationConfigError(
            "the target has TGI speculator heads (Medusa or MLP speculator), which propose their own "
            "tokens; use a plain target with ACCEL_DRAFT_CONFIG, or unset ACCEL_DRAFT_CONFIG")
    if int(getattr(model, "world_size", 1)) != 1:
        raise SpeculationConfigError(
            f"accel-plugin's draft-model speculation runs in one shard only (every shard would have to "
            f"draft identically); got {model.world_size} shards: use --num-shard 1 or unset ACCEL_DRAFT_CONFIG")


# ------------------------------------------------------------------- small parts


class PausableClock:
    """``time.perf_counter`` that does not advance while paused (prefills of other batches)."""

    def __init__(self) -> None:
        self._paused = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self._paused

    def pause(self, seconds: float) -> None:
        self._paused += max(0.0, seconds)


class _ToLoguru(logging.Handler):
    """Hands the proposer's stdlib records (%-style) to TGI's loguru logger."""

    def emit(self, record: logging.LogRecord) -> None:
        from . import _compat

        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format must not break a step
            self.handleError(record)
            return
        log = _compat.logger().patch(
            lambda r: r.update(function=record.funcName, line=record.lineno, module=record.module))
        if record.exc_info:
            log = log.opt(exception=record.exc_info)
        log.log(record.levelname, message)


def _logger() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _ToLoguru) for h in logger.handlers):
        logger.addHandler(_ToLoguru())
        logger.setLevel(logging.DEBUG)  # loguru's sink (TGI's --logger-level) filters
        logger.propagate = False
    return logger


def _yaml_line(path: str | Path, key: str) -> int | None:
    """1-based line of a top-level ``key:`` in the YAML file (for messages)."""
    try:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if re.match(rf"{re.escape(key)}\s*:", line):
                return number
    except OSError:
        pass
    return None


def _core_proposer() -> tuple[str, type]:
    """(name, class) of the proposer the accel plugins offer to TGI (the registry's)."""
    from accel_plugin.plugins.manager import NoProposerError, process_plugins

    from . import FRAMEWORK

    try:
        return process_plugins().proposer(FRAMEWORK, display="TGI")
    except NoProposerError as exc:
        raise SpeculationConfigError(f"{exc}, or unset ACCEL_DRAFT_CONFIG") from None


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
        self._seen: dict[int, int] = {}  #: request id -> tokens the proposer saw at the last call
        self._last_k: dict[int, int] = {}  #: request id -> real drafts of the last step

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
        _make_room(batch)
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
            _logger().error("accel-plugin: draft-model speculation failed (%s); it is off for this model, "
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
        lengths = (batch.cache_lengths_tensor + 1).tolist()  # verified tokens, the last sampled one included
        # a copy (indexing by rows): the proposer keeps no view of TGI's tensor
        token_ids = batch.all_input_ids_tensor[rows, : max(lengths[i] for i in rows)].cpu().numpy()
        num_tokens = np.array([lengths[i] for i in rows], dtype=np.int64)
        sampled, seen = [], {}
        for j, i in enumerate(rows):
            rid, n = requests[i].id, int(num_tokens[j])
            start = self._seen.get(rid, int(batch.prompt_lengths[i]))
            sampled.append(token_ids[j, start:n].tolist())
            seen[rid] = n
        self._seen = seen
        drafts = self.core.propose(sampled, num_tokens, token_ids)
        width = min(max(map(len, drafts)), limit)
        if width == 0:
            return None
        # Any id is correct as a pad (TGI verifies exactly); a pad the target happens to
        # choose is a free token, counted apart from the drafts (StepCounters.pad_accepted).
        out = np.repeat(np.asarray(batch.input_ids.tolist(), dtype=np.int64)[:, None], width, axis=1)
        for j, i in enumerate(rows):
            row = list(drafts[j][:width])
            if row:
                out[i, : len(row)] = row
                out[i, len(row):] = row[-1]
            self._last_k[requests[i].id] = len(row)
        real = sum(self._last_k.values())
        self.counters.draft_tokens += real
        self.counters.pad_tokens += width * len(requests) - real
        return torch.from_numpy(out).to(batch.input_ids.device)

    # ---------------------------------------------------------------- reading

    def stats(self) -> dict[str, dict]:
        """Per-domain counters of the proposer, as plain dicts (the vLLM adapter's format)."""
        core = self.core
        steps = getattr(core, "num_steps", 0)
        propose_ms = 1e3 * core.propose_seconds / steps if steps else None
        out = {}
        for name, s in core.stats().items():
            out[name] = {**asdict(s), "acceptance_rate": s.acceptance_rate,
                         "mean_acceptance_length": s.mean_acceptance_length, "propose_ms_per_step": propose_ms}
        return out

    def close(self) -> None:
        close = getattr(self.core, "close", None)
        if close is not None:
            close()


# --------------------------------------------------------------------- per model


def attach(model, config_path: str | None = None) -> TGIDraftSpeculation | None:
    """Build the domain proposer for a TGI ``FlashCausalLM`` (``None`` without a config).

    ``config_path`` defaults to ``ACCEL_DRAFT_CONFIG``. Raises
    :class:`accel_plugin.speculative.draft_config.schema.DraftConfigError` (the YAML, against the target) or
    :class:`SpeculationConfigError` (TGI's settings: ``--speculate``, the model kind).
    Applies the generate_token patch, and the ``Seqlen.max_k`` workaround while
    TGI's own attention is in use (see :mod:`._patches`).
    """
    from accel_plugin import envs
    from accel_plugin.speculative.draft_config.schema import ConfigIssue, DraftConfigError, check_against_target, load_draft_config

    from . import _compat, _patches

    path = config_path or envs.draft_config_path()
    if path is None:
        return None
    speculate = get_speculate()
    config = load_draft_config(path)
    if speculate <= 0:
        raise SpeculationConfigError(
            f"{envs.ACCEL_DRAFT_CONFIG}={path} asks for draft-model speculation, but TGI runs without "
            f"speculation (--speculate is 0 or not given): start TGI with --speculate "
            f"{config.num_speculative_tokens} (the YAML's num_speculative_tokens), or unset {envs.ACCEL_DRAFT_CONFIG}")
    _check_model(model)
    target = _target_dir(model)
    issues = []
    if config.num_speculative_tokens > speculate:
        issues.append(ConfigIssue(
            "num_speculative_tokens",
            f"{config.num_speculative_tokens} exceeds TGI's --speculate {speculate} (the most draft tokens TGI "
            f"verifies per request and step); lower num_speculative_tokens to {speculate} or start TGI with "
            f"--speculate {config.num_speculative_tokens}", str(path), _yaml_line(path, "num_speculative_tokens")))
    try:
        # TGI keeps no --trust-remote-code on the model: the target's tokenizer files are read without it
        check_against_target(config, target, tokenizer_dir=target, target_trust_remote_code=False)
    except DraftConfigError as exc:
        issues.extend(exc.issues)
    if issues:
        raise DraftConfigError(issues)

    import torch

    detach(model)
    dtype = model.dtype if config.dtype == "auto" else getattr(torch, config.dtype)
    tokenizer = model.tokenizer
    clock = PausableClock()
    proposer_name, proposer_cls = _core_proposer()
    core = proposer_cls(
        config,
        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        max_len=int(getattr(model.config, "max_position_embeddings", 4096) or 4096),
        dtype=dtype, device=model.device, initial_slots=8, clock=clock, logger=_logger(), target_dir=target,
    )
    from accel_plugin.speculative.draft_format import checkpoint_parameters

    params = checkpoint_parameters(target)
    if params and hasattr(core, "controller"):
        core.controller.set_target_bytes(params * model.dtype.itemsize)
    core.load()  # before TGI's warm-up measures the free memory for its KV cache
    spec = TGIDraftSpeculation(model, config=config, config_path=str(path), num_speculative_tokens=speculate,
                               proposer_name=proposer_name, core=core, clock=clock)
    _patches.apply(_patches.SPECULATION_PATCHES)
    max_k = ""
    if not _patches.ATTENTION_FUNCTIONS.applied:
        _patches.apply((_patches.SEQLEN_MAX_K,))
        max_k = "; TGI's Seqlen.max_k workaround applied (TGI's own attention)"
    setattr(model, MODEL_ATTR, spec)
    _LIVE.add(spec)
    domains = ", ".join(f"{d}->{p or 'none'}" for d, p in config.drafts().items())
    _compat.logger().info(
        f"accel-plugin: draft-model speculation ({proposer_name}) replaces TGI's n-gram proposals: config {path}, "
        f"domains {domains}, "
        f"k_max {config.num_speculative_tokens} (--speculate {speculate}), adaptive {config.controller.adaptive}"
        f"{max_k}")
    return spec


def of(model) -> TGIDraftSpeculation | None:
    """The speculation attached to ``model``, if any."""
    return getattr(model, MODEL_ATTR, None)


def detach(model) -> bool:
    """Stop drafting for ``model`` (TGI's own proposals return); True when one was attached."""
    spec = model.__dict__.pop(MODEL_ATTR, None) if hasattr(model, "__dict__") else None
    if spec is None:
        return False
    _LIVE.discard(spec)
    spec.close()
    return True


def live() -> list[TGIDraftSpeculation]:
    """The speculations of this process's models."""
    return list(_LIVE)


def detach_all() -> None:
    for spec in live():
        model = spec._model()
        if model is not None:
            detach(model)
        else:
            _LIVE.discard(spec)


def collect_stats(model=None) -> dict[str, dict]:
    """Per-domain counters of ``model``'s proposer (default: of every model in this process)."""
    specs = [of(model)] if model is not None else live()
    out: dict[str, dict] = {}
    for spec in specs:
        if spec is not None:
            out.update(spec.stats())
    return out


# --------------------------------------------------------------------- wrappers


def wrap_init(original: Callable) -> Callable:
    """``FlashCausalLM.__init__``, then :func:`attach` (ACCEL_DRAFT_CONFIG; unset = nothing)."""

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        attach(self)

    return __init__


def wrap_generate_token(original: Callable) -> Callable:
    """``FlashCausalLM.generate_token`` with drafts for the next step (models with :func:`attach`)."""

    @functools.wraps(original)
    def generate_token(self, batch):
        spec = self.__dict__.get(MODEL_ATTR)
        if spec is None or not spec.enabled or get_speculate() <= 0:
            return original(self, batch)
        return spec.step(original, self, batch)

    return generate_token


def with_full_max_k(paged_attention: Callable) -> Callable:
    """TGI's ``paged_attention`` with ``seqlen.max_k`` raised to ``max_s`` (see the ledger)."""

    @functools.wraps(paged_attention)
    def wrapper(query, kv_cache, kv_head_mapping, softmax_scale, block_tables, seqlen, max_s, **kwargs):
        # forward() raises max_s by the speculative width but builds Seqlen(max_k=max_current_length)
        if seqlen.max_k is not None and seqlen.max_k < max_s:
            seqlen.max_k = max_s
        return paged_attention(query, kv_cache, kv_head_mapping, softmax_scale, block_tables, seqlen, max_s,
                               **kwargs)

    wrapper.__module__, wrapper.__qualname__ = __name__, "with_full_max_k.<locals>.paged_attention"
    wrapper.__accel_max_k__ = True  # type: ignore[attr-defined]
    return wrapper
