"""accel attention inside real TGI (v3.3.7, CPU with IPEX), activated by the import hook.

TGI's server cannot come from PyPI; these tests use a prepared TGI environment
(docs/tgi.md): its Python is ``$ACCEL_TGI_PYTHON`` (default
``~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python``), with accel-plugin installed
into it. Without it they skip, naming what is missing.

Each TGI process costs 10-35 s of imports, so one process serves one ATTENTION mode
(TGI reads it at import) and runs every configuration on the same loaded models
(scripts/tgi_generate.py): ``ACCEL_ATTENTION_BACKEND=flash`` at start (the import
hook activates it), TGI's own attention (``uninstall()``), then ``paged`` and
``flash`` (``activate()``), with batches joined mid-generation (chunked prefill
under ``flashdecoding-ipex``: one forward pass mixes fresh prompts and decode rows)
and with n-gram speculation (k+1 decode rows per sequence). Greedy token ids must
equal TGI's own, our functions must have run (call counters), and the INFO line
must say what was replaced.

Models: a tiny Llama (accel_plugin.testing.tiny_models ``gqa-d64``, head size 64,
GQA 4/2, built in the TGI environment) and SmolLM2-135M-Instruct (30 layers, GQA
9/3, from accel_plugin.models.store; skipped when not cached). On CPU the kernels run
their pure-torch reference, except in the gRPC test: ``text-generation-server
serve`` with ``TRITON_INTERPRET=1`` on the tiny model runs the Triton kernels in the
interpreter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from accel_plugin.models import store as model_store

SCRIPTS = Path(__file__).parent / "scripts"
TGI_PYTHON = Path(os.environ.get("ACCEL_TGI_PYTHON", "~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python")).expanduser()
NEEDED = ("text_generation_server", "intel_extension_for_pytorch", "accel_plugin")

WORDS = ("the model will draft a token for the customer and the kernel reads the cache block by block while "
         "the support team answers the question about the refund order and the delivery of python code")
#: Mixed lengths: one token, a few, about 20, and a prompt longer than a 64-token block.
PROMPTS = ["x", "the cache block", "Customer: my order ticket #123 is slow but the support team will answer",
           "def fast_model(a, b): return " + WORDS + " " + WORDS]
MAX_NEW_TOKENS = 10
#: n-gram speculation on the tiny model only: SmolLM2 repeats itself, drafts get accepted, and
#: TGI v3.3.7's own n-gram path then overruns ``all_input_ids_tensor`` near max_new_tokens
#: (a TGI bug, with its attention as with ours).
RUNS = "env,own,paged,own+join,flash+join,paged+join,flash+spec2@tiny"
#: The configurations whose ids must equal TGI's own, and that reference run.
EXPECT = {"env": "own", "paged": "own", "flash+join": "own+join", "paged+join": "own+join",
          "flash+spec2@tiny": "own"}


def _unavailable() -> str | None:
    if not TGI_PYTHON.exists():
        return f"needs a TGI environment: {TGI_PYTHON} not found (set ACCEL_TGI_PYTHON; see docs/tgi.md)"
    code = f"import importlib.util as u; print(','.join(m for m in {NEEDED!r} if u.find_spec(m) is None))"
    proc = subprocess.run([str(TGI_PYTHON), "-c", code], check=False, capture_output=True, text=True, cwd="/")
    missing = proc.stdout.strip() if proc.returncode == 0 else "(python failed)"
    if missing:
        return f"the TGI environment {TGI_PYTHON} lacks {missing} (see docs/tgi.md)"
    return None


REASON = _unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _env(**overrides):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", **overrides}
    return {k: v for k, v in env.items() if v is not None}


def _result(proc) -> dict:
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tgi-models")


@pytest.fixture(scope="module")
def smollm2():
    return model_store.cached_path("smollm2")


_CACHE: dict[str, tuple[dict, str]] = {}


@pytest.fixture(scope="module")
def tgi_run(models_dir, smollm2):
    """``tgi_run(mode)`` -> (result, stderr) of scripts/tgi_generate.py, one process per mode."""

    def run(mode: str):
        if mode not in _CACHE:
            models = ["--model", "tiny=tiny:gqa-d64"]
            if smollm2 is not None:
                models += ["--model", f"smollm2={smollm2}"]
            if mode == "flashdecoding-ipex":  # the gRPC test's reference (see there)
                models += ["--model", "tiny_f16=tiny:gqa-d64@float16"]
            cmd = [str(TGI_PYTHON), str(SCRIPTS / "tgi_generate.py"), "--attention", mode, *models,
                   "--models-dir", str(models_dir), "--runs", RUNS, "--chunk-len", "16", "--install-hook",
                   "--prompts-json", json.dumps(PROMPTS), "--max-new-tokens", str(MAX_NEW_TOKENS)]
            proc = subprocess.run(cmd, env=_env(ACCEL_ATTENTION_BACKEND="flash", TRITON_INTERPRET=None),
                                  check=False, capture_output=True, text=True, timeout=600, cwd=str(models_dir))
            _CACHE[mode] = (_result(proc), proc.stderr)
        return _CACHE[mode]

    return run


MODES = ["paged", "flashdecoding-ipex"]


@pytest.mark.parametrize("mode", MODES)
def test_import_hook_activates_and_uninstall_restores(tgi_run, mode):
    result, stderr = tgi_run(mode)
    assert result["attention"] == mode and result["errors"] == {}
    assert result["active_at_import"] and result["backend_at_import"] == "ACCEL_FLASH"
    env, own = result["runs"]["env"], result["runs"]["own"]
    assert env["llama_module_bound_to_ours"] == [True, True] and env["rebound_modules"] >= 20
    assert own["llama_module_bound_to_ours"] == [False, False] and own["rebound_modules"] == 0
    line = re.search(r"TGI attention replaced by ACCEL_FLASH \(ACCEL_ATTENTION_BACKEND=flash; "
                     rf"ATTENTION={mode}, block size (\d+)\): attention and paged_attention rebound in (\d+) modules",
                     stderr)
    assert line, stderr[-3000:]
    assert int(line.group(1)) == result["block_size"] and int(line.group(2)) >= 20


def _hook_file_installed() -> bool:
    """Whether the TGI environment has our .pth file (a regular install; not an editable one)."""
    proc = subprocess.run([str(TGI_PYTHON), "-m", "accel_plugin.adapters.tgi", "status", "--json"],
                          check=False, capture_output=True, text=True, cwd="/", env=_env(ACCEL_ATTENTION_BACKEND=None))
    return json.loads(proc.stdout)["hook_file_installed"]


def test_the_pth_file_is_what_activates_when_installed(tgi_run):
    result, _ = tgi_run("paged")
    # Without the file (editable install) the script installed the hook itself.
    assert result["hook_from_pth"] == _hook_file_installed()


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
@pytest.mark.parametrize("mode", MODES)
def test_greedy_ids_equal_tgi_attention(tgi_run, smollm2, mode, model):
    if model == "smollm2" and smollm2 is None:
        pytest.skip("SmolLM2-135M-Instruct is not cached (`accel models get smollm2`)")
    result, _ = tgi_run(mode)
    runs = result["runs"]
    for run, reference in EXPECT.items():
        if model not in runs[run]["models"]:
            continue  # a run limited to other models
        ours, theirs = runs[run]["models"][model], runs[reference]["models"][model]
        assert ours["ids"] == theirs["ids"], f"{mode} {model}: {run} != {reference}"
        calls = ours["calls"]
        assert calls.get("attention", 0) > 0 and calls.get("paged_attention", 0) > 0, (run, calls)
        if run.startswith("paged"):
            assert calls.get("flash_kernel", 0) == 0, (run, calls)
    assert runs["own"]["models"][model]["calls"] == {}  # TGI's own attention, nothing of ours
    if mode == "flashdecoding-ipex":  # chunked prefill: a step with fresh prompts next to cache readers
        assert runs["flash+join"]["models"][model]["calls"]["both_kernels"] > 0


def test_grpc_server_with_triton_interpreter(tgi_run, models_dir):
    """`text-generation-server serve` (TGI's own CLI) with ACCEL_ATTENTION_BACKEND=flash, the
    Triton kernels interpreted; ids equal TGI's own attention in-process (same batch).

    float16: serve loads float16 or bfloat16 only, and in bfloat16 this random model has a
    near-tie at the 2nd token of "the cache block" (logprobs 0.03 apart, one bfloat16 step)
    that rounding decides either way. Only the first 8 tokens are compared: the 9th is
    another near-tie (0.007 apart in float32; float16 rounding in TGI's kernels picks the
    other token than the interpreter, which accumulates in float32)."""
    result, _ = tgi_run("flashdecoding-ipex")
    log = models_dir / "grpc-server.log"
    cmd = [str(TGI_PYTHON), str(SCRIPTS / "tgi_grpc.py"), result["model_paths"]["tiny_f16"], "--dtype", "float16",
           "--prompts-json", json.dumps(PROMPTS), "--max-new-tokens", str(MAX_NEW_TOKENS), "--install-hook",
           "--log", str(log)]
    env = _env(ACCEL_ATTENTION_BACKEND="flash", ATTENTION="flashdecoding-ipex", PREFIX_CACHING="1",
               TRITON_INTERPRET="1")
    proc = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=600, cwd=str(models_dir))
    grpc = _result(proc)
    assert grpc["hook_route"] == ("pth" if _hook_file_installed() else "sitecustomize")
    server_log = log.read_text()
    assert "TGI attention replaced by ACCEL_FLASH" in server_log, server_log[-3000:]
    assert "TRITON_INTERPRET=1: Triton interpreter" in server_log
    reference = result["runs"]["own"]["models"]["tiny_f16"]["ids"]
    assert [len(ids) for ids in grpc["ids"]] == [MAX_NEW_TOKENS] * len(PROMPTS)
    assert [ids[:8] for ids in grpc["ids"]] == [ids[:8] for ids in reference]


def test_unsupported_attention_mode_is_refused_at_start_up(models_dir):
    code = ("from accel_plugin.adapters import tgi; tgi.install_import_hook(); "
            "import text_generation_server.layers.attention")
    env = _env(ACCEL_ATTENTION_BACKEND="flash", ATTENTION="flashdecoding", PREFIX_CACHING="1", TRITON_INTERPRET=None)
    proc = subprocess.run([str(TGI_PYTHON), "-c", code], env=env, check=False, capture_output=True, text=True, timeout=300,
                          cwd=str(models_dir))
    assert proc.returncode != 0
    assert "does not support ATTENTION=flashdecoding (supported: paged, flashdecoding-ipex" in proc.stderr
    assert "unset ACCEL_ATTENTION_BACKEND to use TGI's own attention" in proc.stderr
