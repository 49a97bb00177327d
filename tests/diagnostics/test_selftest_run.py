"""Running the self-test: a broken, raising or NaN kernel is a failed case and `accel doctor`
exits 1; the cases in a child process with TRITON_INTERPRET=1, and a child that dies."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.diagnostics import selftest_cases, selftest_report, selftest_run
from accel_plugin.kernels import limits


def drop_last_block(real):
    """paged_attention that forgets each sequence's last block of keys (a lost split, a bad
    block-table walk): what the self-test is there to catch."""
    def broken(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len, **kwargs):
        q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        shorter = torch.maximum(seq_lens - k_cache.shape[1], q_lens).to(seq_lens.dtype)
        return real(q, k_cache, v_cache, cu_seqlens_q, shorter, block_table, max_seqlen_q, max_seq_len, **kwargs)

    return broken


@pytest.mark.slow
def test_broken_paged_kernel_fails_and_doctor_exits_1(monkeypatch, small_grid, fake_compatibility,
                                                      run_doctor_in_process):
    monkeypatch.setattr(kernels, "paged_attention", drop_last_block(kernels.paged_attention))
    report = selftest_run.run_self_test(kernels=(selftest_cases.PAGED,), with_compatibility=False)
    assert not report.passed and len(report.failed) == len(report.cases) == 4 * len(limits.DTYPE_NAMES)
    for result in report.failed:
        assert result.error > result.tolerance > 0, result
    assert report.summary().startswith(f"FAIL: 0 of {len(report.cases)} cases passed")

    small_grid(selftest_cases.PAGED)
    fake_compatibility()
    status, out = run_doctor_in_process("--json")
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
    report = selftest_run.run_self_test(kernels=(selftest_cases.FLASH, selftest_cases.WRITE_KV), dtypes=("float32",),
                                    with_compatibility=False)
    flash = [c for c in report.cases if c.case.kernel == selftest_cases.FLASH]
    assert flash and all(not c.passed and c.error is None for c in flash)
    assert all(c.message == "RuntimeError: boom: no kernel image for this device" for c in flash)
    assert all(c.passed for c in report.cases if c.case.kernel == selftest_cases.WRITE_KV)
    assert not report.passed
    json.dumps(report.to_dict(), allow_nan=False)


def test_nan_output_is_a_failed_case(monkeypatch):
    monkeypatch.setattr(kernels, "flash_attn_varlen_func", lambda q, *a, **kw: torch.full_like(q, float("nan")))
    (result,) = selftest_run.run_self_test(kernels=(selftest_cases.FLASH,), dtypes=("float16",), with_compatibility=False
                                       ).cases[:1]
    assert not result.passed and result.error is None and "non-finite" in result.message


def test_subprocess_runs_the_cases_in_the_interpreter():
    """The path `accel doctor` takes on CPU when its own process imported the kernels without
    TRITON_INTERPRET: a child process with it set, its JSON read back."""
    report = selftest_run._run_in_subprocess((selftest_cases.WRITE_KV,), ("float32",), why="a test")
    assert report.passed, report.error or [c.message for c in report.failed]
    assert report.where == "a subprocess with TRITON_INTERPRET=1 (this process: a test)"
    assert report.mode == "interpreter" and len(report.cases) == len(selftest_cases.GRID[selftest_cases.WRITE_KV])


def test_a_child_that_dies_is_reported(monkeypatch):
    def crash(command, **kwargs):
        return subprocess.CompletedProcess(command, -11, stdout="", stderr="Fatal Python error: Segmentation fault")

    monkeypatch.setattr(selftest_run.subprocess, "run", crash)
    report = selftest_run._run_in_subprocess(None, None, why="a test")
    assert not report.passed and not report.cases
    assert report.summary() == ("self-test could not run: the subprocess exited -11: "
                                "Fatal Python error: Segmentation fault")
    assert "self-test could not run" in "\n".join(selftest_report.render(report.to_dict()))
