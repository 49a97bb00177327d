"""`make gpu-check`: on a machine with a CUDA GPU, run the kernel tests compiled and the
attention benchmark, and write one markdown report.

    python scripts/gpu_check.py --report gpu-report.md [--wheels DIR] [--bench-args="--quick"]
    python scripts/gpu_check.py --download-wheels DIR [--python-version 3.10]

Made for a borrowed GPU machine whose image has torch and triton but none of our
other dependencies, possibly without network access. In order:

1. Refuses, exit status 2, before installing anything, unless torch sees a CUDA GPU.
2. Installs what the kernel tests need and the image lacks, nothing else (pytest,
   pytest-timeout, hypothesis, pluggy and their dependencies; setuptools to build
   accel-plugin), with ``pip install --no-deps``; from ``--wheels DIR`` (``pip install
   --no-index --find-links DIR``) when given. ``--download-wheels DIR``, run on a
   machine with network, fills such a folder (pure-python wheels, any platform).
3. Installs this checkout as ``accel-plugin`` (``pip install --no-deps
   --no-build-isolation -e .``) unless ``accel_plugin.kernels`` already imports from it.
4. Runs tests/kernels with TRITON_INTERPRET unset (kernels compiled, small shapes on
   cuda, ``gpu``-marked realistic shapes), in a few pytest processes side by side
   (compiling is CPU-bound), then ``python -m benchmarks.attention`` alone on the GPU.
5. Writes the report: versions, the device, every test's result, the benchmark's tables.

Logs and JUnit XML files go to build/gpu-check/.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import signal
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "build" / "gpu-check"
REFUSED = 2

#: (distribution, pip requirement, minimum version, only below this python): what
#: tests/kernels needs besides torch and triton, dependencies included (installed --no-deps).
REQUIREMENTS = (
    ("pluggy", "pluggy>=1.6", (1, 6), None),
    ("pytest", "pytest>=8", (8,), None),
    ("iniconfig", "iniconfig>=2", (2,), None),
    ("packaging", "packaging>=24", (24,), None),
    ("Pygments", "Pygments>=2.15", (2, 15), None),
    ("exceptiongroup", "exceptiongroup>=1", (1,), (3, 11)),
    ("tomli", "tomli>=2", (2,), (3, 11)),
    ("pytest-timeout", "pytest-timeout>=2", (2,), None),
    ("hypothesis", "hypothesis>=6", (6,), None),
    ("sortedcontainers", "sortedcontainers>=2.1", (2, 1), None),
    ("setuptools", "setuptools>=70.1", (70, 1), None),  # builds the editable install of accel-plugin
)
IMPORT_CHECK = "import pytest, pytest_timeout, hypothesis, pluggy"

#: pytest processes run side by side: (name, test files); "the rest" takes every other file.
GROUPS = (
    ("gpu: realistic shapes", ["tests/kernels/test_gpu.py"]),
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


def version_tuple(text: str) -> tuple[int, ...]:
    """(9, 2, 0) for "9.2.0", (1, 0) for "1.0rc1": the leading release numbers."""
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def missing_requirements(version_of=installed_version, python=sys.version_info[:2]) -> list[str]:
    """The pip requirements of REQUIREMENTS that are absent here or older than their minimum."""
    missing = []
    for dist, requirement, minimum, python_below in REQUIREMENTS:
        if python_below and tuple(python) >= python_below:
            continue
        version = version_of(dist)
        if version is None or version_tuple(version) < minimum:
            missing.append(requirement)
    return missing


def externally_managed() -> bool:
    """PEP 668: a distribution's python that pip refuses to install into without a flag."""
    if sys.prefix != sys.base_prefix:  # a virtual environment
        return False
    return (Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists()


def pip_install_command(args: list[str], wheels: str | None, break_system: bool) -> list[str]:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
    if wheels:
        command += ["--no-index", "--find-links", wheels]
    else:  # fail fast where nothing outside can be reached
        command += ["--retries", "0", "--timeout", "20"]
    if break_system:
        command.append("--break-system-packages")
    return command + args


def download_wheels(folder: str, python_version: str) -> int:
    """Pure-python wheels of every requirement, for ``--wheels`` on a machine without network."""
    specs = [requirement for _, requirement, _, _ in REQUIREMENTS]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", "any",
               "--implementation", "py", "--abi", "none", "--python-version", python_version, "-d", folder, *specs]
    print("+", shlex.join(command), flush=True)
    return subprocess.run(command).returncode


