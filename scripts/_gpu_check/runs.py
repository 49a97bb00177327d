"""gpu-check's test and benchmark processes: the pytest groups, run side by side under a
deadline, and their results read back (JUnit XML, or ``pytest -v`` lines when killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from .provision import REPO

WORK = REPO / "build" / "gpu-check"

#: pytest processes run side by side: (name, test files); "the rest" takes every other file.
GROUPS = (
    ("gpu: realistic shapes", ["tests/kernels/test_gpu.py"]),
    ("gpu: CUDA graphs, capture and replay", ["tests/kernels/test_gpu_cuda_graphs.py"]),
    ("flash_attn, small shapes", ["tests/kernels/test_flash_attn.py"]),
    ("paged_attn and kv_cache, small shapes", ["tests/kernels/test_paged_attn.py", "tests/kernels/test_kv_cache.py"]),
    ("property tests", ["tests/kernels/test_properties.py"]),
    ("codegen sm_80 / sm_90", ["tests/kernels/test_cuda_codegen.py"]),
)
#: the benchmark runs on its own after the tests; its quick smoke test would only repeat it
DESELECT = ["tests/kernels/test_benchmarks.py::test_quick_run_prints_tables"]


@dataclass
class Case:
    test: str
    outcome: str  # passed, failed, error, skipped
    seconds: float = 0.0
    message: str = ""


@dataclass
class Run:
    """One subprocess: a pytest group or the benchmark."""

    name: str
    command: list[str]
    returncode: int | None = None  # None: killed at the deadline
    seconds: float = 0.0
    output: str = ""
    cases: list[Case] = field(default_factory=list)

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def incomplete(self) -> bool:
        """Killed, or pytest stopped short of reporting results (exit 1 = tests failed, 5 = none)."""
        return self.returncode not in (0, 1, 5)


def test_groups() -> list[tuple[str, list[str]]]:
    listed = {path for _, paths in GROUPS for path in paths}
    rest = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "kernels").glob("test_*.py")
                  if str(p.relative_to(REPO)) not in listed)
    return [*GROUPS, ("the rest of tests/kernels", rest)]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled kernels
    env["PYTHONUNBUFFERED"] = "1"  # complete logs even when a process is killed at the deadline
    return env


def run_side_by_side(runs: list[Run], timeout: float, tag: str, cwd: Path = REPO) -> None:
    """Start every run at once; kill what is left at the deadline; fill in returncode, output,
    seconds. Each run's output is also kept in build/gpu-check/TAG-INDEX.log."""
    WORK.mkdir(parents=True, exist_ok=True)
    started = []
    for index, run in enumerate(runs):
        log = open(WORK / f"{tag}-{index}.log", "w+")
        proc = subprocess.Popen(run.command, cwd=cwd, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append((run, proc, log, time.monotonic()))
    deadline = time.monotonic() + timeout
    for run, proc, log, start in started:
        try:
            run.returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            run.returncode = None
        run.seconds = time.monotonic() - start
        log.seek(0)
        run.output = log.read()
        log.close()


def pytest_run(name: str, paths: list[str], junit: Path) -> Run:
    command = [sys.executable, "-m", "pytest", *paths, "-v", "-rA", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *[f"--deselect={d}" for d in DESELECT]]
    return Run(name, command)


def parse_junit(path: Path) -> list[Case]:
    cases = []
    for element in ElementTree.parse(path).iter("testcase"):
        test = f"{element.get('classname', '')}::{element.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = element.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (found.get("message") or found.text or "").strip()
                break
        cases.append(Case(test, outcome, float(element.get("time") or 0.0), message))
    return cases


def parse_verbose(output: str) -> list[Case]:
    """Results that ``pytest -v`` printed before the process was killed (no JUnit file then)."""
    words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped"}
    cases = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "::" in parts[0] and parts[1] in words:
            cases.append(Case(parts[0], words[parts[1]]))
    return cases


def counts(cases: list[Case]) -> str:
    order = ("passed", "failed", "error", "skipped")
    found = {o: sum(c.outcome == o for c in cases) for o in order}
    return ", ".join(f"{n} {o}" for o, n in found.items() if n) or "no tests"
