"""The self-test's results and their report: each case's outcome, the whole run's report
(as JSON data and back), and the text table ``accel doctor --self-test`` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .selftest_cases import Case

__all__ = ["CaseResult", "SelfTestReport", "compatibility_line", "render"]

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
    and the environment's row of the compatibility matrix (:func:`.selftest_run.compatibility`)."""

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


def compatibility_line(row: dict[str, Any]) -> str:
    """One line: the matrix's own sentence for this environment, or why it is unknown."""
    if row.get("summary"):
        return f"compatibility: {row['summary']}"
    return f"compatibility: unknown ({row.get('error', 'not checked')})"



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
