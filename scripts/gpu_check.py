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
   cuda, ``gpu``-marked realistic shapes, CUDA-graph capture and replay of decode and
   speculative-verify steps), in a few pytest processes side by side (compiling is
   CPU-bound), then ``python -m benchmarks.attention`` alone on the GPU.
5. Writes the report: versions, the device, every test's result, the benchmark's tables.

Logs and JUnit XML files go to build/gpu-check/. The steps live in scripts/_gpu_check/:
provision (1-3), runs (4), report (5).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from _gpu_check import provision, report, runs  # scripts/ is on sys.path: this file's folder

REFUSED = 2


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
        return provision.download_wheels(args.download_wheels, args.python_version)
    refusal = provision.cuda_refusal()
    if refusal:
        print(refusal, file=sys.stderr)
        return REFUSED
    if args.wheels and not Path(args.wheels).is_dir():
        print(f"--wheels {args.wheels}: no such folder", file=sys.stderr)
        return REFUSED
    command = "python scripts/gpu_check.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        notes = provision.install(args.wheels)
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"gpu-check: set-up failed: {exc}", file=sys.stderr)
        report.write_report(args.report, report.render_report(command, report.environment(), [f"set-up failed: {exc}"], [], None))
        return 1
    env = report.environment()
    groups = [runs.pytest_run(name, paths, runs.WORK / f"junit-{i}.xml")
              for i, (name, paths) in enumerate(runs.test_groups())]
    print(f"running {len(groups)} pytest processes side by side (up to {args.test_timeout:.0f} s)", flush=True)
    runs.run_side_by_side(groups, args.test_timeout, "tests")
    for index, run in enumerate(groups):
        junit = runs.WORK / f"junit-{index}.xml"
        run.cases = runs.parse_junit(junit) if not run.timed_out and junit.exists() else runs.parse_verbose(run.output)
        print(f"  {run.name}: {runs.counts(run.cases)}" + (" (killed at the deadline)" if run.timed_out else ""))
    bench = runs.Run("benchmark", [sys.executable, "-m", "benchmarks.attention", *shlex.split(args.bench_args),
                                   "--output", str(runs.WORK / "benchmark.md")])
    print(f"running python {shlex.join(bench.command[1:])} (up to {args.bench_timeout:.0f} s)", flush=True)
    runs.run_side_by_side([bench], args.bench_timeout, "benchmark")
    tables = runs.WORK / "benchmark.md"
    if bench.returncode == 0 and tables.exists():
        bench.output = tables.read_text()  # the tables without warnings printed on the way
    report.write_report(args.report, report.render_report(command, env, notes, groups, bench))
    failed = any(c.outcome in ("failed", "error") for run in groups for c in run.cases)
    incomplete = any(run.incomplete for run in groups)
    return 1 if failed or incomplete or bench.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
