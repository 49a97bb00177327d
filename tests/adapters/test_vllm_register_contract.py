"""Contract test of the vLLM adapter's ``register()``: a wrong accel setting stops start-up.

vLLM calls every ``vllm.general_plugins`` function without catching what it raises
(``vllm.plugins.load_general_plugins``), so an exception from ``register()`` ends
``vllm serve`` and ``LLM(...)``; integration/test_vllm_bad_settings.py checks that
with a real engine. Here each row calls ``register()`` the way vLLM does, with the
installed vLLM, and checks what it raised or logged and that a failure left vLLM's
own selection in place. All rows run in one fresh process, in order (importing vLLM
takes seconds); a failed ``register()`` undoes itself, so the rows do not interact,
and the rows that register successfully come last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

#: name -> (environment, patch, raised (None: nothing), substring of the message or of a log line)
ROWS: dict[str, tuple[dict[str, str], str | None, str | None, str]] = {
    "backend typo": ({"ACCEL_ATTENTION_BACKEND": "flsh"}, None, "AccelStartupError",
                     "ACCEL_ATTENTION_BACKEND='flsh' is not valid; valid values: flash, paged, auto (or unset)"),
    "plugins empty item": ({"ACCEL_PLUGINS": "a,,b"}, None, "AccelStartupError",
                           "ACCEL_PLUGINS='a,,b' is not valid; valid values: a comma-separated list"),
    "plugin not installed": ({"ACCEL_PLUGINS": "nope"}, None, "AccelStartupError",
                             ("could not install what ACCEL_PLUGINS asks for: PluginLoadError: ACCEL_PLUGINS names "
                              "plugins that are not installed: nope")),
    "trace": ({"ACCEL_TRACE": "verbose"}, None, "AccelStartupError",
              "ACCEL_TRACE='verbose' is not valid; valid values: 1/0, true/false, yes/no, on/off"),
    "metrics": ({"ACCEL_METRICS": "maybe"}, None, "AccelStartupError",
                "ACCEL_METRICS='maybe' is not valid; valid values: 1/0, true/false, yes/no, on/off"),
    "metrics interval": ({"ACCEL_METRICS_LOG_INTERVAL": "nan"}, None, "AccelStartupError",
                         "ACCEL_METRICS_LOG_INTERVAL='nan' is not valid; valid values: a number of seconds >= 0"),
    "draft config missing": ({"ACCEL_DRAFT_CONFIG": "/no/such/drafts.yaml"}, None, "AccelStartupError",
                             "ACCEL_DRAFT_CONFIG='/no/such/drafts.yaml': "),
    "refused on this device": ({"ACCEL_ATTENTION_BACKEND": "flash"}, "cuda70", "AccelStartupError",
                               "ACCEL_ATTENTION_BACKEND=flash refused: ACCEL_FLASH: "),
    "internal failure, backend set": ({"ACCEL_ATTENTION_BACKEND": "paged"}, "boom", "AccelStartupError",
                                      "could not install what ACCEL_ATTENTION_BACKEND asks for: RuntimeError: boom"),
    "nothing set": ({}, "boom", None, "inactive: no ACCEL_* variable is set, so nothing in vLLM or this process"),
    "internal failure, nothing asked": ({"ACCEL_TRACE": "0"}, "boom", None,
                                        "no accel setting asks for anything (ACCEL_ATTENTION_BACKEND, "
                                        "ACCEL_DRAFT_CONFIG, ACCEL_PLUGINS unset), so accel-plugin stays inactive"),
    "metrics dir is a file": ({"ACCEL_METRICS_DIR": "@file"}, None, "AccelStartupError",
                              "is not valid; valid values: a directory path (it may not exist yet); this one is a file"),
    "metrics dir cannot be made": ({"ACCEL_METRICS_DIR": "/proc/accel-metrics"}, None, "AccelStartupError",
                                   "live metrics could not be set up (ACCEL_METRICS_DIR='/proc/accel-metrics'): "),
    "metrics failure, nothing asked": ({"ACCEL_TRACE": "0"}, "metrics", None, "live metrics are off: disk full"),
    "backend set": ({"ACCEL_ATTENTION_BACKEND": "paged"}, None, None, "ACCEL_ATTENTION_BACKEND=paged -> ACCEL_PAGED"),
}

SCRIPT = textwrap.dedent("""
    import dataclasses, json, logging, os, sys, tempfile
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("vllm.accel_plugin").addHandler(Keep())
    logging.getLogger("vllm.accel_plugin").setLevel(logging.INFO)
    import accel_plugin.adapters.vllm as adapter
    import accel_plugin.adapters.vllm.metrics as adapter_metrics
    import accel_plugin.plugins.selection as selection
    from accel_plugin.adapters.vllm import _compat, _patches

    platform_cls = type(_compat.current_platform())
    real = {"select": selection.select_attention_backend, "install": _patches.install,
            "setup": adapter_metrics.setup}
    a_file = tempfile.NamedTemporaryFile(delete=False).name

    def on_old_gpu(context, **kw):
        context = dataclasses.replace(context, device="cuda", cuda_capability=(7, 0))
        return real["select"](context, **kw)

    def boom(*a, **k):
        raise RuntimeError("boom")

    def disk_full(apply_steps):
        raise OSError("disk full")

    PATCHES = {"cuda70": (selection, "select_attention_backend", on_old_gpu),
               "boom": (_patches, "install", boom), "metrics": (adapter_metrics, "setup", disk_full)}
    outcomes = {}
    for name, (env, patch, _, _) in json.loads(sys.argv[1]).items():
        for key in [k for k in os.environ if k.startswith("ACCEL_")]:
            del os.environ[key]
        os.environ.update({k: a_file if v == "@file" else v for k, v in env.items()})
        if patch:
            module, attr, fake = PATCHES[patch]
            setattr(module, attr, fake)
        records.clear()
        try:
            adapter.register()
            out = {"raised": None, "message": ""}
        except Exception as exc:
            out = {"raised": type(exc).__name__, "message": str(exc)}
        from vllm.ray.ray_env import get_env_vars_to_copy
        out.update(registered=adapter._REGISTERED, log=list(records),
                   selector_patched=_patches.installed(platform_cls),
                   ray_copies=sorted(v for v in get_env_vars_to_copy() if v.startswith("ACCEL_")))
        out["applied"] = [entry.name for entry in _patches.LEDGER.applied() if entry.undoable]
        _patches.undo_all()
        outcomes[name] = out
        selection.select_attention_backend = real["select"]
        _patches.install, adapter_metrics.setup = real["install"], real["setup"]
        adapter._REGISTERED = False
    print("OUTCOMES " + json.dumps(outcomes))
