"""accel's draft-model speculation inside real TGI (v3.3.7, CPU with IPEX).

As in test_tgi_attention.py (whose helpers this module uses), the TGI environment's
Python is ``$ACCEL_TGI_PYTHON``; without it every test skips naming what is missing.
Each TGI process costs 10-35 s of imports, so the processes are few and shared:

- ``own``: TGI's own attention (``ATTENTION=flashdecoding-ipex``, the CPU default:
  the case of TGI's ``Seqlen.max_k`` bug), ``--speculate 5``
  (scripts/tgi_spec_generate.py): a tiny Llama whose YAML routes ``support`` to an
  identical draft, ``code`` to a partly good one (a perturbed copy), ``faulty`` to a
  draft that raises on its 3rd call, and the rest to a poor (random) draft, under
  the adaptive controller with fixed costs (``draft_cost``, ``verify_overhead``: its
  decisions depend on acceptance, not on how fast this machine runs the tiny model);
  plain, speculative, and speculative with a batch
  joining mid-generation; then SmolLM2-135M-Instruct with the demo's tuned
  ``support`` draft (demo_models/smollm2/drafts.yaml) on held-out support prompts;
  and two start-up checks (k_max above ``--speculate``; no ``--speculate``);
- ``ours``: the same tiny runs with our attention too (``ACCEL_ATTENTION_BACKEND=flash``,
  ``ATTENTION=paged``);
- ``grpc``: ``text-generation-server serve`` without and with ``--speculate 3``, driven
  over gRPC as TGI's router drives it (scripts/tgi_spec_grpc.py);
- ``crash``: the ``own`` tiny run with the ``Seqlen.max_k`` workaround taken out.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from accel_plugin.kernels import cpu_linear
from accel_plugin.models import store as model_store

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_tgi_attention_test", HERE / "test_tgi_attention.py")
_attention_test = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_attention_test)
TGI_PYTHON, REASON, _env, _result = (_attention_test.TGI_PYTHON, _attention_test.REASON, _attention_test._env,
                                     _attention_test._result)
SCRIPTS = HERE / "scripts"
DEMO = HERE.parent / "demo_models" / "smollm2"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

N = 5  # --speculate
K = 3  # the tiny YAML's num_speculative_tokens (<= N: TGI verifies the widest row's drafts)
SUPPORT = ["Customer: my refund ticket #123 is late", "Where is my delivery? order 55"]
CODE = ["def foo(a, b):", "import os\nclass Model:"]
OTHER = ["The model is", "A small prompt answer", "Question: what is the cache"]
TINY = [SUPPORT[0], CODE[0], OTHER[0], SUPPORT[1], "my phone is broken again", OTHER[1], CODE[1], OTHER[2]]
MAX_NEW_TOKENS = 40
SMOLLM2_PROMPTS = 4


def _support_prompts(n: int) -> list[str]:
    lines = (DEMO / "prompts" / "support-heldout.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines[:n]]


def _build_in_tgi_env(root: Path) -> tuple[Path, Path]:
    """The tiny target and a random draft, built by the TGI environment's transformers (whose
    tokenizer files TGI's 4.51 can read; a newer transformers writes a class it does not know)."""
    code = ("import sys; from accel_plugin.testing.tiny_models import build_tiny_model as build; "
            "print(build('gqa-d64', sys.argv[1])); print(build('draft-d32', sys.argv[1], seed=7))")
    proc = subprocess.run([str(TGI_PYTHON), "-c", code, str(root)], env=_env(), check=False, capture_output=True,
                          text=True, timeout=300, cwd=str(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    target, poor = proc.stdout.split()[-2:]
    return Path(target), Path(poor)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny target, its drafts and YAML files."""
    perturbed_copy = _load("vllm_spec_models").perturbed_copy
    root = tmp_path_factory.mktemp("tgi-spec")
    target, poor = _build_in_tgi_env(root)
    drafts = {"identical": target, "partly_good": perturbed_copy(target, root / "partly-good", scale=0.03),
              "faulty": perturbed_copy(target, root / "faulty", scale=0.03, seed=1), "poor": poor}

    def write(name: str, text: str) -> Path:
        path = root / f"{name}.yaml"
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    config = write("domains", f"""
        num_speculative_tokens: {K}
        domains:
          support:
            draft: {drafts['identical']}
            match: {{keywords: [refund, delivery, order]}}
          code:
            draft: {drafts['partly_good']}
            match: {{regex: ['(?m)^\\s*(def|class|import)\\b']}}
          faulty:
            draft: {drafts['faulty']}
            match: {{keywords: [broken]}}
        default:
          draft: {drafts['poor']}
        # costs given: the decisions follow acceptance alone, not this machine's timings
        # (a tiny target's TGI step costs about one draft forward here, c ~ 0.6: off)
        controller: {{adaptive: true, draft_cost: 0.1, verify_overhead: 0.1}}
    """)
    too_deep = write("too-deep", f"num_speculative_tokens: {N + 1}\ndefault: {{draft: {target}}}\n")
    grpc = write("grpc", f"""
        num_speculative_tokens: 3
        domains:
          support:
            draft: {drafts['identical']}
            match: {{keywords: [refund, delivery, order]}}
        default:
          draft: {drafts['partly_good']}
    """)
    return {"target": target, "config": config, "too_deep": too_deep, "grpc": grpc, "root": root, **drafts}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generate(tiny, *, attention, backend=None, smollm2=None, probes=(), revert_max_k=False, prepack=None):
    runs = ["plain", "spec@tiny"] if revert_max_k else ["plain", "spec@tiny", "spec+join@tiny"]
    cmd = [str(TGI_PYTHON), str(SCRIPTS / "tgi_spec_generate.py"), "--attention", attention, "--speculate", str(N),
           "--model", f"tiny={tiny['target']}", "--config", f"tiny={tiny['config']}", "--install-hook",
           "--max-new-tokens", str(MAX_NEW_TOKENS), "--fault", "faulty:3"]
    prompts = {"tiny": TINY}
    if smollm2 is not None:
        cmd += ["--model", f"smollm2={smollm2}", "--config", f"smollm2={DEMO / 'drafts.yaml'}",
                "--chat", "smollm2", "--stop-at-eos", "smollm2"]
        runs.append("spec@smollm2")
        prompts["smollm2"] = _support_prompts(SMOLLM2_PROMPTS)
    cmd += ["--runs", ",".join(runs)]
    for probe in probes:
        cmd += ["--probe", probe]
    if revert_max_k:
        cmd += ["--revert-max-k"]
    cmd += ["--prompts-json", json.dumps(prompts)]
    env = _env(ACCEL_ATTENTION_BACKEND=backend, ACCEL_DRAFT_CONFIG=str(tiny["config"]), TRITON_INTERPRET=None,
               ACCEL_TGI_PREPACK=prepack)
    return subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=600, cwd=str(tiny["root"]))


_CACHE: dict[str, tuple[dict, str]] = {}


@pytest.fixture(scope="module")
def tgi(tiny):
    """``tgi(name)`` -> (result, stderr) of one shared TGI process (see the module docstring)."""

    def run(name: str):
        if name not in _CACHE:
            if name == "own":
                proc = _generate(tiny, attention="flashdecoding-ipex", smollm2=model_store.cached_path("smollm2"),
                                 probes=[f"tiny={tiny['too_deep']}@{N}", f"tiny={tiny['config']}@0"])
            elif name == "ours":
                proc = _generate(tiny, attention="paged", backend="flash", prepack="off")  # and no copies
            else:
                raise KeyError(name)
            _CACHE[name] = (_result(proc), proc.stderr)
        return _CACHE[name]

    return run


def _tiny(result):
    return result["models"]["tiny"]


def test_tiny_lossless_with_mixed_domains_and_a_joining_batch(tgi):
    result, stderr = tgi("own")
    assert result["errors"] == {} and result["attention"] == "flashdecoding-ipex"
    runs = _tiny(result)["runs"]
    assert [len(ids) for ids in runs["plain"]["ids"]] == [MAX_NEW_TOKENS] * len(TINY)
    assert runs["spec@tiny"]["ids"] == runs["plain"]["ids"]
    assert runs["spec+join@tiny"]["ids"] == runs["plain"]["ids"]
    assert runs["spec@tiny"]["steps"] <= runs["plain"]["steps"]
    assert "draft-model speculation (ACCEL_DOMAIN_DRAFT) replaces TGI's n-gram proposals" in stderr


def test_tgi_own_attention_runs_with_the_max_k_workaround(tgi):
    result, stderr = tgi("own")
    assert result["max_k_patch"] and not result["attention_patch"]
    assert result["paged_attention"].startswith("accel_plugin.adapters.tgi._wrappers.with_full_max_k")
    assert "TGI's Seqlen.max_k workaround applied" in stderr


def test_target_matrices_have_prepacked_copies_only_while_speculating(tgi):
    """adapters/tgi/packed_linears.py: the speculating runs multiply multi-row products with
    packed copies of the matrices (the native few-row product or oneDNN's), the plain ones
    with TGI's own only (the copies dropped), and their greedy ids agree."""
    result, stderr = tgi("own")
    # the native few-row product where this machine builds it (AVX-512F), oneDNN's otherwise
    product = (r"native few-row product \(kernels/csrc/cpu_linear.cpp\)" if cpu_linear.ops() is not None
               else r"oneDNN's prepacked product")
    assert re.search(r"\d+ target matrices with a packed copy for multi-row verification, " + product + r" \(\+\d+ MiB "
                     r"host memory; TGI's F.linear kept for layers up to \d+ rows?, head up to \d+ rows?, measured",
                     stderr), stderr[-3000:]
    runs = _tiny(result)["runs"]
    assert runs["spec@tiny"]["packed"] and runs["spec+join@tiny"]["packed"] and not runs["plain"]["packed"]
    assert runs["spec@tiny"]["ids"] == runs["plain"]["ids"]


def test_identical_draft_is_always_accepted_and_counters_match_tgi(tgi):
    result, _ = tgi("own")
    run = _tiny(result)["runs"]["spec@tiny"]
    stats, counters = run["stats"], run["counters"]
    assert stats["support"]["alpha"] == 1.0 and stats["support"]["accepted"] == stats["support"]["drafted"] > 0
    assert stats["support"]["state"] in ("on", "warmup") and stats["support"]["k"] >= 2
    # what TGI accepted, read from its Generations: tokens beyond the first, rows that went on
    from_generations = sum(n - 1 for step in run["per_step"] for n, stopped in step.values() if not stopped)
    assert from_generations == counters["accepted"] + counters["pad_accepted"]
    assert counters["accepted"] == sum(s["accepted"] for s in stats.values())
    assert 0 < counters["verified_tokens"] <= counters["draft_tokens"] + counters["pad_tokens"]


def test_partly_good_draft_is_accepted_sometimes(tgi):
    stats = _tiny(tgi("own")[0])["runs"]["spec@tiny"]["stats"]
    assert stats["code"]["drafted"] > 0 and 0.2 < stats["code"]["alpha"] < 0.95


def test_poor_draft_is_switched_off_by_the_controller(tgi):
    stats = _tiny(tgi("own")[0])["runs"]["spec@tiny"]["stats"]["default"]
    assert stats["alpha"] < 0.2 and stats["state"] == "off" and stats["k"] == 0
    assert stats["drafted"] < K * stats["steps"]


def test_a_failing_draft_switches_its_domain_off_and_serving_continues(tgi):
    result, stderr = tgi("own")
    tiny = _tiny(result)
    stats = tiny["runs"]["spec@tiny"]["stats"]["faulty"]
    assert stats["state"] == "failed" and "injected fault" in stats["error"]
    assert stderr.count("speculation is off for domain(s) faulty") == 1
    assert tiny["error"] is None  # the model's speculation as a whole stays on
    assert tiny["runs"]["spec@tiny"]["ids"] == tiny["runs"]["plain"]["ids"]


def test_start_up_checks_name_the_settings(tgi, tiny):
    probes = tgi("own")[0]["probes"]
    too_deep = probes[f"tiny={tiny['too_deep']}@{N}"]
    assert too_deep.startswith("DraftConfigError") and f"{N + 1} exceeds TGI's --speculate {N}" in too_deep
    assert f"start TGI with --speculate {N + 1}" in too_deep
    no_speculate = probes[f"tiny={tiny['config']}@0"]
    assert no_speculate.startswith("SpeculationConfigError") and f"--speculate {K}" in no_speculate
    assert "ACCEL_DRAFT_CONFIG" in no_speculate


def test_smollm2_with_the_tuned_support_draft_is_lossless(tgi):
    result, _ = tgi("own")
    if "smollm2" not in result["models"]:
        pytest.skip("SmolLM2-135M-Instruct is not cached (`accel models get smollm2`)")
    runs = result["models"]["smollm2"]["runs"]
    plain, spec = runs["plain"], runs["spec@smollm2"]
    assert spec["ids"] == plain["ids"] and all(plain["ids"])
    support = spec["stats"]["support"]
    assert support["drafted"] > 0 and support["accepted"] > 0
    assert spec["steps"] < plain["steps"]


def test_with_our_attention_too(tgi):
    result, stderr = tgi("ours")
    assert result["errors"] == {} and result["attention_patch"] and not result["max_k_patch"]
    assert result["paged_attention"].startswith("accel_plugin.adapters.tgi.attention")
    runs = _tiny(result)["runs"]
    assert runs["spec@tiny"]["ids"] == runs["plain"]["ids"] == runs["spec+join@tiny"]["ids"]
    assert runs["spec@tiny"]["stats"]["support"]["accepted"] > 0
    assert "TGI attention replaced by ACCEL_FLASH" in stderr
    # ACCEL_TGI_PREPACK=off: TGI's matrices alone, every product F.linear, the same ids
    assert "target matrices left as TGI has them (ACCEL_TGI_PREPACK is off: no copies" in stderr
    assert not runs["spec@tiny"]["packed"] and not runs["spec+join@tiny"]["packed"]


def test_grpc_server_drafts_and_matches_the_plain_server(tiny):
    prompts = [SUPPORT[0], OTHER[0], SUPPORT[1], CODE[0]]
    cmd = [str(TGI_PYTHON), str(SCRIPTS / "tgi_spec_grpc.py"), str(tiny["target"]), "--draft-config", str(tiny["grpc"]),
           "--speculate", "3", "--prompts-json", json.dumps(prompts), "--max-new-tokens-json", "[20, 14, 17, 11]",
           "--install-hook", "--log-dir", str(tiny["root"])]
    env = _env(ACCEL_ATTENTION_BACKEND=None, ACCEL_DRAFT_CONFIG=None, ATTENTION="flashdecoding-ipex",
               PREFIX_CACHING="1", TRITON_INTERPRET=None)
    proc = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=600, cwd=str(tiny["root"]))
    result = _result(proc)
    plain, spec = result["plain"], result["spec"]
    assert [len(ids) for ids in plain["ids"]] == [20, 14, 17, 11]
    assert spec["ids"] == plain["ids"]
    assert spec["decodes"] < plain["decodes"]  # drafts were accepted
    log = Path(spec["log"]).read_text()
    assert "draft-model speculation (ACCEL_DOMAIN_DRAFT) replaces TGI's n-gram proposals" in log, log[-3000:]
    assert "Seqlen.max_k workaround applied" in log
    assert "accel-plugin" not in Path(plain["log"]).read_text()


def test_why_the_max_k_workaround_exists(tiny):
    """Without it, TGI's own flashdecoding-ipex attention ignores the keys past Seqlen.max_k
    when drafts are verified: wrong tokens, or IPEX reads out of bounds and the process
    dies (SIGSEGV; seen with TGI's n-gram at width 5)."""
    proc = _generate(tiny, attention="flashdecoding-ipex", revert_max_k=True)
    if proc.returncode in (-11, 139):
        return
    runs = _tiny(_result(proc))["runs"]
    assert not _result(proc)["max_k_patch"]
    assert runs["spec@tiny"]["ids"] != runs["plain"]["ids"]