def cuda_refusal() -> str | None:
    """Why this machine cannot run the check, or None when torch sees a CUDA GPU."""
    try:
        import torch
    except ImportError as exc:
        return (f"gpu-check needs torch with CUDA; {sys.executable} cannot import torch ({exc}). "
                "Run it with the python that has torch: make gpu-check GPU_PYTHON=/path/to/python")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (f"gpu-check needs a CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__}, "
                f"{build}). Nothing was installed or run.")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"gpu-check needs triton next to torch; it cannot be imported ({exc}). Nothing was installed or run."
    return None


def accel_plugin_from_here() -> bool:
    """True when ``accel_plugin.kernels`` imports, from this checkout, as the tests will see it."""
    code = "import accel_plugin.kernels as k; print(k.__file__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    return result.returncode == 0 and Path(result.stdout.strip()).resolve() == REPO / "kernels" / "__init__.py"


def install(wheels: str | None) -> list[str]:
    """Install what is missing; returns what was done, for the report. Raises on failure."""
    notes = []
    break_system = externally_managed()
    missing = missing_requirements()
    if missing:
        command = pip_install_command(missing, wheels, break_system)
        print("+", shlex.join(command), flush=True)
        subprocess.run(command, check=True)
        notes.append(f"installed (--no-deps): {', '.join(missing)}" + (f" from {wheels}" if wheels else ""))
    else:
        notes.append("test tools: all present, nothing installed")
    check = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"the test tools do not import after installing: {check.stderr.strip()[-500:]}")
    if accel_plugin_from_here():
        notes.append("accel-plugin: accel_plugin.kernels already imports from this checkout")
    else:
        command = pip_install_command(["--no-build-isolation", "-e", str(REPO)], wheels, break_system)
        print("+", shlex.join(command), flush=True)
        subprocess.run(command, check=True)
        if not accel_plugin_from_here():
            raise RuntimeError("accel_plugin.kernels still does not import from this checkout after pip install -e")
        notes.append("accel-plugin: installed from this checkout (pip install --no-deps --no-build-isolation -e .)")
    if break_system:
        notes.append("this python is externally managed (PEP 668): pip ran with --break-system-packages")
    return notes


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


