"""The compatibility matrix's records: saving one keeps the others in matrix order, and the
results file ships with the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_plugin.diagnostics import compat_records as compat
from accel_plugin.diagnostics.compat_records import Record, load_records, save_record

ROOT = Path(__file__).resolve().parents[2]



def test_save_record_keeps_the_others_and_refuses_unknown_cells(tmp_path):
    path = tmp_path / "results.json"
    save_record(Record("triton-3.9.0", "passed", passed=1), path)
    save_record(Record("vllm-0.30", "failed", failed=1), path)
    assert list(load_records(path)) == ["vllm-0.30", "triton-3.9.0"]  # matrix order
    with pytest.raises(KeyError, match="no matrix cell 'vllm-9.9'"):
        save_record(Record("vllm-9.9", "passed"), path)



def test_results_ship_with_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert compat.RESULTS_PATH.name in data["tool"]["setuptools"]["package-data"]["accel_plugin.diagnostics"]
