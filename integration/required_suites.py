"""A pytest plugin: in CI, a suite that should have run and skipped fails the run.

The TGI tests skip without TGI's own environment and the SmolLM2 tests skip without
the real model: right on a developer's machine that lacks them, wrong in CI, where a
green run must mean they ran. Which suites are required:

* ``ACCEL_REQUIRE`` set: the suites it names, comma separated (``tgi``, ``smollm2``;
  empty = none); an unknown name stops the run naming the valid ones;
* else ``CI`` true (``1``/``true``/``yes``/``on``, as CI services set it): ``smollm2``,
  and ``tgi`` when the TGI wheel is at hand (``$TGI_WHEELS``, default
  ``../shared/wheels``, as ``make tgi-env`` reads it);
* else none: skips stay skips.

A required suite fails the run, naming what is missing and the fix, when a test
skipped for its reason (anywhere in the session), or when tests of its files were
deselected (``-k``, ``-m``). Skips for other reasons ("needs a CUDA GPU") stay skips,
listed by ``-ra`` as always. Loaded by
integration/conftest.py (:func:`register`), so it guards every session that
collects integration/ (``make test``, .ci/run).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

__all__ = ["REQUIREMENTS", "RequiredSuites", "register", "required"]

REPO = Path(__file__).resolve().parents[1]
#: the file ``make tgi-env`` builds TGI's environment from (scripts/tgi_env.sh)
TGI_WHEEL = "text_generation_server-2.0.5.dev0-py3-none-any.whl"
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Requirement:
    name: str
    what: str  #: what is missing when it fails
    fix: str
    files: tuple[str, ...]  #: basename patterns of its test files
    reason: re.Pattern  #: skip reasons that mean "what is missing"


REQUIREMENTS = {r.name: r for r in (
    Requirement("tgi", "TGI's own environment", "make tgi-env (scripts/tgi_env.sh, from the TGI wheel); "
                "ACCEL_TGI_PYTHON names its python", ("test_tgi_*.py",),
                re.compile(r"TGI environment|TGI's constraints file")),
    Requirement("smollm2", "the real model SmolLM2-135M-Instruct", "make models (accel models get smollm2)",
                ("*smollm2*.py",), re.compile(r"smollm2", re.IGNORECASE)),
)}


def _tgi_wheel_present(environ) -> bool:
    folder = Path(environ.get("TGI_WHEELS") or REPO.parent / "shared" / "wheels")
    return (folder / TGI_WHEEL).is_file()


def required(environ=None) -> tuple[list[str], str]:
    """(required suite names, why) for ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("ACCEL_REQUIRE")
    if raw is not None:
        names = [n.strip() for n in raw.split(",") if n.strip()]
        unknown = [n for n in names if n not in REQUIREMENTS]
        if unknown:
            raise ValueError(f"ACCEL_REQUIRE={raw!r}: unknown suite {', '.join(unknown)}; valid: "
                             f"{', '.join(REQUIREMENTS)} (comma separated, empty = none)")
        return names, "ACCEL_REQUIRE"
    if environ.get("CI", "").strip().lower() in _TRUE:
        names = ["tgi"] * _tgi_wheel_present(environ) + ["smollm2"]
        return names, "CI is set" + ("" if "tgi" in names else " (tgi: no TGI wheel here)")
    return [], "neither ACCEL_REQUIRE nor CI is set"


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class RequiredSuites:
    """The plugin object: notes, per required suite, the skips that hid it and its
    deselected tests; fails the session at its end."""

    def __init__(self, names: list[str], why: str):
        self.why = why
        self.suites = [REQUIREMENTS[n] for n in names]
        self.deselected = {n: 0 for n in names}
        self.hidden: dict[str, list[tuple[str, str]]] = {n: [] for n in names}
        self.problems: list[str] = []

    def _owns(self, suite: Requirement, nodeid: str) -> bool:
        name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        return any(fnmatch(name, pattern) for pattern in suite.files)

    def pytest_report_header(self, config):
        names = ", ".join(s.name for s in self.suites) or "none"
        return f"required suites (integration/required_suites.py): {names} ({self.why})"

    def pytest_deselected(self, items):
        for item in items:
            for suite in self.suites:
                self.deselected[suite.name] += self._owns(suite, item.nodeid)

    def pytest_runtest_logreport(self, report):
        for suite in self.suites:
            if report.skipped and not hasattr(report, "wasxfail"):
                reason = _skip_reason(report)
                if suite.reason.search(reason):
                    self.hidden[suite.name].append((report.nodeid, reason))

    def pytest_sessionfinish(self, session, exitstatus):
        for suite in self.suites:
            hidden, name = self.hidden[suite.name], suite.name
            if hidden:
                nodeid, reason = hidden[0]
                self.problems.append(f"{name}: {len(hidden)} test(s) skipped for want of {suite.what}, e.g. "
                                     f"{nodeid}: {reason}; fix: {suite.fix}")
            if self.deselected[name]:
                self.problems.append(f"{name}: {self.deselected[name]} of its test(s) deselected (-k/-m); "
                                     "a run that requires it must run them all")
        if self.problems and session.exitstatus in (0, 5):
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter):
        if not self.problems:
            return
        terminalreporter.section("required suites did not run", sep="=", red=True, bold=True)
        terminalreporter.line(f"required because {self.why}; this run fails:")
        for problem in self.problems:
            terminalreporter.line(f"  {problem}", red=True)


def register(config) -> None:
    """Register the plugin once per session (several conftests may call this)."""
    if config.pluginmanager.has_plugin("accel-required-suites"):
        return
    try:
        names, why = required()
    except ValueError as exc:
        import pytest

        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(RequiredSuites(names, why), "accel-required-suites")
