"""With no accel variable set, installing accel-plugin changes nothing in real vLLM (CPU build).

Two fresh processes, each: vLLM builds an engine (``LLM(...)``, which loads the general
plugins itself, in-process with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so that the engine
core and the worker are this process too) and generates greedily; then a snapshot of
every target of the vLLM adapter's patch ledger (iterated, never listed), ``os.environ``,
the collectors of ``prometheus_client.REGISTRY``, the ``atexit`` handler count and
``sys.meta_path``. One process loads the plugin (vLLM calls its ``register()``), the
other does not (``VLLM_PLUGINS`` names no plugin: vLLM loads only the plugins it lists,
``vllm.plugins.load_plugins_by_group``). The snapshots must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

PROMPTS = ["The model is", "def foo("]
#: variables vLLM itself sets to a fresh random name in every process (compared by presence)
PER_RUN_NAMES = ("VLLM_DIST_IDENT", "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME")

SCRIPT = textwrap.dedent("""
    import atexit, json, os, sys
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256,
              kv_cache_memory_bytes=32 * 2**20, max_num_seqs=4, seed=0)
    outputs = llm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
    import prometheus_client

    def describe(value):
        if isinstance(value, (str, int, float, bool, type(None))):
            return value
        if isinstance(value, (tuple, list)):
            return [describe(v) for v in value]
        if isinstance(value, frozenset):  # ids of live objects: only the count compares across processes
            return len(value)
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        name = getattr(value, "name", None)  # an enum member
        if isinstance(name, str) and not callable(value):
            return f"{type(value).__name__}.{name}"
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__qualname__)}"

    adapter = sys.modules.get("accel_plugin.adapters.vllm")
    snapshot = {
        "register_ran": bool(adapter is not None and adapter._REGISTERED),
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "environ": {k: "<set>" if k in json.loads(sys.argv[3]) else v for k, v in os.environ.items()
                    if k != "VLLM_PLUGINS"},
        "registry": sorted(f"{type(c).__module__}.{type(c).__qualname__}"
                           for c in prometheus_client.REGISTRY._collector_to_names),
        "atexit_callbacks": atexit._ncallbacks(),
        "meta_path": [f"{type(f).__module__}.{type(f).__qualname__}" if not isinstance(f, type)
                      else f"{f.__module__}.{f.__qualname__}" for f in sys.meta_path],
    }
    from accel_plugin.adapters.vllm import _patches  # after the snapshot above: reading the targets imports it
    snapshot["ledger"] = {entry.name: describe(entry.state()) for entry in _patches.LEDGER}
    snapshot["applied"] = [entry.name for entry in _patches.LEDGER.applied()]
    print("SNAPSHOT " + json.dumps(snapshot))
""")


def _snapshot(model_dir, plugins: str | None) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_") and k != "VLLM_PLUGINS"}
    environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if plugins is not None:
        environ["VLLM_PLUGINS"] = plugins
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir), json.dumps(PROMPTS),
                           json.dumps(PER_RUN_NAMES)], env=environ,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SNAPSHOT "))
    return json.loads(line[len("SNAPSHOT "):])


def test_with_no_setting_vllm_is_left_as_without_the_plugin(tiny_model_dir):
    model_dir = tiny_model_dir("gqa-d32")
    loaded = _snapshot(model_dir, plugins=None)  # every installed general plugin, ours included
    without = _snapshot(model_dir, plugins="")  # VLLM_PLUGINS lists none: vLLM loads no plugin
    assert loaded.pop("register_ran"), "vLLM did not call accel-plugin's register()"
    assert not without.pop("register_ran"), "VLLM_PLUGINS='' still loaded accel-plugin"
    # every target of the ledger (8 entries), the environment, the registry, atexit, sys.meta_path
    assert set(loaded["ledger"]) == set(without["ledger"]) and len(loaded["ledger"]) >= 8
    for key in ("ledger", "environ", "registry", "atexit_callbacks", "meta_path", "applied", "token_ids"):
        assert loaded[key] == without[key], (key, loaded[key], without[key])