def environment() -> list[tuple[str, str]]:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    driver = "n/a"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return [
        ("date (UTC)", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("python", f"{sys.version.split()[0]} ({sys.executable})"),
        ("torch", torch.__version__),
        ("triton", triton.__version__),
        ("CUDA (torch build)", str(torch.version.cuda)),
        ("cuDNN", str(torch.backends.cudnn.version())),
        ("driver", driver),
        ("device", f"{props.name}, capability sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
                   f"{props.total_memory / 2**30:.0f} GiB"),
        ("GPUs visible", str(torch.cuda.device_count())),
        ("TRITON_INTERPRET", "unset for every run (compiled kernels)"),
    ]


def _cell(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= limit else text[:limit] + " ..."
    return text.replace("|", "\\|")


def render_report(command: str, env: list[tuple[str, str]], notes: list[str], groups: list[Run],
                  bench: Run | None) -> str:
    """The markdown report: summary, environment, every test, the benchmark's output."""
    all_cases = [c for run in groups for c in run.cases]
    bad = [run for run in groups if run.incomplete]
    lines = ["## GPU check", "", f"- command: `{command}`",
             f"- tests: {counts(all_cases)}" + (f"; incomplete: {', '.join(r.name for r in bad)}" if bad else ""),
             "- benchmark: " + ("not run" if bench is None else "timed out" if bench.timed_out
                                else "ok" if bench.returncode == 0 else f"exit status {bench.returncode}"),
             "", "### Environment", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in env]
    lines += ["", "Set-up: " + "; ".join(notes) + ".", "", "### Tests", "",
              "| group | result | seconds | exit status |", "|---|---|---|---|"]
    for run in groups:
        status = f"killed at the deadline ({run.seconds:.0f} s)" if run.timed_out else str(run.returncode)
        lines.append(f"| {run.name} | {counts(run.cases)} | {run.seconds:.0f} | {status} |")
    failures = [c for c in all_cases if c.outcome in ("failed", "error")]
    if failures:
        lines += ["", "Failures:", ""] + [f"- `{c.test}`: {_cell(c.message, 600)}" for c in failures]
    for run in groups:
        lines += ["", f"#### {run.name}", "", f"`python {shlex.join(run.command[1:])}`", ""]
        if run.cases:
            lines += ["| test | result | seconds | note |", "|---|---|---|---|"]
            lines += [f"| `{c.test}` | {c.outcome} | {c.seconds:.2f} | {_cell(c.message, 160)} |" for c in run.cases]
        if run.incomplete or not run.cases:
            lines += ["", "Last lines of its output:", "", "```", *run.output.splitlines()[-25:], "```"]
    lines += ["", "### Benchmark", ""]
    if bench is None:
        lines.append("Not run.")
    else:
        lines += [f"`python {shlex.join(bench.command[1:])}` ({bench.seconds:.0f} s)", ""]
        if bench.returncode == 0:
            lines.append(bench.output.strip())
        else:
            state = "killed at the deadline" if bench.timed_out else f"exit status {bench.returncode}"
            lines += [f"{state}; last lines of its output:", "", "```", *bench.output.splitlines()[-40:], "```"]
    return "\n".join(lines) + "\n"


def write_report(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    print(f"report written to {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default="gpu-report.md", help="the markdown report to write")
    parser.add_argument("--wheels", help="install missing packages from this folder only (offline)")
    parser.add_argument("--bench-args", default="--quick", help='options of benchmarks.attention ("" = full run)')
    parser.add_argument("--test-timeout", type=float, default=180.0, help="seconds for all test processes")
    parser.add_argument("--bench-timeout", type=float, default=150.0, help="seconds for the benchmark")
    parser.add_argument("--download-wheels", metavar="DIR", help="only fill DIR with the wheels for --wheels")
    parser.add_argument("--python-version", default="3.10", help="for --download-wheels: the GPU's python")
    args = parser.parse_args(argv)
    if args.download_wheels:
        return download_wheels(args.download_wheels, args.python_version)
    refusal = cuda_refusal()
    if refusal:
        print(refusal, file=sys.stderr)
        return REFUSED
    if args.wheels and not Path(args.wheels).is_dir():
        print(f"--wheels {args.wheels}: no such folder", file=sys.stderr)
        return REFUSED
    command = "python scripts/gpu_check.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        notes = install(args.wheels)
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"gpu-check: set-up failed: {exc}", file=sys.stderr)
        write_report(args.report, render_report(command, environment(), [f"set-up failed: {exc}"], [], None))
        return 1
    env = environment()
    groups = [pytest_run(name, paths, WORK / f"junit-{i}.xml") for i, (name, paths) in enumerate(test_groups())]
    print(f"running {len(groups)} pytest processes side by side (up to {args.test_timeout:.0f} s)", flush=True)
    run_side_by_side(groups, args.test_timeout, "tests")
    for index, run in enumerate(groups):
        junit = WORK / f"junit-{index}.xml"
        run.cases = parse_junit(junit) if not run.timed_out and junit.exists() else parse_verbose(run.output)
        print(f"  {run.name}: {counts(run.cases)}" + (" (killed at the deadline)" if run.timed_out else ""))
    bench = Run("benchmark", [sys.executable, "-m", "benchmarks.attention", *shlex.split(args.bench_args),
                              "--output", str(WORK / "benchmark.md")])
    print(f"running python {shlex.join(bench.command[1:])} (up to {args.bench_timeout:.0f} s)", flush=True)
    run_side_by_side([bench], args.bench_timeout, "benchmark")
    tables = WORK / "benchmark.md"
    if bench.returncode == 0 and tables.exists():
        bench.output = tables.read_text()  # the tables without warnings printed on the way
    write_report(args.report, render_report(command, env, notes, groups, bench))
    failed = any(c.outcome in ("failed", "error") for run in groups for c in run.cases)
    incomplete = any(run.incomplete for run in groups)
    return 1 if failed or incomplete or bench.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
