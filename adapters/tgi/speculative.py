"""Draft-model speculation in TGI, per model: attach the domain proposer to a TGI model, find it, close it.

:func:`attach` runs when a ``FlashCausalLM`` is built (patch 4 of :mod:`._patches`): it
reads ``ACCEL_DRAFT_CONFIG``, checks it against the target and TGI's ``--speculate``,
builds the proposer the accel plugins offer to ``"tgi"`` and puts a
:class:`.drafting.TGIDraftSpeculation` (the step logic around ``generate_token``) on
the model. :func:`collect_stats` reads the per-domain counters of this process's models.
"""

from __future__ import annotations

import re
import weakref
from pathlib import Path

from ._loguru import proposer_logger
from ._names import FRAMEWORK, MODEL_ATTR
from ._tgi import SpeculationConfigError, check_model, get_speculate, model_dir
from .drafting import PausableClock, TGIDraftSpeculation

__all__ = ["attach", "collect_stats", "detach", "detach_all", "live", "of"]

_LIVE: weakref.WeakSet = weakref.WeakSet()


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

    try:
        return process_plugins().proposer(FRAMEWORK, display="TGI")
    except NoProposerError as exc:
        raise SpeculationConfigError(f"{exc}, or unset ACCEL_DRAFT_CONFIG") from None


def attach(model, config_path: str | None = None) -> TGIDraftSpeculation | None:
    """Build the domain proposer for a TGI ``FlashCausalLM`` (``None`` without a config).

    ``config_path`` defaults to ``ACCEL_DRAFT_CONFIG``. Raises
    :class:`accel_plugin.speculative.draft_config.DraftConfigError` (the YAML, against the target) or
    :class:`SpeculationConfigError` (TGI's settings: ``--speculate``, the model kind) or
    :class:`accel_plugin.envs.EnvVarError` (``ACCEL_TGI_PREPACK``).
    Applies the generate_token patch, and the ``Seqlen.max_k`` workaround while
    TGI's own attention is in use (see :mod:`._patches`).
    """
    from accel_plugin import envs
    from accel_plugin.speculative.draft_config import ConfigIssue, DraftTarget, load_draft_config

    from . import _compat, _patches, packed_linears

    path = config_path or envs.draft_config_path()
    if path is None:
        return None
    envs.tgi_prepack()  # a wrong value stops start-up here, before the drafts load
    speculate = get_speculate()
    config = load_draft_config(path)
    if speculate <= 0:
        raise SpeculationConfigError(
            f"{envs.ACCEL_DRAFT_CONFIG}={path} asks for draft-model speculation, but TGI runs without "
            f"speculation (--speculate is 0 or not given): start TGI with --speculate "
            f"{config.num_speculative_tokens} (the YAML's num_speculative_tokens), or unset {envs.ACCEL_DRAFT_CONFIG}")
    check_model(model)
    target_dir = model_dir(model)
    issues = []
    if config.num_speculative_tokens > speculate:
        issues.append(ConfigIssue(
            "num_speculative_tokens",
            f"{config.num_speculative_tokens} exceeds TGI's --speculate {speculate} (the most draft tokens TGI "
            f"verifies per request and step); lower num_speculative_tokens to {speculate} or start TGI with "
            f"--speculate {config.num_speculative_tokens}", str(path), _yaml_line(path, "num_speculative_tokens")))
    # TGI keeps no --trust-remote-code on the model: the target's tokenizer files are read without it
    target = DraftTarget(model_dir=target_dir, dtype=model.dtype, device=model.device, tokenizer_dir=target_dir,
                         max_len=int(getattr(model.config, "max_position_embeddings", 4096) or 4096))
    tokenizer = model.tokenizer
    clock = PausableClock()
    proposer_name, proposer_cls = _core_proposer()
    core = proposer_cls.for_target(
        config, target, detokenize=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        logger=proposer_logger(), initial_slots=8, clock=clock, extra_issues=issues,
    )  # raises DraftConfigError with every issue, TGI's first
    detach(model)
    core.load()  # before TGI's warm-up measures the free memory for its KV cache
    spec = TGIDraftSpeculation(model, config=config, config_path=str(path), num_speculative_tokens=speculate,
                               proposer_name=proposer_name, core=core, clock=clock)
    spec.packing = packed_linears.pack_target(model)  # verifying k drafts at about one row's cost (CPU)
    _patches.apply(_patches.SPECULATION_PATCHES)
    max_k = ""
    if not _patches.ATTENTION_FUNCTIONS.applied:
        _patches.apply((_patches.SEQLEN_MAX_K,))
        max_k = "; TGI's Seqlen.max_k workaround applied (TGI's own attention)"
    setattr(model, MODEL_ATTR, spec)
    _LIVE.add(spec)
    domains = config.describe()
    _compat.logger().info(
        f"accel-plugin: draft-model speculation ({proposer_name}) replaces TGI's n-gram proposals: config {path}, "
        f"domains {domains}, "
        f"k_max {config.num_speculative_tokens} (--speculate {speculate}), adaptive {config.controller.adaptive}"
        f"{max_k}; {spec.packing.describe()}")
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
    if spec.packing is not None:  # TGI's own matrices and forward back
        spec.packing.undo()
        spec.packing = None
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
