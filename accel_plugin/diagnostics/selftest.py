"""Self-test: run each kernel once on this machine against the float64 reference.

``accel doctor --self-test`` (and ``python -m accel_plugin.diagnostics.selftest``) runs a small
fixed grid of cases (:func:`default_cases`): the varlen flash prefill, the paged
kernel (decode, speculative verification and chunked prefill in one batch over a
shuffled block table, plus a long decode through split-K) and the KV-cache write,
for every supported dtype, with head sizes 64, 128 and 80, block sizes 16 and 32
and GQA ratios 1 and 4. Attention cases pass under the tests' accuracy rule
(:mod:`accel_plugin.kernels.tolerance`: twice torch's own error in the dtype plus
the derived floor); the cache write must be exact.

Where the cases run: compiled on CUDA tensors when torch sees a GPU; otherwise in
the Triton interpreter on CPU. Triton fixes the interpreter choice when the
kernels are imported, so when this process imported them without
``TRITON_INTERPRET=1`` (as ``accel doctor`` does, to report the real setting) the
cases run in a subprocess with it set, and the report says so.

Imports :mod:`accel_plugin.kernels` (torch and triton) and, for the matrix row,
:mod:`accel_plugin.diagnostics.compatibility`; never a framework.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from typing import Any

from ..kernels import limits

__all__ = ["Case", "CaseResult", "SelfTestReport", "compatibility", "default_cases", "render", "run_self_test"]

FLASH = "flash_attn_varlen_func"
PAGED = "paged_attention"
WRITE_KV = "write_kv_cache"
KERNELS = (FLASH, PAGED, WRITE_KV)

#: (variant, head size, block size, GQA ratio) per kernel, run for every dtype in
#: limits.DTYPE_NAMES: each head size, block size and ratio appears for each kernel
#: and dtype. 80 is not a power of two (padded to 128 inside the kernels).
GRID: dict[str, tuple[tuple[str, int, int | None, int | None], ...]] = {
    FLASH: (("prefill", 64, None, 4), ("prefill", 128, None, 1), ("prefill", 80, None, 4)),
    PAGED: (("mixed", 64, 16, 1), ("mixed", 128, 32, 4), ("mixed", 80, 16, 4), ("split-K", 64, 32, 1)),
    WRITE_KV: (("write", 64, 16, None), ("write", 128, 32, None), ("write", 80, 16, None)),
}
#: kv heads of every case; query heads = NUM_KV_HEADS * GQA ratio.
NUM_KV_HEADS = 2
#: varlen prefill: causal, one prompt of one token, one not a multiple of any tile.
FLASH_LENS = (1, 17, 40)
#: paged "mixed": decode (1 query), speculative verification (4) and a prefill chunk
#: (9) over cached contexts; "split-K": a 300-token decode cut in NUM_SPLITS pieces
#: next to a short sequence whose last pieces are empty.
PAGED_BATCHES = {"mixed": ((1, 40), (4, 23), (9, 57)), "split-K": ((1, 300), (3, 45))}
NUM_SPLITS = 4
#: tokens written by the cache-write case (one of them padding, slot -1).
WRITE_TOKENS = 21
#: the subprocess that runs the cases in the interpreter (torch import included).
SUBPROCESS_TIMEOUT_S = 600


@dataclass(frozen=True)
class Case:
    """One kernel call: ``block_size`` is None for the flash kernel, ``gqa`` for the cache write."""

    kernel: str
    variant: str
    dtype: str
    head_size: int
    block_size: int | None
    gqa: int | None

    def seed(self) -> int:
        """The case's own random seed: the same inputs whatever else runs."""
        return zlib.crc32(repr(astuple(self)).encode())


@dataclass
class CaseResult:
    """A case's outcome. ``error`` is the max abs error against the float64 reference and
    ``tolerance`` what the accuracy rule allows; ``error`` is None when the kernel raised
    (``tolerance`` too) or its output was not finite, and ``message`` then says which."""

    case: Case
    mode: str
    passed: bool
    error: float | None
    tolerance: float | None
    seconds: float
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.case), "mode": self.mode, "passed": self.passed, "error": self.error,
                "tolerance": self.tolerance, "seconds": round(self.seconds, 4), "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        case = Case(**{name: data[name] for name in Case.__dataclass_fields__})
        return cls(case, data["mode"], data["passed"], data["error"], data["tolerance"], data["seconds"],
                   data.get("message", ""))


@dataclass
class SelfTestReport:
    """Every case's result, where they ran (``device``, ``mode``, ``mode_reason``, ``where``)
    and the environment's row of the compatibility matrix (:func:`compatibility`)."""

    device: str
    mode: str
    mode_reason: str
    where: str
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the self-test itself could not run (no case result then)
    compatibility: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.cases) and not self.failed

    def summary(self) -> str:
        if self.error:
            return f"self-test could not run: {self.error}"
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: {len(self.cases) - len(self.failed)} of {len(self.cases)} cases passed "
                f"in {self.seconds:.1f} s ({self.mode} on {self.device})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "cases": [c.to_dict() for c in self.cases],
            "summary": {"passed": self.passed, "total": len(self.cases), "failed": len(self.failed),
                        "seconds": round(self.seconds, 2), "device": self.device, "mode": self.mode,
                        "mode_reason": self.mode_reason, "where": self.where, "error": self.error,
                        "line": self.summary()},
            "compatibility": self.compatibility,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelfTestReport:
        s = data["summary"]
        return cls(s["device"], s["mode"], s["mode_reason"], s["where"],
                   [CaseResult.from_dict(c) for c in data["cases"]], s["seconds"], s["error"],
                   data.get("compatibility", {}))


