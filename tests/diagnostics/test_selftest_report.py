"""The self-test's text report in `accel doctor --self-test`: the table, the summary, the
compatibility line, a failed case's message."""

from __future__ import annotations

import sys

from accel_plugin import kernels
from accel_plugin.diagnostics import selftest_cases
from accel_plugin.kernels import limits


def test_text_report_shows_table_summary_and_compatibility(monkeypatch, small_grid, fake_compatibility,
                                                           run_doctor_in_process):
    small_grid(selftest_cases.WRITE_KV, shapes=2)
    row = fake_compatibility()
    status, out = run_doctor_in_process()
    assert status == 0, out
    assert out.index("Selection") < out.index("Self-test")  # after the normal report
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["kernel", "case"])
    assert header.split() == ["kernel", "case", "dtype", "head", "block", "gqa", "mode", "error", "tolerance",
                              "time", "result"]
    rows = [line.split() for line in lines if line.strip().startswith("write_kv_cache")]
    assert len(rows) == 2 * len(limits.DTYPE_NAMES)
    assert all(r[-1] == "PASS" and r[6] == kernels.runtime_mode() for r in rows)
    assert f"PASS: {len(rows)} of {len(rows)} cases passed" in out
    assert f"compatibility: {row.summary}" in out


def test_failed_case_and_unknown_compatibility_in_text(monkeypatch, small_grid, run_doctor_in_process):
    def boom(*args, **kwargs):
        raise ValueError("head_dim must be one of 32, 64; got 80")

    monkeypatch.setattr(kernels, "write_kv_cache", boom)
    monkeypatch.setitem(sys.modules, "accel_plugin.diagnostics.compat_environment", None)  # not there (yet)
    small_grid(selftest_cases.WRITE_KV)
    status, out = run_doctor_in_process()
    assert status == 1
    assert "    ValueError: head_dim must be one of 32, 64; got 80" in out
    assert f"FAIL: 0 of {len(limits.DTYPE_NAMES)} cases passed" in out
    assert "compatibility: unknown (ModuleNotFoundError: " in out
    assert "Errors\n  self-test: FAIL" in out
