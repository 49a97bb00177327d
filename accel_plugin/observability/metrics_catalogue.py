"""The catalogue of accel's live metrics: every metric's name, kind, help and labels, and
the controller states they report.

docs/observability.md ("Live metrics") documents each metric, with PromQL examples
(a test checks that every one is there). The recorders
(:mod:`accel_plugin.observability.metrics_recorders`) publish them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BASE_LABELS", "DRAFTING_STATES", "KV_LABELS", "METRICS", "SPEC_LABELS", "SPEC_STATES", "MetricDef"]

#: labels of every accel metric: vLLM's own (``model_name``, ``engine``), so dashboards join them
BASE_LABELS = ("model_name", "engine")
KV_LABELS = (*BASE_LABELS, "kv_cache_group", "block_size")
SPEC_LABELS = (*BASE_LABELS, "domain")
#: a domain is drafting in these controller states (accel_plugin.speculative.controller.DomainState)
DRAFTING_STATES = ("warmup", "on", "fixed")
SPEC_STATES = ("warmup", "on", "off", "fixed", "failed", "no-draft")


@dataclass(frozen=True)
class MetricDef:
    """One metric: ``name`` as scraped (counters end in ``_total``), kind, help, labels."""

    name: str
    kind: str  #: "gauge" or "counter"
    help: str
    labels: tuple[str, ...]

    @property
    def family(self) -> str:
        """The metric family name (a counter's without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


def _g(name: str, help: str, labels: tuple[str, ...]) -> MetricDef:
    return MetricDef(name, "gauge", help, labels)


def _c(name: str, help: str, labels: tuple[str, ...]) -> MetricDef:
    return MetricDef(name, "counter", help, labels)


#: Every metric, by name. docs/observability.md documents each (a test checks).
METRICS: dict[str, MetricDef] = {m.name: m for m in (
    _g("accel_kv_seqs", "Sequences in the last step's batch.", KV_LABELS),
    _g("accel_kv_used_slots", "KV slots holding a token in the last step (sum of sequence lengths).", KV_LABELS),
    _g("accel_kv_allocated_slots", "KV slots in the blocks those sequences hold (blocks x block_size).",
       KV_LABELS),
    _g("accel_kv_internal_slots", "Allocated KV slots no token fills (unused tails of last blocks).", KV_LABELS),
    _g("accel_kv_internal_fragmentation_percent", "Internal fragmentation in the last step: "
       "100 x internal / allocated slots.", KV_LABELS),
    _g("accel_kv_blocks", "KV blocks in use in the last step (sum of ceil(seq_len / block_size)).", KV_LABELS),
    _g("accel_kv_last_step_timestamp_seconds", "Unix time of the last step recorded.", KV_LABELS),
    _c("accel_kv_steps_total", "Steps recorded.", KV_LABELS),
    _c("accel_kv_used_slot_steps_total", "Sum over steps of used slots (rate / allocated rate = "
       "slot-step weighted usage, as accel kv simulate).", KV_LABELS),
    _c("accel_kv_allocated_slot_steps_total", "Sum over steps of allocated slots.", KV_LABELS),
    _c("accel_spec_drafted_tokens_total", "Draft tokens proposed and verified, per domain.", SPEC_LABELS),
    _c("accel_spec_accepted_tokens_total", "Draft tokens the target accepted, per domain.", SPEC_LABELS),
    _c("accel_spec_draft_steps_total", "(request, step) pairs that drafted and were verified, per domain.",
       SPEC_LABELS),
    _g("accel_spec_acceptance_rate", "Accepted / drafted tokens since start (vLLM's definition).", SPEC_LABELS),
    _g("accel_spec_alpha", "Per-position acceptance over the controller's window, pooled over the draft "
       "positions; absent until measured.", SPEC_LABELS),
    _g("accel_spec_mean_acceptance_length", "1 + accepted tokens / drafting steps since start.", SPEC_LABELS),
    _g("accel_spec_k", "Draft tokens per request the controller chooses now (batch bucket of the last step).",
       SPEC_LABELS),
    _g("accel_spec_on", "1 while the domain drafts (state warmup, on, fixed), 0 otherwise.", SPEC_LABELS),
    _g("accel_spec_state", "1 for the domain's current controller state, 0 for the others.",
       (*SPEC_LABELS, "state")),
    _g("accel_spec_cost_ratio", "c: one draft forward / one plain target step; absent until measured.",
       SPEC_LABELS),
    _g("accel_spec_expected_speedup", "The controller's predicted speedup S at the current k; absent until "
       "measured.", SPEC_LABELS),
    _c("accel_spec_propose_seconds_total", "Time spent in the proposer (routing, drafting, bookkeeping).",
       BASE_LABELS),
    _c("accel_spec_propose_steps_total", "Proposer calls (one per decoding step).", BASE_LABELS),
    _g("accel_spec_last_propose_seconds", "Time of the last proposer call.", BASE_LABELS),
    _c("accel_metrics_record_seconds_total", "Time the framework's worker spent recording these metrics "
       "(host side; up to the previous step).", BASE_LABELS),
)}
