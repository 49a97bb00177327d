"""Running the self-test: one case, the whole grid on a device, or the grid in a child
process with ``TRITON_INTERPRET=1``, and this environment's row of the compatibility matrix.

Triton fixes the interpreter choice when the kernels are imported, so when this
process imported them without ``TRITON_INTERPRET=1`` (as ``accel doctor`` does, to
report the real setting) the CPU cases run in a subprocess with it set
(``python -m accel_plugin.diagnostics.selftest``), and the report says so.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .selftest_cases import RUNNERS, Case, default_cases
from .selftest_report import CaseResult, SelfTestReport

__all__ = ["compatibility", "run_case", "run_self_test"]

#: the subprocess that runs the cases in the interpreter (torch import included).
SUBPROCESS_TIMEOUT_S = 600


def run_case(case: Case, device) -> CaseResult:
    """Run one case; a kernel that raises, or a non-finite error, is a failed case."""
    from .. import kernels

    mode = kernels.runtime_mode(device)
    try:
        err, limit, seconds = RUNNERS[case.kernel](case, kernels, device)
    except Exception as exc:  # the self-test reports a failing kernel, it does not crash
        return CaseResult(case, mode, False, None, None, 0.0, f"{type(exc).__name__}: {exc}")
    if not math.isfinite(err):
        return CaseResult(case, mode, False, None, limit, seconds, f"error is {err} (non-finite output)")
    return CaseResult(case, mode, err <= limit, err, limit, seconds)


def _default_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_self_test(device=None, *, kernels: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None,
                  with_compatibility: bool = True) -> SelfTestReport:
    """Run the grid (optionally only some ``kernels`` / ``dtypes``) on ``device`` (default:
    cuda if torch sees one, else cpu) and return the report; never raises for a kernel's fault.

    On CPU the cases need the Triton interpreter; if this process's kernels were jitted
    without it, they run in a subprocess with ``TRITON_INTERPRET=1``.
    """
    start = time.perf_counter()
    try:
        import torch

        from .. import kernels as kernel_pkg

        dev = _default_device() if device is None else torch.device(device)
        mode, reason = kernel_pkg.runtime_mode(dev), kernel_pkg.runtime_mode_reason(dev)
    except Exception as exc:
        report = SelfTestReport("unknown", "unavailable", "", "this process",
                                error=f"accel_plugin.kernels cannot be imported: {type(exc).__name__}: {exc}")
    else:
        if dev.type == "cpu" and mode != "interpreter":
            report = _run_in_subprocess(kernels, dtypes, why=reason)
        else:
            report = SelfTestReport(str(dev), mode, reason, "this process")
            report.cases = [run_case(case, dev) for case in default_cases(kernels, dtypes)]
    report.seconds = time.perf_counter() - start
    if with_compatibility:
        report.compatibility = compatibility()
    return report


def _run_in_subprocess(kernels, dtypes, why: str) -> SelfTestReport:
    """The cases in a fresh interpreter with TRITON_INTERPRET=1 (set before it imports the kernels)."""
    command = [sys.executable, "-m", "accel_plugin.diagnostics.selftest", "--json", "--no-compatibility", "--device", "cpu"]
    for kernel in kernels or ():
        command += ["--kernel", kernel]
    for dtype in dtypes or ():
        command += ["--dtype", dtype]
    where = f"a subprocess with TRITON_INTERPRET=1 (this process: {why})"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # Run from the folder holding this accel_plugin, which `-m` puts first on sys.path: the
    # child imports the same package as this process, whatever the current directory holds.
    home = Path(__file__).resolve().parents[2]
    try:
        proc = subprocess.run(command, env=env, cwd=home, capture_output=True, text=True,
                              timeout=SUBPROCESS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SelfTestReport("cpu", "interpreter", "", where, error=f"the subprocess failed: {exc}")
    try:
        report = SelfTestReport.from_dict(json.loads(proc.stdout))
    except (ValueError, KeyError, TypeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return SelfTestReport("cpu", "interpreter", "", where,
                              error=f"the subprocess exited {proc.returncode}: " + " | ".join(tail))
    report.where = where
    return report



def compatibility() -> dict[str, Any]:
    """This environment's row of the compatibility matrix (accel_plugin.diagnostics.compat_environment):
    ``cell``, ``tested``, ``status``, ``recorded``, ``summary``; or ``{"error": reason}``."""
    try:
        from .compat_environment import environment_row

        row = environment_row()
        if hasattr(row, "to_dict"):
            return dict(row.to_dict())
        return {name: getattr(row, name) for name in ("cell", "tested", "status", "recorded", "summary")}
    except Exception as exc:  # a missing or broken matrix must not hide the kernels' results
        return {"error": f"{type(exc).__name__}: {exc}"}
