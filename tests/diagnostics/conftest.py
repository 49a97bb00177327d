"""Shared by the self-test's tests: a smaller grid, a fake compatibility row, `accel doctor`
run in this process, and no developer ACCEL_* setting leaking in."""

from __future__ import annotations

import argparse
import dataclasses
import os

import pytest

from accel_plugin.cli import doctor
from accel_plugin.diagnostics import selftest_cases


@dataclasses.dataclass
class FakeRow:
    """What accel_plugin.diagnostics.compat_environment.environment_row returns."""

    cell: str | None = "vllm-0.32"
    tested: bool = True
    status: str | None = "passed"
    recorded: str | None = "2025-01-02"
    summary: str = "matches matrix cell vllm-0.32: passed on 2025-01-02 (12 passed, 0 failed)"

    def to_dict(self):
        return dataclasses.asdict(self)


@pytest.fixture
def small_grid(monkeypatch):
    """``small_grid(kernel, shapes=1)``: only the first ``shapes`` shapes of ``kernel`` (for every
    dtype), so that `accel doctor --self-test` in this process takes seconds."""
    def limit(kernel, shapes=1):
        monkeypatch.setattr(selftest_cases, "GRID", {kernel: selftest_cases.GRID[kernel][:shapes]})

    return limit


@pytest.fixture
def fake_compatibility(monkeypatch):
    """``fake_compatibility()``: environment_row returns a :class:`FakeRow`, which it returns."""
    def install():
        row = FakeRow()
        from accel_plugin.diagnostics import compat_environment

        monkeypatch.setattr(compat_environment, "environment_row", lambda: row)
        return row

    return install


@pytest.fixture(autouse=True)
def no_accel_env(monkeypatch):
    """The in-process doctor reads os.environ: a developer's ACCEL_* settings must not leak in."""
    for name in [n for n in os.environ if n.startswith("ACCEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def run_doctor_in_process(capsys):
    """``run_doctor_in_process(*flags)``: `accel doctor` in this process; (status, stdout)."""
    def run(*flags):
        args = argparse.Namespace(json="--json" in flags, self_test="--no-self-test" not in flags)
        status = doctor.run(args)
        return status, capsys.readouterr().out

    return run
