"""The load test's two servers: how stock and accel are started, and what is read back
from a running one (idle, engine RSS, draft KV bytes, attention backend)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from accel_plugin.testing.vllm_server import VllmServer

from .workload import ROOT

SERVE = ROOT / "integration" / "scripts" / "vllm_serve.py"
EXTENSION_DIR = ROOT / "benchmarks" / "_load_extension"
EXTENSION = "accel_load_extension.DraftMemoryExtension"
PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"
#: with VllmServer's defaults: --dtype float32 --max-model-len 512 --enforce-eager --seed 0
SERVE_ARGS = ("--block-size", "32")
_BACKEND_LINES = (re.compile(r"Using (\S+) attention backend \(accel-plugin\)"), re.compile(r"Using (\S+) backend\."))

#: both servers: the kernels' torch reference on CPU, not the Triton interpreter
COMMON_ENV = {"TRITON_INTERPRET": None}


def stock_server_setup() -> tuple[list[str], dict[str, str | None]]:
    """(serve args, env) of the stock server: no ACCEL_* variable; the worker extension
    only (it reads, changes nothing)."""
    path = os.pathsep.join(p for p in (str(EXTENSION_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {"ACCEL_ATTENTION_BACKEND": None, "ACCEL_DRAFT_CONFIG": None, "VLLM_SERVER_DEV_MODE": "1",
           "PYTHONPATH": path, **COMMON_ENV}
    return ["--worker-extension-cls", EXTENSION], env


def accel_server_setup(draft_config: Path | None, backend: str) -> tuple[list[str], dict[str, str | None]]:
    """(serve args, env) that turn the accel backend and the domain proposer on (no
    proposer when ``draft_config`` is None: the attention backend alone)."""
    import yaml

    args, env = stock_server_setup()
    if draft_config is None:
        return args, {**env, "ACCEL_ATTENTION_BACKEND": backend}
    k = yaml.safe_load(draft_config.read_text())["num_speculative_tokens"]
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    env = {**env, "ACCEL_ATTENTION_BACKEND": backend, "ACCEL_DRAFT_CONFIG": str(draft_config)}
    return ["--speculative-config", json.dumps(spec), *args], env


def start_server(model_dir: Path, args: list[str], env: dict, log_path: Path) -> VllmServer:
    """`vllm serve` for the stand-alone run (not waited for): offline, a 2 GiB CPU KV
    cache unless the environment says otherwise."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env}
    return VllmServer.start(SERVE, model_dir, *SERVE_ARGS, *args, log_path=log_path, env=env,
                            env_defaults={"VLLM_CPU_KVCACHE_SPACE": "2"}, tmpdir_prefix="vllm-load-")


def _get(base: str, path: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(base + path, timeout=timeout) as response:
        return response.read().decode()


def wait_idle(base: str, timeout: float = 120) -> None:
    """Until vLLM reports no running and no waiting request."""
    pattern = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\} (\S+)$", re.MULTILINE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        values = [float(v) for _, v in pattern.findall(_get(base, "/metrics"))]
        if values and not any(values):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{base} still busy after {timeout}s")


def engine_rss(pid: int) -> int:
    """RSS bytes of the processes below ``pid`` (engine core, workers)."""
    import psutil

    total = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def worker_rpc(base: str, method: str, key: str) -> list | None:
    """``results[i][key]`` of a worker-extension method over /collective_rpc (None: not served)."""
    request = urllib.request.Request(base + "/collective_rpc", data=json.dumps({"method": method}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            results = json.loads(response.read())["results"]
    except (OSError, urllib.error.URLError, KeyError, ValueError):
        return None
    if not all(isinstance(r, dict) and key in r for r in results):
        print(f"{method} answered {str(results)[:500]}", file=sys.stderr)
        return None
    return [r[key] for r in results]


def draft_kv_bytes(base: str) -> int | None:
    """The proposer's draft KV bytes, summed over workers (None: no proposer)."""
    found = worker_rpc(base, "accel_draft_kv_bytes", "draft_kv_bytes")
    return None if found is None or not any(found) else sum(found)


def attention_backend(base: str, log: str) -> str:
    """The attention backend of the workers' layers (read back through the worker
    extension), else what the log says (accel's line first, then vLLM's)."""
    found = worker_rpc(base, "accel_attention_backends", "attention_backends")
    if found:
        return ",".join(sorted({name for names in found for name in names}))
    for pattern in _BACKEND_LINES:
        found = pattern.findall(log)
        if found:
            return found[-1]
    return "?"
