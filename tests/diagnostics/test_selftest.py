"""`accel doctor --self-test`: every kernel once against its reference, a pass/fail table,
the compatibility line, and exit status 1 on any failure (accel_plugin/diagnostics/selftest.py).

The first test runs the command as a user does (a subprocess, TRITON_INTERPRET unset, so
the cases run in the interpreter in a child process); the others run small parts of
the grid in this process, where tests/conftest.py has set TRITON_INTERPRET=1. The
self-test's parts have their own files: test_selftest_cases.py, test_selftest_run.py,
test_selftest_report.py (shared helpers: conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accel_plugin.diagnostics import selftest_cases, selftest_run
from accel_plugin.kernels import limits


ACCEL = shutil.which("accel", path=str(Path(sys.executable).parent)) or "accel"


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
        assert report["kernels"]["mode"] == "torch"  # this process, as the user set it up
        assert summary["mode"] == "interpreter" and "subprocess with TRITON_INTERPRET=1" in summary["where"]
        assert {c["mode"] for c in self_test["cases"]} == {"interpreter"}
    assert {c["dtype"] for c in self_test["cases"]} == set(limits.DTYPE_NAMES)
    assert {c["kernel"] for c in self_test["cases"]} == set(selftest_cases.KERNELS)
    for c in self_test["cases"]:
        assert c["error"] <= c["tolerance"] and c["seconds"] >= 0
    assert "summary" in self_test["compatibility"] or "error" in self_test["compatibility"]
    assert summary["seconds"] < 120, summary


def test_doctor_without_the_flag_runs_no_self_test(monkeypatch, run_doctor_in_process):
    monkeypatch.setattr(selftest_run, "run_self_test", lambda *a, **kw: pytest.fail("self-test ran"))
    status, out = run_doctor_in_process("--json", "--no-self-test")
    assert status == 0 and "self_test" not in json.loads(out)
