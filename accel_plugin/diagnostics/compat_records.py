"""The compatibility matrix's recorded results: one :class:`Record` per cell in
``compat_results.json`` (package data next to this file, so that an installed
``accel doctor`` can say whether its environment was tested), written by the cell's
nox session from what pytest reported and what the environment read back (never by
hand), under a file lock (cells may run in parallel)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .compat_cells import CELLS, cell

__all__ = ["RESULTS_PATH", "Record", "load_records", "save_record"]

#: Where the recorded results live (package data, so that an installed
#: ``accel doctor`` can say whether its environment was tested).
RESULTS_PATH = Path(__file__).with_name("compat_results.json")


@dataclass
class Record:
    """What one cell's run produced (``status``: passed, failed, or not-run)."""

    cell: str
    status: str
    date: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float | None = None
    command: str = ""
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_records(path: Path = RESULTS_PATH) -> dict[str, Record]:
    """The recorded results by cell id (empty if nothing was recorded yet)."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {entry["cell"]: Record(**entry) for entry in raw["records"]}


def save_record(record: Record, path: Path = RESULTS_PATH) -> None:
    """Replace the record of ``record.cell`` (the others are kept), in matrix order."""
    cell(record.cell)  # an unknown cell is an error, not a new row
    with _locked(path):  # cells may run in parallel (two nox processes)
        records = load_records(path)
        records[record.cell] = record
        order = {c.id: i for i, c in enumerate(CELLS)}
        ordered = sorted(records.values(), key=lambda r: order.get(r.cell, len(order)))
        path.write_text(json.dumps({"records": [r.to_dict() for r in ordered]}, indent=1) + "\n")


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s ``.lock`` file (POSIX; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
