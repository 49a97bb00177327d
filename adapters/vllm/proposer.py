"""``DomainDraftProposer``: the domain proposer as a vLLM ``custom_class`` proposer.

    export ACCEL_DRAFT_CONFIG=drafts.yaml
    LLM(model=..., speculative_config={
        "method": "custom_class",
        "model": "accel_plugin.adapters.vllm.DomainDraftProposer",
        "num_speculative_tokens": 5,
    })

vLLM builds ``DomainDraftProposer(vllm_config)`` in the worker process, calls
``load_model(target_model)`` once, then ``propose(...)`` after every sampling step
(vllm/v1/worker/gpu_model_runner.py, ``propose_draft_token_ids``). The work is done
by the framework-neutral proposer that the accel plugins offer to vLLM
(``accel_adapter_components``: the first of ``components.proposers``, by default
``ACCEL_DOMAIN_DRAFT`` = :class:`accel_plugin.speculative.DomainProposer`), resolved
through the proposer registry. This class translates vLLM's configuration and
validates the draft YAML against the target at start-up, so that a bad file stops
the engine with a message naming the key.

Per-domain counters from Python: start the engine with our worker extension and
ask every worker (works in vLLM's multiprocess mode, where the proposer lives in
another process)::

    llm = LLM(..., worker_extension_cls="accel_plugin.adapters.vllm.proposer.SpeculationStatsExtension")
    llm.collective_rpc("accel_speculation_stats")  # [{domain: {...}}], one per worker

In the worker's own process, :func:`collect_stats` returns the same dict. The same
counters are Prometheus metrics on ``vllm serve``'s ``/metrics`` (``accel_spec_*``,
docs/observability.md), recorded after each ``propose``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DomainDraftProposer", "SpeculationStatsExtension", "collect_stats", "live_proposers"]

_LIVE: weakref.WeakSet = weakref.WeakSet()


def _logger():
    from vllm.logger import init_logger

    return init_logger("vllm.accel_plugin.speculative")


def live_proposers() -> list[DomainDraftProposer]:
    """The proposers alive in this process (one per vLLM worker)."""
    return list(_LIVE)


def collect_stats() -> dict[str, dict]:
    """Per-domain counters of this process's proposers, as plain dicts (JSON-able)."""
    out: dict[str, dict] = {}
    for proposer in live_proposers():
        out.update(proposer.core.stats_dict())
    return out


class SpeculationStatsExtension:
    """A vLLM worker extension (``worker_extension_cls``): adds one RPC method."""

    def accel_speculation_stats(self) -> dict[str, dict]:
        return collect_stats()


def _core_proposer() -> tuple[str, type]:
    """(name, class) of the proposer the accel plugins offer to vLLM, from this
    process's registry (the one :func:`accel_plugin.adapters.vllm.register` built)."""
    from accel_plugin.plugins.manager import process_plugins

    from ._names import FRAMEWORK

    return process_plugins().proposer(FRAMEWORK, display="vLLM")


class DomainDraftProposer:
    """vLLM ``custom_class`` proposer; configuration from ``ACCEL_DRAFT_CONFIG``."""

    def __init__(self, vllm_config: Any):
        from accel_plugin import envs

        from accel_plugin.versions import UnsupportedFrameworkVersion

        from . import _compat

        _compat.check_version()  # refuses a vLLM outside SUPPORTED_VERSIONS
        refusal = _compat.speculation_refusal()
        if refusal is not None:  # at start-up, not at the first verification step
            raise UnsupportedFrameworkVersion(f"accel-plugin's domain proposer cannot run here: {refusal}")
        from accel_plugin.speculative.draft_config import ConfigIssue, DraftConfigError, DraftTarget

        path = envs.draft_config_path()
        if path is None:
            raise DraftConfigError([ConfigIssue(
                envs.ACCEL_DRAFT_CONFIG,
                "is not set; point it at the draft YAML file (see docs/speculative.md)",
                "environment",
            )])
        model_config = vllm_config.model_config
        spec_config = vllm_config.speculative_config
        target = DraftTarget(
            model_dir=model_config.model,
            dtype=model_config.dtype,
            max_len=model_config.max_model_len,
            device=vllm_config.device_config.device,
            tokenizer_dir=model_config.tokenizer,
            trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
            framework_k=spec_config.num_speculative_tokens,
        )
        self.proposer_name, proposer_cls = _core_proposer()
        self.core = proposer_cls.for_target(
            path, target, detokenize=self._detokenize, logger=_logger(),
            initial_slots=min(16, vllm_config.scheduler_config.max_num_seqs),
        )
        config = self.config = self.core.config
        self.num_speculative_tokens = spec_config.num_speculative_tokens
        self._tokenizer = self._load_tokenizer(model_config)
        _LIVE.add(self)
        from .metrics import proposer_recorder

        self._metrics = proposer_recorder(vllm_config)  # live metrics (docs/observability.md); None: off
        from . import packed_linears

        # the target loads after this: its float32 matrices get native copies (packed_linears)
        refusal = packed_linears.why_not(vllm_config)
        #: what the target multiplies by: its native copies (set by load_model) or why not
        self.packing = None if refusal is None else f"target matrices left as vLLM has them ({refusal})"
        if refusal is None:
            packed_linears.arm(vllm_config)
        _logger().info(
            "accel-plugin domain proposer (%s): config %s, domains %s, k_max %d, adaptive %s",
            self.proposer_name, path, config.describe(),
            config.num_speculative_tokens, config.controller.adaptive,
        )

    @staticmethod
    def _load_tokenizer(model_config: Any):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            model_config.tokenizer,
            revision=getattr(model_config, "tokenizer_revision", None),
            trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
        )

    def _detokenize(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def load_model(self, target_model: Any = None) -> None:
        """Called by vLLM once the target is loaded: load every draft model now, and measure
        where the target's native copies pay (:mod:`.packed_linears`)."""
        from . import packed_linears

        if self.packing is None:
            self.packing = packed_linears.finish(target_model).describe()
        _logger().info("accel-plugin domain proposer: %s", self.packing)
        self.core.load()

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """Drafts per batch row (at most ``num_speculative_tokens``; ``[]`` = none)."""
        drafts = self.core.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        if self._metrics is not None:
            self._metrics.record(self.core)
        return drafts

    def stats(self):
        """Per-domain :class:`~accel_plugin.speculative.DomainStats`."""
        return self.core.stats()
