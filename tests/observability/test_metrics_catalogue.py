"""The live metrics' catalogue: names that follow Prometheus' conventions, every metric documented."""

from __future__ import annotations

from accel_plugin.observability.metrics_catalogue import BASE_LABELS, METRICS


def test_metric_names():
    families = [m.family for m in METRICS.values()]
    assert len(set(families)) == len(families), "a gauge and a counter family share a name"
    for m in METRICS.values():
        assert m.name.startswith("accel_") and (m.kind == "counter") == m.name.endswith("_total")
        assert set(BASE_LABELS) <= set(m.labels)


def test_every_metric_is_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    missing = [name for name in METRICS if f"`{name}`" not in text]
    assert not missing, f"metrics missing from docs/observability.md: {missing}"
