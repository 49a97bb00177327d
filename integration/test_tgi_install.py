"""Installing accel-plugin into TGI's environment moves none of TGI's pins.

pip resolves ``pip install <this checkout>`` in the TGI environment
(``$ACCEL_TGI_PYTHON``, built by ``make tgi-env``) without installing anything
(``--dry-run --report``): with TGI's constraints file, and as a user without it.
Every package pip would install must be accel-plugin itself or one TGI's
environment does not have yet; a version change of an installed package fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TGI_PYTHON = Path(os.environ.get("ACCEL_TGI_PYTHON", "~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python")).expanduser()
CONSTRAINTS = Path(os.environ.get("TGI_WHEELS", REPO.parent / "shared" / "wheels")) / "tgi-3.3.7-cpu-constraints.txt"

pytestmark = pytest.mark.skipif(not TGI_PYTHON.exists(),
                                reason=f"needs a TGI environment: {TGI_PYTHON} not found (make tgi-env; docs/tgi.md)")


def _installed() -> dict[str, str]:
    out = subprocess.run([str(TGI_PYTHON), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                         check=True).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def _would_install(tmp_path, *extra: str) -> dict[str, str]:
    report = tmp_path / "report.json"
    proc = subprocess.run([str(TGI_PYTHON), "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                           *extra, str(REPO)], capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in items}


@pytest.mark.parametrize("with_constraints", [True, False], ids=["tgi-constraints", "plain-pip"])
def test_pip_install_keeps_every_tgi_pin(tmp_path, with_constraints):
    if with_constraints and not CONSTRAINTS.exists():
        pytest.skip(f"TGI's constraints file {CONSTRAINTS} is not here")
    installed = _installed()
    assert "text-generation-server" in installed and "torch" in installed
    plan = _would_install(tmp_path, *(["-c", str(CONSTRAINTS)] if with_constraints else []))
    assert "accel-plugin" in plan
    moved = {name: (installed[name], version) for name, version in plan.items()
             if name != "accel-plugin" and name in installed and installed[name] != version}
    assert not moved, f"installing accel-plugin would change TGI's packages (installed, new): {moved}"
    # the kernels' requirement is met by the triton that TGI's torch pins
    assert "triton" not in plan and "torch" not in plan
