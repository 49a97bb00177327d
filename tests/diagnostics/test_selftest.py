"""`accel doctor --self-test`: every kernel once against its reference, a pass/fail table,
the compatibility line, and exit status 1 on any failure (accel_plugin/diagnostics/selftest.py).

The first test runs the command as a user does (a subprocess, TRITON_INTERPRET unset, so
the cases run in the interpreter in a child process); the others run small parts of
the grid in this process, where tests/conftest.py has set TRITON_INTERPRET=1.
"""

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.diagnostics import selftest
from accel_plugin.cli import doctor
from accel_plugin.kernels import limits

ACCEL = shutil.which("accel", path=str(Path(sys.executable).parent)) or "accel"


@dataclasses.dataclass
class FakeRow:
    """What accel_plugin.diagnostics.compatibility.environment_row returns."""

    cell: str | None = "vllm-0.32"
    tested: bool = True
    status: str | None = "passed"
    recorded: str | None = "2025-01-02"
    summary: str = "matches matrix cell vllm-0.32: passed on 2025-01-02 (12 passed, 0 failed)"

    def to_dict(self):
        return dataclasses.asdict(self)


def small_grid(monkeypatch, kernel, shapes=1):
    """Only the first ``shapes`` shapes of ``kernel`` (for every dtype), so that `accel doctor
    --self-test` in this process takes seconds."""
    monkeypatch.setattr(selftest, "GRID", {kernel: selftest.GRID[kernel][:shapes]})


def fake_compatibility(monkeypatch):
    row = FakeRow()
    from accel_plugin.diagnostics import compatibility

    monkeypatch.setattr(compatibility, "environment_row", lambda: row)
    return row


@pytest.fixture(autouse=True)
def no_accel_env(monkeypatch):
    """The in-process doctor reads os.environ: a developer's ACCEL_* settings must not leak in."""
    for name in [n for n in os.environ if n.startswith("ACCEL_")]:
        monkeypatch.delenv(name)


def run_doctor_in_process(capsys, *flags):
    args = argparse.Namespace(json="--json" in flags, self_test="--no-self-test" not in flags)
    status = doctor.run(args)
    return status, capsys.readouterr().out


def test_grid_covers_every_value_for_each_kernel_and_dtype():
    cases = selftest.default_cases()
    for kernel in selftest.KERNELS:
        for dtype in limits.DTYPE_NAMES:
            mine = [c for c in cases if c.kernel == kernel and c.dtype == dtype]
            assert {c.head_size for c in mine} >= {64, 128, 80}, (kernel, dtype)
            assert all(c.head_size in limits.HEAD_SIZES for c in mine)
            if kernel != selftest.FLASH:
                assert {c.block_size for c in mine} == {16, 32}, (kernel, dtype)
            if kernel != selftest.WRITE_KV:
                assert {c.gqa for c in mine} == {1, 4}, (kernel, dtype)
    assert {c.variant for c in cases if c.kernel == selftest.PAGED} == {"mixed", "split-K"}
    assert selftest.default_cases(kernels=(selftest.PAGED,), dtypes=("float32",)) == [
        c for c in cases if c.kernel == selftest.PAGED and c.dtype == "float32"]


