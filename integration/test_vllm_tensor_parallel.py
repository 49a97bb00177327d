"""accel-plugin under vLLM tensor parallelism (CPU build, 2 ranks): greedy output
at ``tensor_parallel_size=2`` equals ``tensor_parallel_size=1`` and stock vLLM,
token for token, with each accel attention backend and with the domain proposer.

One subprocess (scripts/vllm_tp_generate.py) builds every engine one after the
other: the ``tp=1`` engines in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, backend
chosen with ``attention_backend=``), the ``tp=2`` engines with vLLM's multiprocess
executor, whose two worker processes are spawned per engine and read
``ACCEL_ATTENTION_BACKEND`` / ``ACCEL_DRAFT_CONFIG`` as a user's would.

On CPU the ranks talk through gloo and vLLM's shared-memory all-reduce. vLLM's
default thread binding (``VLLM_CPU_OMP_THREADS_BIND=auto``) wants one NUMA node per
rank; this machine has one, so the test runs with ``nobind`` (each rank then uses
``OMP_NUM_THREADS`` threads, 1 here). The target is gqa-d64 (4 query heads, 2 KV
heads): each rank runs our kernels on 2 query heads and 1 KV head.

What the proposer does per rank (docs/scale.md, "Tensor parallel"): vLLM builds
one ``DomainDraftProposer`` in every TP rank and calls ``propose`` on each; vLLM
verifies the drafts of TP rank 0 only. The test records a digest of every rank's
drafts, checks they are identical, and makes rank 1 hand vLLM shifted drafts:
output and vLLM's acceptance counters stay those of ``tp=1``.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPTS = Path(__file__).parent / "scripts"
PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"
K = 3
#: 1 token, just under and just over one 32-token block, several blocks.
LENGTHS = (1, 31, 33, 70)
#: Token prompts of 1 token, just under and just over one 32-token block, several
#: blocks (the "default" domain), then text prompts routed to each domain.
_rng = random.Random(0)
PROMPTS = [{"prompt_token_ids": [_rng.randrange(3, 380) for _ in range(n)]} for n in (1, 31, 33, 70)] + [
    "Customer: my refund ticket #123 is late", "Where is my delivery? order 55",
    "def foo(a, b):", "The model is"]
MAX_TOKENS = 12
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
#: proposer counters per domain that must agree between ranks (the rest are timings)
DOMAIN_COUNTERS = ("state", "k", "steps", "drafted", "accepted", "acceptance_per_pos", "by_bucket", "switches")


def draft_config(root: Path, target: Path, partly_good: Path, poor: Path) -> Path:
    """Three domains (identical, partly good, random draft), adaptive k with fixed
    costs: k then depends on acceptance alone, not on a rank's own timings."""
    path = root / "tp-drafts.yaml"
    path.write_text(textwrap.dedent(f"""
        num_speculative_tokens: {K}
        domains:
          support:
            draft: {target}
            match: {{keywords: [refund, delivery, order]}}
          code:
            draft: {poor}
            match: {{regex: ['(?m)^\\s*(def|class|import)\\b']}}
        default:
          draft: {partly_good}
        controller:
          adaptive: true
          draft_cost: 0.05
          verify_overhead: 0.1
          min_samples: 4
          switch_after: 2
          probe_interval: 4
    """).lstrip("\n"))
    return path


