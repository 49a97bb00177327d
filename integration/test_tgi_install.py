"""Installing accel-plugin into TGI's environment: what it adds, what it moves, what it runs.

pip resolves ``pip install <this checkout>`` in the TGI environment
(``$ACCEL_TGI_PYTHON``, built by ``make tgi-env``) without installing anything
(``--dry-run --report``): with TGI's constraints file, and as a user without it.
Every package pip would install must be accel-plugin itself or one TGI's
environment does not have yet; a version change of an installed package fails.
The packages there that only accel-plugin requires are exactly pluggy and
google-re2 (docs/tgi.md says so). And the ``.pth`` file the install put there
imports nothing of accel_plugin (nor pluggy) into a Python process of that
environment, variables set or not, until the process imports TGI.
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


def test_accel_plugin_adds_pluggy_and_google_re2_and_nothing_else():
    """The distributions of TGI's environment that accel-plugin requires and nothing else does."""
    code = (
        "import json\n"
        "from importlib import metadata\n"
        "from packaging.requirements import Requirement\n"
        "from packaging.utils import canonicalize_name as c\n"
        "dists = {c(d.metadata['Name']): d for d in metadata.distributions()}\n"
        "needed = {}\n"
        "for name, d in dists.items():\n"
        "    for r in map(Requirement, d.requires or []):\n"
        "        # accel-plugin's extras (tune, models, test) are not installed into TGI's environment\n"
        "        if name == 'accel-plugin' and r.marker is not None and not r.marker.evaluate({'extra': ''}):\n"
        "            continue\n"
        "        needed.setdefault(c(r.name), set()).add(name)\n"
        "print(json.dumps(sorted(n for n, by in needed.items() if by == {'accel-plugin'} and n in dists)))\n"
    )
    proc = subprocess.run([str(TGI_PYTHON), "-c", code], capture_output=True, text=True, check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["google-re2", "pluggy"]


def _hook_file_installed() -> bool:
    proc = subprocess.run([str(TGI_PYTHON), "-m", "accel_plugin.adapters.tgi", "status", "--json"], check=False,
                          capture_output=True, text=True, cwd="/")
    return json.loads(proc.stdout)["hook_file_installed"]


PROBE = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('accel_plugin', 'pluggy')), "
         "[type(f).__name__ for f in sys.meta_path if getattr(f, 'owner', None) == 'accel-plugin-tgi'])")


def _probe(before: str = "", **variables) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_") and k != "PYTHONPATH"}
    proc = subprocess.run([str(TGI_PYTHON), "-c", before + PROBE], env={**env, **variables}, capture_output=True,
                          text=True, check=False, cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("variables", [{}, {"ACCEL_ATTENTION_BACKEND": "flash"},
                                       {"ACCEL_DRAFT_CONFIG": "/srv/drafts.yaml", "ACCEL_ATTENTION_BACKEND": "paged"}],
                         ids=["unset", "attention", "both"])
def test_python_in_tgis_environment_imports_nothing_of_accel_plugin(variables):
    if not _hook_file_installed():
        pytest.fail(f"{TGI_PYTHON}'s site-packages lacks this checkout's accel_plugin_tgi.pth: run `make tgi-env` "
                    "(a regular install) or `python -m accel_plugin.adapters.tgi install-hook`")
    assert _probe(**variables) == ("[] ['ImportTrigger']" if variables else "[] []")


def test_importing_tgi_fires_the_trigger_into_the_import_hook():
    if not _hook_file_installed():
        pytest.fail(f"{TGI_PYTHON}'s site-packages lacks this checkout's accel_plugin_tgi.pth: run `make tgi-env`")
    out = _probe("import text_generation_server; ", ACCEL_ATTENTION_BACKEND="flash")
    assert "'accel_plugin.adapters.tgi'" in out and "'pluggy'" in out and out.endswith("['PostImportFinder']")