""")


@pytest.fixture(scope="module")
def outcomes() -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(ROWS)], env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("OUTCOMES "))
    return json.loads(line[len("OUTCOMES "):])


@pytest.mark.parametrize("row", list(ROWS))
def test_register_stops_start_up_on_a_wrong_setting(outcomes, row):
    _, _, raised, needle = ROWS[row]
    out = outcomes[row]
    assert out["raised"] == raised, out
    if raised:
        assert needle in out["message"], out["message"]
        assert out["message"].startswith("accel-plugin: ")
        assert out["message"].endswith("fix the setting, or unset it to run vLLM without accel-plugin")
        assert not out["registered"] and not out["selector_patched"], out
    else:
        assert any(needle in line for line in out["log"]), out["log"]


def test_with_nothing_set_register_applies_nothing(outcomes):
    """No ACCEL_* variable: register() installs nothing (the failing install is never reached)."""
    out = outcomes["nothing set"]
    assert out["registered"] and not out["selector_patched"] and out["applied"] == [], out
    assert out["ray_copies"] == [], out


def test_a_failure_with_nothing_asked_leaves_vllm_as_without_the_plugin(outcomes):
    out = outcomes["internal failure, nothing asked"]
    assert not out["registered"] and not out["selector_patched"] and out["applied"] == [], out


def test_a_metrics_failure_with_nothing_asked_only_turns_metrics_off(outcomes):
    out = outcomes["metrics failure, nothing asked"]
    assert out["registered"], out
    assert any("metrics: off" in line for line in out["log"]), out["log"]


def test_accel_settings_reach_ray_workers(outcomes):
    """vLLM's Ray executor copies only listed variables to its workers (other nodes
    included): after register() its own get_env_vars_to_copy() lists the accel ones."""
    assert outcomes["backend set"]["registered"]
    # with the metric files' directory register() made (workers on this node write there)
    assert outcomes["backend set"]["ray_copies"] == ["ACCEL_ATTENTION_BACKEND", "ACCEL_METRICS_DIR"]
    # every change of a successful register() is in the ledger, and undone by undo_all()
    assert outcomes["backend set"]["applied"] == ["selector", "CPU backend override", "metrics directory", "metrics collector",
                                                  "metrics directory cleanup", "Ray worker environment"]
    # nothing asked of accel-plugin: vLLM's setting is left alone
    assert outcomes["metrics failure, nothing asked"]["ray_copies"] == []