def runs_table(config: Path) -> list[dict]:
    """tp=1: stock, flash, paged + proposer; tp=2: flash, paged + proposer (one
    engine per configuration: a tp=2 engine spawns two vLLM processes, about a
    minute on 2 busy cores)."""
    common = {"prompts": PROMPTS, "max_tokens": MAX_TOKENS}
    speculative = {"speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K}}
    return [
        {"label": "stock-tp1", "tp": 1, **common},
        {"label": "flash-tp1", "tp": 1, **common, "engine_kwargs": {"attention_backend": "ACCEL_FLASH"}},
        {"label": "paged-spec-tp1", "tp": 1, **common, "record_drafts": True,
         "env": {"ACCEL_DRAFT_CONFIG": str(config)},
         "engine_kwargs": {**speculative, "attention_backend": "ACCEL_PAGED"}},
        {"label": "flash-tp2", "tp": 2, **common, "env": {"ACCEL_ATTENTION_BACKEND": "flash"}},
        {"label": "paged-spec-tp2", "tp": 2, **common, "record_drafts": True, "perturb_drafts_on_ranks": [1],
         "env": {"ACCEL_ATTENTION_BACKEND": "paged", "ACCEL_DRAFT_CONFIG": str(config)},
         "engine_kwargs": speculative},
    ]


@pytest.fixture(scope="module")
def tp_result(tiny_model_dir, tmp_path_factory):
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_spec_models", SCRIPTS / "vllm_spec_models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    target = tiny_model_dir("gqa-d64")
    root = tmp_path_factory.mktemp("tp")
    config = draft_config(root, target, models.perturbed_copy(target, root / "partly-good", scale=0.03),
                          tiny_model_dir("draft-d32", seed=7))
    # VLLM_CPU_KVCACHE_SPACE (conftest.py) would give each rank 1 GiB: the script's 64 MiB instead
    unset = ("ACCEL_ATTENTION_BACKEND", "ACCEL_DRAFT_CONFIG", "VLLM_CPU_KVCACHE_SPACE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    # ACCEL_METRICS=1: the plugin acts only once an accel variable is set (flash-tp1 uses the flag alone)
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "TMPDIR": str(root), "ACCEL_METRICS": "1"})
    cmd = [sys.executable, str(SCRIPTS / "vllm_tp_generate.py"), str(target),
           "--runs-json", json.dumps(runs_table(config))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=800)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"vLLM failed (exit {proc.returncode}):\n{log[-6000:]}"
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])["runs"], log


def assert_backend_on_every_rank(run: dict, name: str, log: str, ranks: int) -> None:
    """vLLM's layers use ``name`` on each rank, and each rank's process logged it."""
    assert [r["rank"] for r in run["ranks"]] == list(range(ranks))
    assert [r["attention_backends"] for r in run["ranks"]] == [[name]] * ranks
    pids = {r["pid"] for r in run["ranks"]}
    assert len(pids) == ranks
    for pid in pids:
        assert re.search(rf"Using {name} attention backend \(accel-plugin\) in process {pid}\b", log), pid


def test_stock_tp1_reference(tp_result):
    runs, _ = tp_result
    assert [r["attention_backends"] for r in runs["stock-tp1"]["ranks"]] == [["CPU_ATTN"]]
    assert runs["flash-tp1"]["token_ids"] == runs["stock-tp1"]["token_ids"]


@pytest.mark.parametrize("label, backend", [("flash", "ACCEL_FLASH"), ("paged-spec", "ACCEL_PAGED")])
def test_tp2_greedy_equals_tp1_and_stock(tp_result, label, backend):
    runs, log = tp_result
    tp1, tp2 = runs[f"{label}-tp1"], runs[f"{label}-tp2"]
    assert_backend_on_every_rank(tp1, backend, log, ranks=1)
    assert_backend_on_every_rank(tp2, backend, log, ranks=2)  # selected by ACCEL_ATTENTION_BACKEND
    assert tp2["token_ids"] == tp1["token_ids"] == runs["stock-tp1"]["token_ids"]


def test_every_rank_drafts_the_same_and_vllm_verifies_rank_0s(tp_result):
    runs, log = tp_result
    tp1, tp2 = runs["paged-spec-tp1"], runs["paged-spec-tp2"]
    for r in tp2["ranks"]:  # one proposer per rank, in the rank's process
        assert re.search(rf"pid={r['pid']}\).*accel-plugin domain proposer", log), r["pid"]
    (single,) = [r["drafts"] for r in tp1["ranks"]]
    assert single["draft_tokens"] > 0
    for rank in tp2["ranks"]:
        drafts = rank["drafts"]
        assert (drafts["digest"], drafts["calls"], drafts["draft_tokens"]) == \
               (single["digest"], single["calls"], single["draft_tokens"]), rank["rank"]
        assert _counters(drafts["accel"]) == _counters(single["accel"]), rank["rank"]
    # rank 1 handed vLLM shifted drafts; vLLM verified rank 0's: its counters are tp=1's
    assert [r["drafts"]["perturbed"] for r in tp2["ranks"]] == [False, True]
    assert {k: tp2["spec"][k] for k in SPEC_COUNTERS} == {k: tp1["spec"][k] for k in SPEC_COUNTERS}
    assert 0 < tp1["spec"]["num_accepted_tokens"] < tp1["spec"]["num_draft_tokens"], tp1["spec"]
    states = {d: s["state"] for d, s in single["accel"].items()}
    assert states["support"] == "on" and states["code"] == "off", states  # adaptive k decided per domain


def _counters(stats: dict) -> dict:
    return {domain: {k: s[k] for k in DOMAIN_COUNTERS} for domain, s in stats.items()}
