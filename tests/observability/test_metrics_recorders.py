"""Live metrics' recorders: exact values from hand-made steps, the proposer's stats mapping,
labels, the log line."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

prometheus_client = pytest.importorskip("prometheus_client", reason="metrics need prometheus_client")

from accel_plugin.observability.kv_accounting import paged_usage
from accel_plugin.observability.kv_simulator import PagedAllocator, simulate
from accel_plugin.observability.kv_trace import Request
from accel_plugin.observability.metrics_catalogue import SPEC_STATES
from accel_plugin.observability.metrics_files import MetricsSink, read_metrics
from accel_plugin.observability.metrics_recorders import MODEL_REFRESH_S, LiveMetrics
from accel_plugin.speculative.domain_stats import DomainCounters, DomainStats

BASE = ("tiny", "0")


def kv_labels(group="full", block_size=16):
    return tuple(sorted({"model_name": "tiny", "engine": "0", "kv_cache_group": group,
                         "block_size": str(block_size)}.items()))


def spec_labels(domain, **extra):
    return tuple(sorted({"model_name": "tiny", "engine": "0", "domain": domain, **extra}.items()))


@pytest.fixture
def live(tmp_path):
    return LiveMetrics(BASE, MetricsSink(str(tmp_path)))


def values(live):
    return read_metrics(live.sink.directory)


# --- KV cache ---------------------------------------------------------------------------------------

def test_kv_step_exact_values(live):
    usage = live.kv("full", 16).record([10, 17, 97])  # 1 + 2 + 7 blocks
    assert usage == paged_usage([10, 17, 97], 16)
    v, labels = values(live), kv_labels()
    assert v[("accel_kv_seqs", labels)] == 3
    assert v[("accel_kv_used_slots", labels)] == 124
    assert v[("accel_kv_allocated_slots", labels)] == 160
    assert v[("accel_kv_blocks", labels)] == 10
    assert v[("accel_kv_internal_slots", labels)] == 36
    assert v[("accel_kv_internal_fragmentation_percent", labels)] == pytest.approx(22.5)
    assert v[("accel_kv_steps_total", labels)] == 1


def test_kv_gauges_follow_the_last_step_and_counters_add_up(live):
    recorder = live.kv("full", 16)
    recorder.record([10, 17, 97])
    recorder.record([16])
    v, labels = values(live), kv_labels()
    assert v[("accel_kv_used_slots", labels)] == 16
    assert v[("accel_kv_internal_fragmentation_percent", labels)] == 0.0
    assert v[("accel_kv_steps_total", labels)] == 2
    assert v[("accel_kv_used_slot_steps_total", labels)] == 124 + 16
    assert v[("accel_kv_allocated_slot_steps_total", labels)] == 160 + 16


def test_slot_step_counters_equal_the_simulator_whatever_the_schedule(live):
    # Each request runs with lengths prompt, prompt + 1, ..., prompt + output - 1, so the
    # sums over steps do not depend on which requests shared a step.
    requests = [Request(arrival=0, prompt_len=5, output_len=3), Request(arrival=1, prompt_len=20, output_len=2)]
    recorder = live.kv("full", 16)
    for step in ([5], [6, 20], [7, 21]):  # the second request arrived one step later
        recorder.record(step)
    totals = simulate(requests, PagedAllocator(4096, 16)).totals
    assert recorder.used_slot_steps == totals.used == 5 + 6 + 7 + 20 + 21
    assert recorder.allocated_slot_steps == totals.allocated
    v = values(live)
    assert v[("accel_kv_used_slot_steps_total", kv_labels())] == totals.used


def test_kv_groups_are_labelled_apart(live):
    live.kv("full", 16).record([33])
    live.kv("full", 32).record([33])
    v = values(live)
    assert v[("accel_kv_blocks", kv_labels("full", 16))] == 3
    assert v[("accel_kv_blocks", kv_labels("full", 32))] == 2
    assert live.kv("full", 16) is live.kv("full", 16)


def test_empty_step(live):
    live.kv("full", 16).record([])
    v = values(live)
    assert v[("accel_kv_allocated_slots", kv_labels())] == 0
    assert v[("accel_kv_internal_fragmentation_percent", kv_labels())] == 0.0


# --- speculation ------------------------------------------------------------------------------------

@dataclass
class FakeProposer:
    """What SpeculationMetrics reads of accel_plugin.speculative.DomainProposer."""

    domains: dict = field(default_factory=dict)
    num_steps: int = 0
    propose_seconds: float = 0.0

    by_bucket: list = field(default_factory=list)  # what each read asked for

    def stats(self, *, by_bucket=True):
        self.by_bucket.append(by_bucket)
        return self.domains

    def counters(self):
        return {name: DomainCounters(s.drafted, s.accepted, s.steps, s.state, s.k) for name, s in self.domains.items()}


def domain_stats(domain, state="on", k=3, steps=10, drafted=30, accepted=21, alpha=0.75, c=0.1, speedup=1.8):
    return DomainStats(domain=domain, draft="d", state=state, k=k, k_max=4, steps=steps, drafted=drafted,
                       accepted=accepted, alpha=alpha, cost_ratio=c, expected_speedup=speedup)


def test_proposer_stats_map_to_metrics(live):
    proposer = FakeProposer({"support": domain_stats("support"),
                             "default": domain_stats("default", state="warmup", k=2, steps=0, drafted=0, accepted=0,
                                                     alpha=None, c=None, speedup=None)},
                            num_steps=4, propose_seconds=0.02)
    live.proposer().record(proposer)
    v = values(live)
    s = spec_labels("support")
    assert v[("accel_spec_drafted_tokens_total", s)] == 30
    assert v[("accel_spec_accepted_tokens_total", s)] == 21
    assert v[("accel_spec_draft_steps_total", s)] == 10
    assert v[("accel_spec_acceptance_rate", s)] == pytest.approx(0.7)
    assert v[("accel_spec_mean_acceptance_length", s)] == pytest.approx(3.1)
    assert v[("accel_spec_alpha", s)] == 0.75
    assert v[("accel_spec_k", s)] == 3
    assert v[("accel_spec_on", s)] == 1
    assert v[("accel_spec_cost_ratio", s)] == pytest.approx(0.1)
    assert v[("accel_spec_expected_speedup", s)] == pytest.approx(1.8)
    for state in SPEC_STATES:
        assert v[("accel_spec_state", spec_labels("support", state=state))] == (state == "on")
    d = spec_labels("default")
    assert v[("accel_spec_on", d)] == 1  # warm-up drafts
    assert v[("accel_spec_mean_acceptance_length", d)] == 1.0
    assert ("accel_spec_alpha", d) not in v  # not measured yet: absent, not 0
    assert ("accel_spec_cost_ratio", d) not in v
    base = tuple(sorted({"model_name": "tiny", "engine": "0"}.items()))
    assert v[("accel_spec_propose_steps_total", base)] == 4
    assert v[("accel_spec_propose_seconds_total", base)] == pytest.approx(0.02)
    assert ("accel_spec_last_propose_seconds", base) not in v  # no previous call to difference with
    assert proposer.by_bucket == [False]  # the per-step read leaves out the per-bucket table


def test_proposer_last_call_time_and_off_state(live):
    recorder = live.proposer()
    proposer = FakeProposer({"code": domain_stats("code")}, num_steps=1, propose_seconds=0.010)
    recorder.record(proposer)
    proposer.num_steps, proposer.propose_seconds = 2, 0.013
    proposer.domains = {"code": domain_stats("code", state="off", k=0)}
    recorder.record(proposer)
    v = values(live)
    base = tuple(sorted({"model_name": "tiny", "engine": "0"}.items()))
    assert v[("accel_spec_last_propose_seconds", base)] == pytest.approx(0.003)
    assert v[("accel_spec_on", spec_labels("code"))] == 0
    assert v[("accel_spec_k", spec_labels("code"))] == 0
    assert v[("accel_spec_state", spec_labels("code", state="off"))] == 1
    assert v[("accel_spec_state", spec_labels("code", state="on"))] == 0


def test_counters_every_call_model_values_at_most_every_refresh_interval(tmp_path):
    now = [100.0]
    live = LiveMetrics(BASE, MetricsSink(str(tmp_path)), clock=lambda: now[0])
    recorder, s = live.proposer(), spec_labels("support")
    proposer = FakeProposer({"support": domain_stats("support", alpha=0.5, c=0.1, speedup=1.2)}, num_steps=1)
    recorder.record(proposer)
    assert len(proposer.by_bucket) == 1  # the first call reads everything
    now[0] += MODEL_REFRESH_S / 2
    proposer.domains = {"support": domain_stats("support", state="off", k=0, steps=11, drafted=33, accepted=22,
                                                alpha=0.6, c=0.2, speedup=0.9)}
    recorder.record(proposer)
    v = values(live)
    assert len(proposer.by_bucket) == 1  # within the interval: counters, k and state only
    assert (v[("accel_spec_drafted_tokens_total", s)], v[("accel_spec_accepted_tokens_total", s)],
            v[("accel_spec_draft_steps_total", s)], v[("accel_spec_k", s)]) == (33, 22, 11, 0)
    assert v[("accel_spec_acceptance_rate", s)] == pytest.approx(22 / 33)
    assert v[("accel_spec_mean_acceptance_length", s)] == pytest.approx(3.0)
    assert v[("accel_spec_state", spec_labels("support", state="off"))] == 1
    assert v[("accel_spec_on", s)] == 0
    assert (v[("accel_spec_alpha", s)], v[("accel_spec_cost_ratio", s)]) == (0.5, pytest.approx(0.1))
    assert recorder.summary().startswith("support a=0.50 k=0 off")  # k and state are this call's
    now[0] += MODEL_REFRESH_S / 2
    recorder.record(proposer)
    v = values(live)
    assert len(proposer.by_bucket) == 2  # the interval has passed
    assert v[("accel_spec_alpha", s)] == 0.6
    assert v[("accel_spec_cost_ratio", s)] == pytest.approx(0.2)
    assert v[("accel_spec_expected_speedup", s)] == pytest.approx(0.9)
    proposer.domains = {**proposer.domains, "code": domain_stats("code", alpha=0.7)}
    recorder.record(proposer)  # a domain appears: read at once, whatever the interval
    assert len(proposer.by_bucket) == 3
    assert values(live)[("accel_spec_alpha", spec_labels("code"))] == 0.7


# --- the log line ---------------------------------------------------------------------------------

def test_periodic_log_line(tmp_path):
    now = [0.0]
    lines = []
    live = LiveMetrics(BASE, None, log=lines.append, log_interval=10.0, clock=lambda: now[0])
    recorder = live.kv("full", 16)
    recorder.record([1000, 234])
    assert lines == []  # not yet 10 s
    now[0] = 10.0
    live.proposer().record(FakeProposer({"support": domain_stats("support", alpha=0.82, k=4)},
                                        num_steps=10, propose_seconds=0.012))
    assert lines == [("accel KV: 2 seqs, 1,234 slots used / 1,248 allocated (1.1% internal), 78 blocks; "
                      "speculation: support a=0.82 k=4 on; propose 1.20 ms/step")]
    now[0] = 15.0
    recorder.record([1])
    assert len(lines) == 1  # at most every 10 s


def test_log_line_names_groups_when_several():
    live = LiveMetrics(BASE, None)
    live.kv("full", 16).record([16])
    live.kv("full", 32).record([16])
    assert live.line() == ("accel KV [full, block 16]: 1 seqs, 16 slots used / 16 allocated (0.0% internal), "
                           "1 blocks; accel KV [full, block 32]: 1 seqs, 16 slots used / 32 allocated "
                           "(50.0% internal), 1 blocks")
