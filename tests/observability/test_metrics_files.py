"""Live metrics' files: several writer processes and one scrape, the collectors, the
directory each process writes to, the switches."""

from __future__ import annotations

import multiprocessing
import os

import pytest

prometheus_client = pytest.importorskip("prometheus_client", reason="metrics need prometheus_client")

from accel_plugin import envs
from accel_plugin.observability import metrics_files, metrics_recorders
from accel_plugin.observability.metrics_catalogue import METRICS
from accel_plugin.observability.metrics_files import FileCollector, MetricsSink, read_metrics
from accel_plugin.observability.metrics_recorders import LiveMetrics

BASE = ("tiny", "0")


def kv_labels(group="full", block_size=16):
    return tuple(sorted({"model_name": "tiny", "engine": "0", "kv_cache_group": group,
                         "block_size": str(block_size)}.items()))


@pytest.fixture
def live(tmp_path):
    return LiveMetrics(BASE, MetricsSink(str(tmp_path)))


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


# --- setup, switches -------------------------------------------------------------------------------

@pytest.fixture
def fresh_process(monkeypatch):
    monkeypatch.setattr(metrics_files, "_process", {"setup": None})
    monkeypatch.setattr(metrics_recorders, "_live", {})


def test_setup_process_makes_and_hands_over_a_directory(fresh_process):
    environ: dict[str, str] = {}
    registry = prometheus_client.CollectorRegistry()
    directory = metrics_files.setup_process(environ, registry=registry)
    try:
        assert os.path.isdir(directory) and environ[envs.ACCEL_METRICS_DIR] == directory
        assert metrics_files.setup_process(environ, registry=registry) == directory  # idempotent
        live = metrics_recorders.live_metrics(BASE, environ=environ)
        live.kv("full", 16).record([3])
        text = prometheus_client.generate_latest(registry).decode()
        assert "accel_kv_used_slots" in text
    finally:
        metrics_files._remove_owned_dir(directory, os.getpid())
    assert not os.path.exists(directory)


def test_process_setup_steps_are_undone(fresh_process):
    """Each step of ProcessSetup has its undo (an adapter's ledger applies them one by one)."""
    environ: dict[str, str] = {}
    registry = prometheus_client.CollectorRegistry()
    setup = metrics_files.process_setup(environ, registry=registry)
    assert setup.own is None and environ == {} and list(registry._collector_to_names) == []  # nothing yet
    setup.export_dir()
    setup.register_collector()
    setup.register_cleanup()
    directory = setup.directory
    assert setup.done and os.path.isdir(directory) and environ[envs.ACCEL_METRICS_DIR] == directory
    assert list(registry._collector_to_names) == [setup.collector]
    assert setup.cleanup_handler == (metrics_files._remove_owned_dir, directory, os.getpid())
    setup.unregister_cleanup()
    setup.unregister_collector()
    setup.unexport_dir()
    assert environ == {} and list(registry._collector_to_names) == [] and not os.path.exists(directory)
    assert setup.cleanup_handler is None and not setup.done


def test_a_directory_the_user_named_is_kept_and_not_exported(fresh_process, tmp_path):
    environ = {envs.ACCEL_METRICS_DIR: str(tmp_path / "m")}
    setup = metrics_files.process_setup(environ, registry=prometheus_client.CollectorRegistry())
    setup.export_dir()
    setup.register_cleanup()  # nothing to clean up: the directory is the user's
    assert setup.cleanup_handler is None and os.path.isdir(tmp_path / "m")
    setup.unexport_dir()
    assert os.path.isdir(tmp_path / "m") and environ == {envs.ACCEL_METRICS_DIR: str(tmp_path / "m")}


def test_prometheus_multiproc_dir_wins(fresh_process, tmp_path):
    environ = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), envs.ACCEL_METRICS_DIR: str(tmp_path / "accel")}
    registry = prometheus_client.CollectorRegistry()
    assert metrics_files.setup_process(environ, registry=registry) == str(tmp_path)
    assert metrics_recorders.live_metrics(BASE, environ=environ).sink.directory == str(tmp_path)


@pytest.mark.parametrize("raw", ["0", "off", "false"])
def test_metrics_off(fresh_process, raw):
    environ = {envs.ACCEL_METRICS: raw}
    assert metrics_files.setup_process(environ) is None
    assert metrics_recorders.live_metrics(BASE, environ=environ) is None
    assert envs.ACCEL_METRICS_DIR not in environ


def test_without_prometheus_client_metrics_are_off(fresh_process, monkeypatch, caplog):
    monkeypatch.setattr(metrics_files, "find_prometheus", lambda: None)
    with caplog.at_level("DEBUG", logger="accel_plugin.observability.metrics_files"):
        assert metrics_files.setup_process({}) is None
    assert "prometheus_client is not installed" in caplog.text
