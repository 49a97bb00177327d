"""accel attention backends inside real vLLM (CPU build): greedy output equals
vLLM's own CPU backend (CPU_ATTN), token for token.

Each subprocess builds several engines one after the other (the stock backend and
ours, selected with ``attention_backend=``), so vLLM is imported once per
configuration; the tests of ``ACCEL_ATTENTION_BACKEND`` run an engine in a process
of their own, since the variable is read once per process. Kernels run under the
Triton interpreter (TRITON_INTERPRET=1, set by conftest.py).

Block size 32 everywhere: vLLM's CPU_ATTN accepts multiples of 32 only, and the
comparison needs the same cache geometry on both sides.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).parent / "scripts" / "vllm_generate.py"
BLOCK = {"block_size": 32}
#: 1 token, just under and just over one block, several blocks.
LENGTHS = (1, 31, 33, 70)
MAX_TOKENS = 8
STOCK = {"label": "stock", "engine_kwargs": {}}
FLASH = {"label": "ACCEL_FLASH", "engine_kwargs": {"attention_backend": "ACCEL_FLASH"}}
PAGED = {"label": "ACCEL_PAGED", "engine_kwargs": {"attention_backend": "ACCEL_PAGED"}}


def token_prompts(lengths, seed=0, prefix=()):
    """Prompts as token ids (exact lengths), optionally after a shared ``prefix``."""
    rng = random.Random(seed)
    return [{"prompt_token_ids": list(prefix) + [rng.randrange(3, 380) for _ in range(n)]} for n in lengths]


def generate(model_dir, prompts, *, runs=None, env=None, engine_kwargs=None, max_tokens=MAX_TOKENS,
             dtype="float32", extra_args=(), timeout=600):
    """Run scripts/vllm_generate.py in a subprocess; returns (result, log)."""
    environ = {k: v for k, v in os.environ.items() if k != "ACCEL_ATTENTION_BACKEND"}
    environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # the plugin acts only once an accel variable is set; with the flag alone, one that selects nothing
    environ.setdefault("ACCEL_METRICS", "1")
    environ.update(env or {})
    cmd = [
        sys.executable, str(SCRIPT), str(model_dir),
        "--prompts-json", json.dumps(prompts),
        "--max-tokens", str(max_tokens),
        "--dtype", dtype,
        "--engine-kwargs-json", json.dumps({**BLOCK, **(engine_kwargs or {})}),
        *extra_args,
    ]
    if runs is not None:
        cmd += ["--runs-json", json.dumps(runs)]
    proc = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return None, log
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), log


def checked(result_log):
    result, log = result_log
    assert result is not None, f"vLLM failed:\n{log[-6000:]}"
    return result, log


def assert_same_tokens(runs: dict, reference: str = "stock"):
    expected = runs[reference]["token_ids"]
    for label, run in runs.items():
        if label == reference:
            continue
        assert run["attention_backends"] == [label], (label, run["attention_backends"])
        for i, (got, want) in enumerate(zip(run["token_ids"], expected)):
            assert got == want, f"{label}, prompt {i}: {got} != stock {want}"


#: bf16: the Triton interpreter upcasts bf16 to fp32 inside the kernels while
#: CPU_ATTN computes in bf16, so the two may pick different tokens where two
#: candidates are nearly tied (seen on an AMD EPYC: 0.016 nats apart at the first
#: step of a 70-token prompt). Criterion, per prompt (as vLLM's check_logprobs_close):
#: up to and including the first step where the tokens differ, every logprob both
#: report agrees within BF16_LOGPROB_ATOL (nats); at that step each side's token is
#: among the other's top logprobs, within BF16_LOGPROB_ATOL of the other's pick (a
#: near tie, not a wrong distribution); after it the contexts differ and are not compared.
BF16_LOGPROB_ATOL = 0.1
BF16_RUNS = [
    {"label": "stock-bf16", "engine_kwargs": {"dtype": "bfloat16"}},
    {"label": "ACCEL_FLASH-bf16", "engine_kwargs": {"dtype": "bfloat16", "attention_backend": "ACCEL_FLASH"}},
]


# gqa-d32 runs the same prompt lengths in the ACCEL_ATTENTION_BACKEND test below.
@pytest.mark.parametrize("model", ["mha-d64"])
def test_greedy_matches_stock_across_prompt_lengths(tiny_model_dir, model):
    runs = [STOCK, FLASH, PAGED] + (BF16_RUNS if model == "mha-d64" else [])
    result, _ = checked(generate(tiny_model_dir(model), token_prompts(LENGTHS), runs=runs,
                                 extra_args=["--logprobs", "3"]))
    runs = result["runs"]
    assert runs["stock"]["attention_backends"] == ["CPU_ATTN"]
    assert_same_tokens({k: runs[k] for k in ("stock", "ACCEL_FLASH", "ACCEL_PAGED")})
    if model == "mha-d64":
        assert_bf16_close(runs["ACCEL_FLASH-bf16"], runs["stock-bf16"])


def assert_bf16_close(ours, stock):
    assert ours["attention_backends"] == ["ACCEL_FLASH"]
    for i, (got, want) in enumerate(zip(ours["token_ids"], stock["token_ids"])):
        same = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), len(got))
        for step in range(min(same + 1, len(got))):
            a, b = ours["logprobs"][i][step], stock["logprobs"][i][step]
            assert set(a) & set(b), (i, step, a, b)
            for tok in set(a) & set(b):
                assert abs(a[tok] - b[tok]) <= BF16_LOGPROB_ATOL, (i, step, tok, a[tok], b[tok])
        if same < len(got):
            a, b = ours["logprobs"][i][same], stock["logprobs"][i][same]
            mine, theirs = str(got[same]), str(want[same])
            assert mine in b and theirs in a, f"prompt {i} step {same}: {got} vs {want}, not a near tie: {a} {b}"
            assert a[mine] - a[theirs] <= BF16_LOGPROB_ATOL and b[theirs] - b[mine] <= BF16_LOGPROB_ATOL, (
                i, same, a, b)


# Chunked prefill (a 32-token budget cuts the long prompts into chunks, mixed with
# decodes and fresh prompts in one step) and prefix caching (prompts sharing a
# 40-token prefix, one of them generated first so its full block is cached).
SHARED_PREFIX = [r % 370 + 5 for r in range(0, 40 * 7, 7)]
#: Whole lengths 41, 75 (shared prefix) and 1, 31, 33.
CHUNKED_PROMPTS = token_prompts((1, 35), seed=1, prefix=SHARED_PREFIX) + token_prompts((1, 31, 33), seed=2)
PREFIX_ARGS = ["--prefix-prompts-json", json.dumps(token_prompts((3,), seed=3, prefix=SHARED_PREFIX))]
CHUNKED = {"max_num_batched_tokens": 32, "enable_prefix_caching": True, "enable_chunked_prefill": True}
CHUNKED_RUNS = [
    {"label": "stock", "engine_kwargs": CHUNKED},
    {"label": "ACCEL_FLASH", "engine_kwargs": {**CHUNKED, "attention_backend": "ACCEL_FLASH"}},
    {"label": "ACCEL_PAGED", "engine_kwargs": {**CHUNKED, "attention_backend": "ACCEL_PAGED"}},
    # Baseline for the ACCEL_ATTENTION_BACKEND tests below (default scheduler).
    {"label": "stock-default", "engine_kwargs": {}},
]


@pytest.fixture(scope="module")
def chunked_result(tiny_model_dir):
    result, log = checked(generate(
        tiny_model_dir("gqa-d32"), CHUNKED_PROMPTS, runs=CHUNKED_RUNS,
        extra_args=[*PREFIX_ARGS, "--metrics"],
    ))
    return result


def test_chunked_prefill_and_prefix_caching_match_stock(chunked_result):
    runs = {k: v for k, v in chunked_result["runs"].items() if k != "stock-default"}
    assert_same_tokens(runs)
    for label, run in runs.items():
        hits = run["metrics"].get("vllm:prefix_cache_hits", 0)
        assert hits >= 32, f"{label}: expected prefix-cache hits, got {run['metrics']}"


@pytest.mark.parametrize(
    "setting, backend, multiprocessing",
    # ACCEL_FLASH through the variable in a single process: the start-up refusal test
    # below; in vLLM's multiprocess server: test_vllm_attention_server.py.
    [("paged", "ACCEL_PAGED", "1")],
    ids=["paged-multiprocess"],
)
def test_env_var_selects_backend_without_flags(tiny_model_dir, chunked_result, setting, backend, multiprocessing):
    result, log = checked(generate(
        tiny_model_dir("gqa-d32"), CHUNKED_PROMPTS,
        env={"ACCEL_ATTENTION_BACKEND": setting, "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing},
        extra_args=PREFIX_ARGS,
    ))
    assert result["attention_backends"] == [backend]
    assert result["token_ids"] == chunked_result["runs"]["stock-default"]["token_ids"]
    pids = {int(p) for p in re.findall(rf"Using {backend} attention backend \(accel-plugin\) in process (\d+)", log)}
    assert len(pids) == 1, f"expected one INFO line naming {backend}:\n{log[-3000:]}"
    if multiprocessing == "1":
        assert pids != {result["pid"]}, "the backend should run in vLLM's worker process"


@pytest.fixture(scope="module")
def partial_draft(tiny_model_dir, tmp_path_factory):
    """A draft that agrees with the gqa-d32 target often but not always: the target
    with seeded noise on one MLP weight (a random draft would never be accepted)."""
    import torch
    from safetensors.torch import load_file, save_file

    target = tiny_model_dir("gqa-d32")
    out = tmp_path_factory.mktemp("draft") / "gqa-d32-noisy"
    shutil.copytree(target, out)
    weights = load_file(target / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    noise = torch.randn(weights[name].shape, generator=torch.Generator().manual_seed(0))
    weights[name] = weights[name] + 0.6 * weights[name].std() * noise
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


SPEC_METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def test_speculative_decoding_accepts_the_same_drafts(tiny_model_dir, partial_draft, speculation_refusal):
    if speculation_refusal is not None:  # vLLM's own speculation: no stock run to compare with
        pytest.skip(speculation_refusal)
    spec = {"method": "draft_model", "model": str(partial_draft), "num_speculative_tokens": 3}
    # vLLM selects the draft's backend on its own unless the speculative config names
    # one (ACCEL_ATTENTION_BACKEND, read at selection, covers the draft without this).
    runs = [{"label": "stock", "engine_kwargs": {"speculative_config": spec}}] + [
        {"label": name, "engine_kwargs": {"attention_backend": name,
                                          "speculative_config": {**spec, "attention_backend": name}}}
        for name in ("ACCEL_FLASH", "ACCEL_PAGED")
    ]
    result, _ = checked(generate(tiny_model_dir("gqa-d32"), token_prompts((5, 33), seed=4), runs=runs,
                                 extra_args=["--metrics"]))
    assert_same_tokens(result["runs"])
    stock = {n: result["runs"]["stock"]["metrics"].get(n) for n in SPEC_METRICS}
    # Some drafts accepted, some rejected: both verification paths ran.
    assert 0 < stock["vllm:spec_decode_num_accepted_tokens"] < stock["vllm:spec_decode_num_draft_tokens"], stock
    for label in ("ACCEL_FLASH", "ACCEL_PAGED"):
        assert {n: result["runs"][label]["metrics"].get(n) for n in SPEC_METRICS} == stock, label


def test_unsupported_configuration_is_refused_at_start_up(tiny_model_dir):
    result, log = generate(
        tiny_model_dir("gqa-d32"), token_prompts((3,)), env={"ACCEL_ATTENTION_BACKEND": "flash"},
        engine_kwargs={"kv_cache_dtype": "fp8"}, max_tokens=1,
    )
    assert result is None, "an fp8 KV cache must be refused"
    assert "ACCEL_FLASH: kv_cache_dtype fp8 is not supported" in log, log[-3000:]
    assert "unset ACCEL_ATTENTION_BACKEND" in log
