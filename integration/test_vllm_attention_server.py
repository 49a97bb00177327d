"""`vllm serve` with ACCEL_ATTENTION_BACKEND set and no other flag: 16 concurrent
requests to the OpenAI-compatible server, all answered with the same tokens as
vLLM's own CPU backend (offline, greedy)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).parent / "scripts" / "vllm_generate.py"
SERVE = Path(__file__).parent / "scripts" / "vllm_serve.py"  # `vllm serve`, see its docstring
NUM_REQUESTS = 16
MAX_TOKENS = 4  # 16 sequences per decode step under the Triton interpreter: keep it short
START_TIMEOUT_S = 240


def _prompts():
    rng = random.Random(7)
    lengths = [1 + (i * 9) % 70 for i in range(NUM_REQUESTS)]  # 1 .. 64 tokens
    return [[rng.randrange(3, 380) for _ in range(n)] for n in lengths]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _post(url, body, timeout=300):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _wait_healthy(base, proc, log_path):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log_path.read_text()[-6000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    pytest.fail(f"vllm serve not healthy after {START_TIMEOUT_S}s:\n{log_path.read_text()[-6000:]}")


@pytest.fixture
def accel_server(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("gqa-d32")
    port = _free_port()
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "ACCEL_ATTENTION_BACKEND": "flash"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: multiprocess
    cmd = [sys.executable, str(SERVE), str(model_dir), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--block-size", "32", "--max-model-len", "512", "--enforce-eager",
           "--max-num-seqs", str(NUM_REQUESTS), "--seed", "0"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc, log_path)
        yield model_dir, base, log_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def test_openai_server_answers_concurrent_requests_like_stock_backend(accel_server):
    model_dir, base, log_path = accel_server
    prompts = _prompts()

    def complete(prompt):
        body = {"model": str(model_dir), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        return _post(base + "/v1/completions", body)["choices"][0]["token_ids"]

    with ThreadPoolExecutor(max_workers=NUM_REQUESTS) as pool:
        answers = list(pool.map(complete, prompts))
    assert all(len(a) == MAX_TOKENS for a in answers), answers
    log = log_path.read_text()
    assert "Using ACCEL_FLASH attention backend (accel-plugin)" in log, log[-4000:]
    assert answers == _stock_tokens(model_dir, prompts)
