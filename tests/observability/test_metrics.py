"""Live metrics: exact values from hand-made steps, the proposer's stats mapping, labels,
the multiprocess files (several writer processes, one scrape), setup and the log line."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass, field

import pytest

prometheus_client = pytest.importorskip("prometheus_client", reason="metrics need prometheus_client")

from accel_plugin import envs
from accel_plugin.observability import metrics
from accel_plugin.observability.kv import PagedAllocator, Request, paged_usage, simulate
from accel_plugin.observability.metrics import METRICS, FileCollector, LiveMetrics, MetricsSink, read_metrics
from accel_plugin.speculative.controller import DomainStats

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

    def stats(self):
        return self.domains


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
    for state in metrics.SPEC_STATES:
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


# --- the files: processes, collectors, the scrape ---------------------------------------------------

def _write_from_child(directory, used, clock):
    sink = MetricsSink(directory, clock=lambda: clock)
    LiveMetrics(BASE, sink).kv("full", 16).record([used])
    sink.close()


def test_other_processes_files_are_merged(tmp_path):
    """Two writer processes (as two vLLM workers would be): counters add, a gauge shows
    the value written last."""
    ctx, pids = multiprocessing.get_context("fork"), []
    for used, clock in ((16, 100.0), (48, 200.0)):
        child = ctx.Process(target=_write_from_child, args=(str(tmp_path), used, clock))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        pids.append(str(child.pid))
    v = read_metrics(str(tmp_path))
    assert v[("accel_kv_steps_total", kv_labels())] == 2
    assert v[("accel_kv_used_slot_steps_total", kv_labels())] == 64
    assert v[("accel_kv_used_slots", kv_labels())] == 48
    assert sorted(os.listdir(tmp_path)) == [f"{kind}_accel-{pid}.db" for kind in ("counter", "gauge_mostrecent")
                                            for pid in sorted(pids)]


def test_scrape_text_of_a_registry(live, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    live.kv("full", 16).record([10, 17, 97])
    registry = prometheus_client.CollectorRegistry()
    registry.register(FileCollector(live.sink.directory))
    text = prometheus_client.generate_latest(registry).decode()
    assert ('accel_kv_used_slots{block_size="16",engine="0",kv_cache_group="full",model_name="tiny"} 124.0'
            in text)
    assert "# TYPE accel_kv_steps_total counter" in text
    assert 'accel_kv_steps_total{block_size="16",engine="0",kv_cache_group="full",model_name="tiny"} 1.0' in text


def test_with_prometheus_multiproc_dir_the_frameworks_collector_serves_them(live, monkeypatch):
    """vLLM with PROMETHEUS_MULTIPROC_DIR builds a registry with MultiProcessCollector over
    that directory; our files are there, and our own collector stays silent."""
    from prometheus_client import multiprocess

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", live.sink.directory)
    live.kv("full", 16).record([5])
    assert list(FileCollector(live.sink.directory).collect()) == []
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    text = prometheus_client.generate_latest(registry).decode()
    assert 'accel_kv_used_slots{block_size="16",engine="0",kv_cache_group="full",model_name="tiny"} 5.0' in text


def test_unchanged_values_are_not_rewritten(tmp_path):
    now = [1.0]
    sink = MetricsSink(str(tmp_path), clock=lambda: now[0])
    metric = METRICS["accel_kv_used_slots"]
    labels = ("tiny", "0", "full", "16")
    sink.write(metric, labels, 5)
    now[0] = 2.0
    sink.write(metric, labels, 5)  # same value: no write, the timestamp stays 1.0
    assert [(v, t) for _, v, t in sink._files["gauge"].read_all_values()] == [(5.0, 1.0)]
    with pytest.raises(ValueError, match="takes labels"):
        sink.write(metric, ("tiny",), 1)


# --- setup, switches, the log line ----------------------------------------------------------------

@pytest.fixture
def fresh_process(monkeypatch):
    monkeypatch.setattr(metrics, "_process", {"dir": None})
    monkeypatch.setattr(metrics, "_live", {})


def test_setup_process_makes_and_hands_over_a_directory(fresh_process):
    environ: dict[str, str] = {}
    registry = prometheus_client.CollectorRegistry()
    directory = metrics.setup_process(environ, registry=registry)
    try:
        assert os.path.isdir(directory) and environ[envs.ACCEL_METRICS_DIR] == directory
        assert metrics.setup_process(environ, registry=registry) == directory  # idempotent
        live = metrics.live_metrics(BASE, environ=environ)
        live.kv("full", 16).record([3])
        text = prometheus_client.generate_latest(registry).decode()
        assert "accel_kv_used_slots" in text
    finally:
        metrics._remove_owned_dir(directory, os.getpid())
    assert not os.path.exists(directory)


def test_prometheus_multiproc_dir_wins(fresh_process, tmp_path):
    environ = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), envs.ACCEL_METRICS_DIR: str(tmp_path / "accel")}
    registry = prometheus_client.CollectorRegistry()
    assert metrics.setup_process(environ, registry=registry) == str(tmp_path)
    assert metrics.live_metrics(BASE, environ=environ).sink.directory == str(tmp_path)


@pytest.mark.parametrize("raw", ["0", "off", "false"])
def test_metrics_off(fresh_process, raw):
    environ = {envs.ACCEL_METRICS: raw}
    assert metrics.setup_process(environ) is None
    assert metrics.live_metrics(BASE, environ=environ) is None
    assert envs.ACCEL_METRICS_DIR not in environ


def test_without_prometheus_client_metrics_are_off(fresh_process, monkeypatch, caplog):
    monkeypatch.setattr(metrics, "_prometheus", lambda: None)
    with caplog.at_level("DEBUG", logger="accel_plugin.observability.metrics"):
        assert metrics.setup_process({}) is None
    assert "prometheus_client is not installed" in caplog.text


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


# --- names and docs ---------------------------------------------------------------------------------

def test_metric_names():
    families = [m.family for m in METRICS.values()]
    assert len(set(families)) == len(families), "a gauge and a counter family share a name"
    for m in METRICS.values():
        assert m.name.startswith("accel_") and (m.kind == "counter") == m.name.endswith("_total")
        assert set(metrics.BASE_LABELS) <= set(m.labels)


def test_every_metric_is_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    missing = [name for name in METRICS if f"`{name}`" not in text]
    assert not missing, f"metrics missing from docs/observability.md: {missing}"
