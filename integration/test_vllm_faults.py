"""Faults while a real `vllm serve` (multiprocess) speculates with accel's domain proposer.

One server carries five domains, all drafting with copies of the target (a draft
the target always accepts, so only a fault can switch one off):

- ``raising``: its draft forward raises from the 3rd call on;
- ``nan``: its draft forward returns NaN logits from the 3rd call on;
- ``slow``: every forward of its draft sleeps 100 ms (a target step takes a few);
- ``vanish``: its draft directory is deleted once the server is up;
- ``default``: healthy.

Faults are injected by a test-only accel plugin (integration/fault_plugin/
accel_faults.py), installed for this server alone through an ``accel_plugin`` entry
point: it offers vLLM a proposer that wraps the chosen drafts' forwards, and
accel's production adapter drives it. Between two rounds of requests the draft YAML
is overwritten with garbage. Every output must equal a stock run of the target (no
speculation); the raising and NaN domains must end ``failed`` with the error in the
log, in the proposer's counters and in ``accel_spec_state`` on ``/metrics``; the
slow one must end off (its measured cost ratio makes speculation a loss); the
deleted one keeps drafting (drafts load at start-up). Finally the worker process
(where the proposer runs) is killed with requests in flight, once a streamed request
started after them has its first token, each asking for about 8000 tokens (a CI run
that killed it once the metrics gauge read them running, with 480 tokens each, saw
two of them complete first): they must fail and the
server must go down within bounds rather than hang. vLLM's own behaviour, the same
with or without accel: its worker monitor notices the death, the engine core shuts
down, in-flight requests get HTTP 500 (``EngineDeadError``; the streamed one an error
event or a broken stream) and the API server exits (seen: within 2 s of a SIGKILL of
the worker or of the engine core).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

K = 3
MAX_TOKENS = 48
FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"
#: a draft forward this slow costs several target steps (a few ms here), even on a loaded machine
SLOW_SECONDS = 0.1
#: domain -> (keyword its prompts carry, fault of its draft or None)
DOMAINS = {
    "raising": ("alpha", {"fault": "raise", "after": 2}),
    "nan": ("bravo", {"fault": "nan", "after": 2}),
    "slow": ("charlie", {"fault": "slow", "seconds": SLOW_SECONDS}),
    "vanish": ("delta", None),
}
PROMPTS = [
    "alpha: the model is", "alpha order ticket",
    "bravo cache block", "bravo: a small prompt",
    "charlie data is not fast", "charlie: question what",
    "delta draft target", "delta: the request",
    "The model is", "A small prompt answer",
]
#: how long a request may take to fail once the worker is dead, and the server to exit
DEAD_ENGINE_BOUND_S = 60
#: the server's context: the requests in flight at the kill ask for this many tokens less 32, one a step
LONG_CONTEXT = 8192


def install_fault_plugin(root: Path) -> str:
    """A dist-info declaring the ``faults`` entry point; returns the PYTHONPATH that installs it."""
    info = root / "accel_faults_test-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accel-faults-test\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[accel_plugin]\nfaults = accel_faults\n")
    return os.pathsep.join(p for p in (str(root), str(FAULT_PLUGIN), os.environ.get("PYTHONPATH")) if p)


def vllm_processes(server_pid: int, title: str) -> list[int]:
    """Descendants of the API server whose process title (vLLM sets ``VLLM::<name>``) has ``title``."""
    import psutil

    out = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if f"::{title}" in child.name() or f"::{title}" in " ".join(child.cmdline()):
                out.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def fault_setup(tiny_model_dir, tmp_path, run_vllm):
    target = tiny_model_dir("gqa-d64", max_position_embeddings=LONG_CONTEXT)
    drafts = {name: shutil.copytree(target, tmp_path / f"draft-{name}") for name in DOMAINS}
    domains = "".join(
        f"  {name}:\n    draft: {drafts[name]}\n    match: {{keywords: [{keyword}]}}\n"
        for name, (keyword, _) in DOMAINS.items()
    )
    config = tmp_path / "drafts.yaml"
    config.write_text(f"num_speculative_tokens: {K}\ndomains:\n{domains}" + textwrap.dedent(f"""\
        default: {{draft: {target}}}
        controller: {{adaptive: true, min_samples: 4, probe_interval: 8, switch_after: 2, log_interval_s: 1}}
    """))
    faults = {str(drafts[name]): fault for name, (_, fault) in DOMAINS.items() if fault is not None}
    reference, _ = run_vllm(target, PROMPTS, max_tokens=MAX_TOKENS,
                            env_overrides={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "ACCEL_DRAFT_CONFIG": None})
    env = {"ACCEL_DRAFT_CONFIG": str(config), "ACCEL_PLUGINS": "faults",
           "ACCEL_TEST_FAULTS": json.dumps(faults), "PYTHONPATH": install_fault_plugin(tmp_path / "site"),
           "VLLM_SERVER_DEV_MODE": "1"}
    return target, drafts, config, env, reference["texts"]


def test_faulty_drafts_are_switched_off_and_outputs_stay_exact(fault_setup, vllm_server, speculation_refusal):
    if speculation_refusal is not None:
        pytest.skip(speculation_refusal)
    target, drafts, config, env, expected = fault_setup
    spec = {"method": "custom_class", "model": "accel_plugin.adapters.vllm.DomainDraftProposer",
            "num_speculative_tokens": K}
    server = vllm_server(
        target, "--max-num-seqs", "8", "--max-model-len", str(LONG_CONTEXT), "--speculative-config", json.dumps(spec),
        "--worker-extension-cls", "accel_plugin.adapters.vllm.proposer.SpeculationStatsExtension", env=env,
    )
    assert "ACCEL_FAULTY_DRAFT" in server.log(), "the fault plugin's proposer did not load"
    shutil.rmtree(drafts["vanish"])  # drafts are loaded at start-up: this must change nothing

    def complete(prompt):
        body = {"model": str(target), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True}
        return server.post("/v1/completions", body)["choices"][0]["text"]

    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        first = pool.map(complete, PROMPTS)
        # nothing re-reads the YAML: garbage in it while serving changes nothing
        time.sleep(0.5)
        config.write_text("num_speculative_tokens: [\n\x00 not: yaml: {{{")
        assert list(first) == expected
        assert list(pool.map(complete, PROMPTS)) == expected

    stats = server.post("/collective_rpc", {"method": "accel_speculation_stats"})["results"][0]
    samples = server.scrape()
    labels = {"engine": "0", "model_name": str(target)}
    assert set(stats) == {*DOMAINS, "default"}
    assert stats["raising"]["state"] == "failed" and "injected fault" in stats["raising"]["error"]
    assert stats["nan"]["state"] == "failed" and "non-finite logits" in stats["nan"]["error"]
    # the slow draft is always accepted, but a forward costs more than a target step
    assert stats["slow"]["state"] == "off" and stats["slow"]["k"] == 0, stats["slow"]
    assert stats["slow"]["drafted"] > 0
    # every draft of the deleted directory ran after the deletion; on or off is the cost model's call
    for name in ("vanish", "default"):
        assert stats[name]["state"] in ("on", "off", "warmup") and stats[name]["error"] is None, stats[name]
        assert stats[name]["accepted"] > 0, stats[name]
    for name, s in stats.items():
        assert samples.one("accel_spec_state", domain=name, state=s["state"], **labels) == 1
        assert samples.one("accel_spec_on", domain=name, **labels) == (s["state"] in ("on", "warmup"))
    log = server.log()
    assert log.count("speculation is off for domain(s) raising") == 1
    assert log.count("speculation is off for domain(s) nan") == 1
    assert "DraftOutputError: draft model" in log and "non-finite logits" in log
    assert "DraftConfigError" not in log

    # the worker (the proposer's process) dies with requests in flight: they fail, the server exits
    assert len(vllm_processes(server.proc.pid, "EngineCore")) == 1
    pids = vllm_processes(server.proc.pid, "Worker")
    assert len(pids) == 1, pids
    outcomes: list[str] = []
    decoding = threading.Event()
    # a failed domain: one token per step, so 8160 tokens take 8160 steps (once, with 480, every request had
    # completed before the first streamed token reached the test: the engine outran what the API server sent)
    body = {"model": str(target), "max_tokens": LONG_CONTEXT - 32, "temperature": 0.0, "ignore_eos": True}

    def long_request(prompt):
        try:
            server.post("/v1/completions", {**body, "prompt": prompt}, timeout=DEAD_ENGINE_BOUND_S)
            outcomes.append("completed")
        except urllib.error.HTTPError as exc:
            outcomes.append(f"HTTP {exc.code}")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            outcomes.append(type(exc).__name__)

    def streamed_request(prompt):
        """Started after the others: its first token says that they are decoding too (a few steps
        ahead at most), so the kill comes thousands of steps before any could complete."""
        request = urllib.request.Request(server.base + "/v1/completions",
                                         data=json.dumps({**body, "prompt": prompt, "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        outcome = "stream ended without a finish"
        try:
            with urllib.request.urlopen(request, timeout=DEAD_ENGINE_BOUND_S) as response:
                for line in response:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[len(b"data: "):])
                    if "error" in chunk:
                        outcome = "error event"
                        break
                    decoding.set()
                    if chunk["choices"][0].get("finish_reason"):
                        outcome = "completed"
                        break
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as exc:
            outcome = type(exc).__name__
        finally:
            outcomes.append(outcome)
            decoding.set()

    threads = [threading.Thread(target=long_request, args=(p,)) for p in PROMPTS[:4]]
    threads.append(threading.Thread(target=streamed_request, args=(PROMPTS[0],)))
    for thread in threads:
        thread.start()
    assert decoding.wait(30), "the long requests never ran"
    assert not outcomes, f"a request ended before the kill: {outcomes}"
    os.kill(pids[0], signal.SIGKILL)
    killed = time.monotonic()
    for thread in threads:
        thread.join(max(1.0, killed + DEAD_ENGINE_BOUND_S + 10 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "in-flight requests hang after the worker died"
    failed_after = time.monotonic() - killed
    assert len(outcomes) == 5 and "completed" not in outcomes, outcomes
    try:
        server.proc.wait(timeout=DEAD_ENGINE_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"vllm serve still running {DEAD_ENGINE_BOUND_S}s after its worker died:\n"
                    f"{server.log()[-4000:]}")
    print(f"worker killed: requests -> {outcomes} within {failed_after:.1f}s, "
          f"server exited {server.proc.returncode} after {time.monotonic() - killed:.1f}s", file=sys.stderr)
    assert "died unexpectedly" in server.log() and "EngineDeadError" in server.log()
    assert server.leftover_metric_dirs() == [], "accel's metrics directory outlived the server"