def default_cases(kernels: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None) -> list[Case]:
    """The fixed grid (:data:`GRID` x limits.DTYPE_NAMES), optionally only some kernels or dtypes."""
    return [Case(kernel, variant, dtype, head_size, block_size, gqa)
            for kernel, shapes in GRID.items() if kernels is None or kernel in kernels
            for dtype in limits.DTYPE_NAMES if dtypes is None or dtype in dtypes
            for variant, head_size, block_size, gqa in shapes]


# --- the cases -------------------------------------------------------------------------

def _timed(device, call: Callable[[], Any]) -> tuple[Any, float]:
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    result = call()
    sync()
    return result, time.perf_counter() - start


class _Inputs:
    """Random inputs of one case, drawn on the CPU (reproducible) and moved to ``device``."""

    def __init__(self, case: Case, device):
        import torch

        self.torch, self.device = torch, device
        self.dtype = getattr(torch, case.dtype)
        self.gen = torch.Generator().manual_seed(case.seed())

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen).to(self.dtype).to(self.device)

    def int32(self, values):
        return self.torch.tensor(values, dtype=self.torch.int32, device=self.device)

    def cu_seqlens(self, lens):
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return self.int32(cu)

    def block_table(self, seq_lens, block_size):
        """A shuffled block table; each row's trailing entry is a foreign block, so a read past
        seq_len shows in the result. Returns (table, num_blocks)."""
        used = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(used) + 2
        perm = self.torch.randperm(num_blocks, generator=self.gen).tolist()
        rows, start = [], 0
        for n in used:
            rows.append(perm[start:start + n] + [perm[-1]] * (max(used) + 1 - n))
            start += n
        return self.int32(rows), num_blocks


def _run_flash(case: Case, kernels, device) -> tuple[float, float, float]:
    from ..kernels import reference, tolerance

    x = _Inputs(case, device)
    total = sum(FLASH_LENS)
    q = x.randn(total, NUM_KV_HEADS * case.gqa, case.head_size)
    k, v = x.randn(total, NUM_KV_HEADS, case.head_size), x.randn(total, NUM_KV_HEADS, case.head_size)
    cu = x.cu_seqlens(FLASH_LENS)
    longest = max(FLASH_LENS)
    out, seconds = _timed(device, lambda: kernels.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                                         causal=True))
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu, cu, longest, longest,
                                           causal=True)
    lowp = tolerance.TorchLowp().varlen(q, k, v, cu, cu, causal=True)
    err, limit, _ = tolerance.verdict(out, ref, lowp, x.dtype, tolerance.max_score(q, k))
    return err, limit, seconds


def _run_paged(case: Case, kernels, device) -> tuple[float, float, float]:
    from ..kernels import reference, tolerance

    x = _Inputs(case, device)
    q_lens, seq_lens = zip(*PAGED_BATCHES[case.variant])
    table, num_blocks = x.block_table(seq_lens, case.block_size)
    cache_shape = (num_blocks, case.block_size, NUM_KV_HEADS, case.head_size)
    k_cache, v_cache = x.randn(*cache_shape), x.randn(*cache_shape)
    q = x.randn(sum(q_lens), NUM_KV_HEADS * case.gqa, case.head_size)
    cu, lens = x.cu_seqlens(q_lens), x.int32(seq_lens)
    num_splits = NUM_SPLITS if case.variant == "split-K" else 0
    out, seconds = _timed(device, lambda: kernels.paged_attention(
        q, k_cache, v_cache, cu, lens, table, max(q_lens), max(seq_lens), num_splits=num_splits))
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), cu, lens, table,
                                    max(q_lens), max(seq_lens))
    lowp = tolerance.TorchLowp().paged(q, k_cache, v_cache, cu, lens, table)
    err, limit, _ = tolerance.verdict(out, ref, lowp, x.dtype, tolerance.max_score(q, k_cache))
    return err, limit, seconds


