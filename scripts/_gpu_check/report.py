"""gpu-check's markdown report: versions, the device, every test's result, the benchmark's tables."""

from __future__ import annotations

import datetime
import shlex
import subprocess
import sys
from pathlib import Path

from .runs import Run, counts

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
