"""``benchmarks/metrics_overhead.py``'s recorder part runs against the recorders as they are (its
stand-in proposer offers what :class:`SpeculationMetrics` reads): a few calls per batch, no timing
checked. The vLLM parts run in ``python -m benchmarks.metrics_overhead`` (docs/observability.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="metrics need prometheus_client")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("metrics_overhead", ROOT / "benchmarks" / "metrics_overhead.py")
metrics_overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(metrics_overhead)


def test_the_recorder_benchmark_records_every_batch():
    rows = metrics_overhead.bench_record(calls=8)
    assert [row["batch"] for row in rows] == list(metrics_overhead.BATCHES)
    assert all(row["kv_us"] > 0 and row["spec_us"] > 0 for row in rows)