@pytest.mark.slow
def test_self_test_json_as_a_user_runs_it():
    """TRITON_INTERPRET unset on a CPU machine: the doctor reports the reference fallback for
    this environment, and the self-test runs the kernels in the interpreter in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_") and k != "TRITON_INTERPRET"}
    proc = subprocess.run([ACCEL, "doctor", "--self-test", "--json"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    self_test = report["self_test"]
    summary = self_test["summary"]
    assert summary["passed"] and summary["failed"] == 0 and summary["total"] == len(self_test["cases"]) >= 27
    failed = [c for c in self_test["cases"] if not c["passed"]]
    assert not failed, failed
    if not torch.cuda.is_available():
        assert report["kernels"]["mode"] == "reference"  # this process, as the user set it up
        assert summary["mode"] == "interpreter" and "subprocess with TRITON_INTERPRET=1" in summary["where"]
        assert {c["mode"] for c in self_test["cases"]} == {"interpreter"}
    assert {c["dtype"] for c in self_test["cases"]} == set(limits.DTYPE_NAMES)
    assert {c["kernel"] for c in self_test["cases"]} == set(selftest.KERNELS)
    for c in self_test["cases"]:
        assert c["error"] <= c["tolerance"] and c["seconds"] >= 0
    assert "summary" in self_test["compatibility"] or "error" in self_test["compatibility"]
    assert summary["seconds"] < 120, summary


def drop_last_block(real):
    """paged_attention that forgets each sequence's last block of keys (a lost split, a bad
    block-table walk): what the self-test is there to catch."""
    def broken(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len, **kwargs):
        q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        shorter = torch.maximum(seq_lens - k_cache.shape[1], q_lens).to(seq_lens.dtype)
        return real(q, k_cache, v_cache, cu_seqlens_q, shorter, block_table, max_seqlen_q, max_seq_len, **kwargs)

    return broken


@pytest.mark.slow
def test_broken_paged_kernel_fails_and_doctor_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(kernels, "paged_attention", drop_last_block(kernels.paged_attention))
    report = selftest.run_self_test(kernels=(selftest.PAGED,), with_compatibility=False)
    assert not report.passed and len(report.failed) == len(report.cases) == 4 * len(limits.DTYPE_NAMES)
    for result in report.failed:
        assert result.error > result.tolerance > 0, result
    assert report.summary().startswith(f"FAIL: 0 of {len(report.cases)} cases passed")

    small_grid(monkeypatch, selftest.PAGED)
    fake_compatibility(monkeypatch)
    status, out = run_doctor_in_process(capsys, "--json")
    assert status == 1
    data = json.loads(out)
    assert not data["self_test"]["summary"]["passed"]
    assert {c["dtype"] for c in data["self_test"]["cases"] if not c["passed"]} == set(limits.DTYPE_NAMES)
    assert any(e.startswith("self-test: FAIL") for e in data["errors"])
    assert data["self_test"]["compatibility"]["cell"] == "vllm-0.32"


def test_kernel_that_raises_is_a_failed_case(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom: no kernel image for this device")

    monkeypatch.setattr(kernels, "flash_attn_varlen_func", boom)
    report = selftest.run_self_test(kernels=(selftest.FLASH, selftest.WRITE_KV), dtypes=("float32",),
                                    with_compatibility=False)
    flash = [c for c in report.cases if c.case.kernel == selftest.FLASH]
    assert flash and all(not c.passed and c.error is None for c in flash)
    assert all(c.message == "RuntimeError: boom: no kernel image for this device" for c in flash)
    assert all(c.passed for c in report.cases if c.case.kernel == selftest.WRITE_KV)
    assert not report.passed
    json.dumps(report.to_dict(), allow_nan=False)


def test_nan_output_is_a_failed_case(monkeypatch):
    monkeypatch.setattr(kernels, "flash_attn_varlen_func", lambda q, *a, **kw: torch.full_like(q, float("nan")))
    (result,) = selftest.run_self_test(kernels=(selftest.FLASH,), dtypes=("float16",), with_compatibility=False
                                       ).cases[:1]
    assert not result.passed and result.error is None and "non-finite" in result.message


def test_text_report_shows_table_summary_and_compatibility(monkeypatch, capsys):
    small_grid(monkeypatch, selftest.WRITE_KV, shapes=2)
    row = fake_compatibility(monkeypatch)
    status, out = run_doctor_in_process(capsys)
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


def test_failed_case_and_unknown_compatibility_in_text(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise ValueError("head_dim must be one of 32, 64; got 80")

    monkeypatch.setattr(kernels, "write_kv_cache", boom)
    monkeypatch.setitem(sys.modules, "accel_plugin.diagnostics.compatibility", None)  # not there (yet)
    small_grid(monkeypatch, selftest.WRITE_KV)
    status, out = run_doctor_in_process(capsys)
    assert status == 1
    assert "    ValueError: head_dim must be one of 32, 64; got 80" in out
    assert f"FAIL: 0 of {len(limits.DTYPE_NAMES)} cases passed" in out
    assert "compatibility: unknown (ModuleNotFoundError: " in out
    assert "Errors\n  self-test: FAIL" in out


def test_doctor_without_the_flag_runs_no_self_test(monkeypatch, capsys):
    monkeypatch.setattr(selftest, "run_self_test", lambda *a, **kw: pytest.fail("self-test ran"))
    status, out = run_doctor_in_process(capsys, "--json", "--no-self-test")
    assert status == 0 and "self_test" not in json.loads(out)


def test_subprocess_runs_the_cases_in_the_interpreter():
    """The path `accel doctor` takes on CPU when its own process imported the kernels without
    TRITON_INTERPRET: a child process with it set, its JSON read back."""
    report = selftest._run_in_subprocess((selftest.WRITE_KV,), ("float32",), why="a test")
    assert report.passed, report.error or [c.message for c in report.failed]
    assert report.where == "a subprocess with TRITON_INTERPRET=1 (this process: a test)"
    assert report.mode == "interpreter" and len(report.cases) == len(selftest.GRID[selftest.WRITE_KV])


def test_a_child_that_dies_is_reported(monkeypatch):
    def crash(command, **kwargs):
        return subprocess.CompletedProcess(command, -11, stdout="", stderr="Fatal Python error: Segmentation fault")

    monkeypatch.setattr(selftest.subprocess, "run", crash)
    report = selftest._run_in_subprocess(None, None, why="a test")
    assert not report.passed and not report.cases
    assert report.summary() == ("self-test could not run: the subprocess exited -11: "
                                "Fatal Python error: Segmentation fault")
    assert "self-test could not run" in "\n".join(selftest.render(report.to_dict()))
