"""`vllm serve` as a subprocess for tests and benchmarks: start it, wait until healthy,
post to it, scrape its ``/metrics``, stop it.

Only a subprocess: this module never imports vLLM. The serve script is the caller's
(integration/scripts/vllm_serve.py runs vLLM's own CLI entry point), started with this
interpreter in its own session on 127.0.0.1, so :meth:`VllmServer.stop` reaches the
engine core and the workers through the process group.

    server = VllmServer.start(SERVE, model_dir, "--block-size", "32", log_path=tmp / "server.log")
    server.wait_healthy()
    ...
    server.cleanup()
"""

from __future__ import annotations

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

__all__ = ["MetricSamples", "ServerFailed", "VllmServer", "free_port", "healthy"]

#: serve options a server gets unless its arguments name them
SERVE_DEFAULTS = {"--dtype": "float32", "--max-model-len": "512", "--seed": "0"}
START_TIMEOUT_S = 240

_SAMPLE = re.compile(r'^(accel_[a-z_]+)\{([^}]*)\} (\S+)$')


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(base: str, timeout: float = 10) -> bool:
    """Whether the server at ``base`` answers ``/health``."""
    try:
        with urllib.request.urlopen(base + "/health", timeout=timeout):
            return True
    except OSError:  # URLError, refused and reset connections, timeouts
        return False


class ServerFailed(RuntimeError):
    """The server exited, or was not healthy in time; the message ends with its log."""


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
    """One `vllm serve` subprocess. ``base``: its URL; ``proc``: the API server process;
    ``tmpdir``: its ``TMPDIR`` (what it leaves there shows after :meth:`stop`)."""

    def __init__(self, proc: subprocess.Popen, base: str, log_path: Path, tmpdir: Path):
        self.proc, self.base, self.log_path, self.tmpdir = proc, base, log_path, tmpdir

    @classmethod
    def start(cls, serve_script: Path, model_dir, *serve_args: str, log_path: Path, env: dict | None = None,
              env_defaults: dict | None = None, tmpdir_prefix: str = "vllm-serve-") -> VllmServer:
        """Start ``serve_script MODEL_DIR --host 127.0.0.1 --port P`` (not waiting for it).

        vLLM's default multiprocess mode (``VLLM_ENABLE_V1_MULTIPROCESSING`` removed),
        :data:`SERVE_DEFAULTS` and ``--enforce-eager`` unless ``serve_args`` name them.
        ``env``: variables over this process's (``None`` removes one); ``env_defaults``:
        variables set only where neither sets them. Output goes to ``log_path``.
        """
        # short: vLLM puts its ZeroMQ sockets there (at most 107 characters a path)
        tmpdir = Path(tempfile.mkdtemp(prefix=tmpdir_prefix))
        environ = {**os.environ, "TMPDIR": str(tmpdir), **(env or {})}
        for key, value in (env_defaults or {}).items():
            environ.setdefault(key, value)
        environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: multiprocess
        environ = {k: v for k, v in environ.items() if v is not None}
        port = free_port()
        args = [a for k, v in SERVE_DEFAULTS.items() if k not in serve_args for a in (k, v)]
        if "--enforce-eager" not in serve_args:
            args.append("--enforce-eager")
        cmd = [sys.executable, str(serve_script), str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               *args, *serve_args]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(proc, f"http://127.0.0.1:{port}", Path(log_path), tmpdir)

    def log(self) -> str:
        """Its output so far."""
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        """POST ``body`` as JSON to ``path``; the JSON answer."""
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def scrape(self) -> MetricSamples:
        """Its ``/metrics`` now."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as response:
            return MetricSamples(response.read().decode())

    def wait_healthy(self, timeout: float = START_TIMEOUT_S, log_tail: int = 6000) -> None:
        """Until ``/health`` answers; :class:`ServerFailed` with the last ``log_tail``
        characters of its log if it exits or ``timeout`` s pass first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"vllm serve exited with {self.proc.returncode}:\n{self.log()[-log_tail:]}")
            if healthy(self.base, timeout=2):
                return
            time.sleep(1)
        raise ServerFailed(f"vllm serve not healthy after {timeout}s:\n{self.log()[-log_tail:]}")

    def stop(self) -> None:
        """SIGINT to its process group (as Ctrl-C), SIGKILL after 30 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)

    def cleanup(self) -> None:
        """:meth:`stop`, then remove its ``TMPDIR``."""
        self.stop()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def leftover_metric_dirs(self) -> list[str]:
        """accel metric directories left in its TMPDIR (none once it stopped cleanly)."""
        return sorted(p.name for p in self.tmpdir.glob("accel-metrics-*"))
