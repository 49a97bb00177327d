"""`vllm serve` with ACCEL_ATTENTION_BACKEND set and no other flag: 16 concurrent
requests to the OpenAI-compatible server, all answered with the same tokens as
vLLM's own CPU backend (offline, greedy)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).parent / "scripts" / "vllm_generate.py"
NUM_REQUESTS = 16
MAX_TOKENS = 4  # 16 sequences per decode step under the Triton interpreter: keep it short


def _prompts():
    rng = random.Random(7)
    lengths = [1 + (i * 9) % 70 for i in range(NUM_REQUESTS)]  # 1 .. 64 tokens
    return [[rng.randrange(3, 380) for _ in range(n)] for n in lengths]


def _stock_tokens(model_dir, prompts):
    env = {k: v for k, v in os.environ.items() if k != "ACCEL_ATTENTION_BACKEND"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cmd = [sys.executable, str(SCRIPT), str(model_dir),
           "--prompts-json", json.dumps([{"prompt_token_ids": p} for p in prompts]),
           "--max-tokens", str(MAX_TOKENS), "--engine-kwargs-json", json.dumps({"block_size": 32})]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])["token_ids"]


def test_openai_server_answers_concurrent_requests_like_stock_backend(tiny_model_dir, vllm_server):
    model_dir = tiny_model_dir("gqa-d32")
    server = vllm_server(model_dir, "--block-size", "32", "--max-num-seqs", str(NUM_REQUESTS),
                         env={"ACCEL_ATTENTION_BACKEND": "flash"})
    prompts = _prompts()

    def complete(prompt):
        body = {"model": str(model_dir), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        return server.post("/v1/completions", body)["choices"][0]["token_ids"]

    with ThreadPoolExecutor(max_workers=NUM_REQUESTS) as pool:
        answers = list(pool.map(complete, prompts))
    assert all(len(a) == MAX_TOKENS for a in answers), answers
    log = server.log()
    assert "Using ACCEL_FLASH attention backend (accel-plugin)" in log, log[-4000:]
    assert answers == _stock_tokens(model_dir, prompts)