def _run_write_kv(case: Case, kernels, device) -> tuple[float, float, float]:
    from ..kernels import reference, tolerance

    x = _Inputs(case, device)
    num_blocks = -(-WRITE_TOKENS // case.block_size) + 2
    cache_shape = (num_blocks, case.block_size, NUM_KV_HEADS, case.head_size)
    k_cache, v_cache = x.randn(*cache_shape), x.randn(*cache_shape)
    k, v = x.randn(WRITE_TOKENS, NUM_KV_HEADS, case.head_size), x.randn(WRITE_TOKENS, NUM_KV_HEADS, case.head_size)
    slots = x.torch.randperm(num_blocks * case.block_size, generator=x.gen)[:WRITE_TOKENS]
    slots[WRITE_TOKENS // 2] = -1  # a padding token: written nowhere
    slots = slots.to(device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    _, seconds = _timed(device, lambda: kernels.write_kv_cache(k, v, k_cache, v_cache, slots))
    reference.write_kv_cache(k, v, ref_k, ref_v, slots)
    err = max(tolerance.max_err(k_cache, ref_k), tolerance.max_err(v_cache, ref_v))
    return err, 0.0, seconds


_RUNNERS = {FLASH: _run_flash, PAGED: _run_paged, WRITE_KV: _run_write_kv}


def run_case(case: Case, device) -> CaseResult:
    """Run one case; a kernel that raises, or a non-finite error, is a failed case."""
    from .. import kernels

    mode = kernels.runtime_mode(device)
    try:
        err, limit, seconds = _RUNNERS[case.kernel](case, kernels, device)
    except Exception as exc:  # the self-test reports a failing kernel, it does not crash
        return CaseResult(case, mode, False, None, None, 0.0, f"{type(exc).__name__}: {exc}")
    if not math.isfinite(err):
        return CaseResult(case, mode, False, None, limit, seconds, f"error is {err} (non-finite output)")
    return CaseResult(case, mode, err <= limit, err, limit, seconds)


# --- where the cases run --------------------------------------------------------------

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
    home = Path(__file__).resolve().parents[1]
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


# --- the compatibility matrix ---------------------------------------------------------

def compatibility() -> dict[str, Any]:
    """This environment's row of the compatibility matrix (accel_plugin.diagnostics.compatibility):
    ``cell``, ``tested``, ``status``, ``recorded``, ``summary``; or ``{"error": reason}``."""
    try:
        from .compatibility import environment_row

        row = environment_row()
        if hasattr(row, "to_dict"):
            return dict(row.to_dict())
        return {name: getattr(row, name) for name in ("cell", "tested", "status", "recorded", "summary")}
    except Exception as exc:  # a missing or broken matrix must not hide the kernels' results
        return {"error": f"{type(exc).__name__}: {exc}"}


def compatibility_line(row: dict[str, Any]) -> str:
    """One line: the matrix's own sentence for this environment, or why it is unknown."""
    if row.get("summary"):
        return f"compatibility: {row['summary']}"
    return f"compatibility: unknown ({row.get('error', 'not checked')})"


# --- output -----------------------------------------------------------------------------

_COLUMNS = (("kernel", 22), ("case", 7), ("dtype", 8), ("head", 4), ("block", 5), ("gqa", 3), ("mode", 11),
            ("error", 8), ("tolerance", 9), ("time", 7), ("result", 6))


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.2e}"


def _row(cells) -> str:
    out = []
    for (name, width), cell in zip(_COLUMNS, cells):
        right = name in ("head", "block", "gqa", "error", "tolerance", "time")
        out.append(f"{cell:>{width}}" if right else f"{cell:<{width}}")
    return "  " + "  ".join(out).rstrip()


def render(data: dict[str, Any]) -> list[str]:
    """Text lines of a report's :meth:`SelfTestReport.to_dict`: where it ran, the table,
    the summary and the compatibility line."""
    summary = data["summary"]
    lines = ["Self-test", f"  {'ran in':<24} {summary['where']}"]
    if summary["mode_reason"]:
        lines.append(f"  {'kernels':<24} {summary['mode']}: {summary['mode_reason']}")
    if data["cases"]:
        lines.append(_row(name for name, _ in _COLUMNS))
    for c in data["cases"]:
        lines.append(_row((c["kernel"], c["variant"], c["dtype"], c["head_size"],
                           "-" if c["block_size"] is None else c["block_size"], "-" if c["gqa"] is None else c["gqa"],
                           c["mode"], _number(c["error"]), _number(c["tolerance"]), f"{c['seconds']:.2f}s",
                           "PASS" if c["passed"] else "FAIL")))
        if c["message"]:
            lines.append(f"    {c['message']}")
    lines += [f"  {summary['line']}", f"  {compatibility_line(data.get('compatibility', {}))}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m accel_plugin.diagnostics.selftest [--json]``: the self-test alone."""
    parser = argparse.ArgumentParser(prog="python -m accel_plugin.diagnostics.selftest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--kernel", action="append", choices=KERNELS, help="only this kernel (repeatable)")
    parser.add_argument("--dtype", action="append", choices=limits.DTYPE_NAMES, help="only this dtype (repeatable)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if torch sees a GPU)")
    parser.add_argument("--no-compatibility", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() or args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    report = run_self_test(args.device,kernels=tuple(args.kernel) if args.kernel else None,
                           dtypes=tuple(args.dtype) if args.dtype else None,
                           with_compatibility=not args.no_compatibility)
    data = report.to_dict()
    print(json.dumps(data, indent=2) if args.json else "\n".join(render(data)))
    return 0 if report.passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
