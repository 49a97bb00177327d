"""accel's live metrics on a real `vllm serve` (multiprocess: API server, engine core,
worker), scraped from its `/metrics` while requests run and after.

- KV cache (``ACCEL_ATTENTION_BACKEND=paged``): requests of known prompt lengths and
  ``max_tokens`` (``ignore_eos``), sent concurrently. During the run every scrape is
  consistent (allocated = blocks x block size, internal = allocated - used); at the
  end the gauges describe the last step (only the longest request left) and the
  slot-step counters equal what the requests imply, ``accel kv simulate``'s
  simulator on the same requests: each request runs with lengths ``prompt``,
  ``prompt + 1``, ... ``prompt + max_tokens - 1`` whichever requests share its steps.
- Speculation (accel's domain proposer): the per-domain counters on ``/metrics``
  equal the proposer's own statistics, read from the worker over vLLM's
  ``/collective_rpc`` (``SpeculationStatsExtension``). This server runs with
  ``PROMETHEUS_MULTIPROC_DIR`` set: vLLM then serves that directory, accel's files
  included.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from accel_plugin.observability.kv_accounting import paged_usage
from accel_plugin.observability.kv_simulator import PagedAllocator, simulate
from accel_plugin.observability.kv_trace import Request

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 16
#: (prompt_len, max_tokens); the last request outlives the others by far, so the last
#: step holds it alone
REQUESTS = [(1, 4), (17, 4), (31, 4), (40, 4), (63, 4), (90, 16)]


def check_consistent(samples) -> int:
    """The KV gauges of one scrape agree with each other; returns the step's sequences."""
    used = samples.one("accel_kv_used_slots")
    allocated = samples.one("accel_kv_allocated_slots")
    blocks = samples.one("accel_kv_blocks")
    assert allocated == blocks * BLOCK_SIZE
    assert samples.one("accel_kv_internal_slots") == allocated - used >= 0
    seqs = samples.one("accel_kv_seqs")
    assert allocated - used < BLOCK_SIZE * max(seqs, 1)
    assert samples.one("accel_kv_internal_fragmentation_percent") == pytest.approx(
        100 * (allocated - used) / allocated if allocated else 0.0)
    return int(seqs)


def test_kv_recorder_counts_each_step_once_and_skips_sliding_windows(tmp_path):
    """In process: which vLLM KV-cache groups are accounted, and a step seen by the
    builders of two groups (shallow copies of one metadata object) counts once."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from accel_plugin.adapters.vllm import _compat
    from accel_plugin.adapters.vllm.metrics import KVRecorder
    from accel_plugin.observability.metrics_files import MetricsSink
    from accel_plugin.observability.metrics_recorders import LiveMetrics

    shape = {"block_size": BLOCK_SIZE, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
    assert _compat.kv_cache_group_name(FullAttentionSpec(**shape)) == "full"
    assert _compat.kv_cache_group_name(FullAttentionSpec(**shape, sliding_window=64)) == "full"
    assert _compat.kv_cache_group_name(SlidingWindowSpec(**shape, sliding_window=64)) is None
    assert _compat.is_first_model_rank()  # no parallel state in this process

    live = LiveMetrics(("tiny", "0"), MetricsSink(str(tmp_path)))
    group_0, group_1 = KVRecorder(live, "full", BLOCK_SIZE), KVRecorder(live, "full", BLOCK_SIZE)
    step = SimpleNamespace(seq_lens=torch.tensor([5, 40, 0], dtype=torch.int32), num_reqs=2)
    group_0.record(step)
    group_1.record(copy.copy(step))
    recorder = live.kv("full", BLOCK_SIZE)
    assert (recorder.steps, recorder.last) == (1, paged_usage([5, 40], BLOCK_SIZE))
    group_1.record(SimpleNamespace(seq_lens=torch.tensor([6, 41], dtype=torch.int32), num_reqs=2))
    assert (recorder.steps, recorder.used_slot_steps) == (2, 45 + 47)


def test_kv_metrics_match_the_requests_and_the_simulator(tiny_model_dir, vllm_server):
    model_dir = tiny_model_dir("gqa-d32")
    server = vllm_server(
        model_dir, "--block-size", str(BLOCK_SIZE), "--max-num-seqs", str(len(REQUESTS)),
        "--max-num-batched-tokens", "2048",
        env={"ACCEL_ATTENTION_BACKEND": "paged", "ACCEL_METRICS_LOG_INTERVAL": "1"},
    )
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 380) for _ in range(p)] for p, _ in REQUESTS]
    before = server.scrape()
    assert "accel_kv_used_slots" not in before, "no step ran yet"

    scrapes, done = [], threading.Event()

    def poll():
        while not done.is_set():
            scrapes.append(server.scrape())
            done.wait(0.2)

    def complete(i):
        body = {"model": str(model_dir), "prompt": prompts[i], "max_tokens": REQUESTS[i][1],
                "temperature": 0.0, "ignore_eos": True}
        return server.post("/v1/completions", body)["usage"]

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with ThreadPoolExecutor(max_workers=len(REQUESTS)) as pool:
            usages = list(pool.map(complete, range(len(REQUESTS))))
    finally:
        done.set()
        poller.join(60)
    assert [(u["prompt_tokens"], u["completion_tokens"]) for u in usages] == REQUESTS

    # while running: every scrape that saw a step is consistent, and some saw a batch
    running = [check_consistent(s) for s in scrapes if "accel_kv_used_slots" in s]
    assert running and max(running) > 1, f"no scrape saw a batch of several requests: {running}"

    final = server.scrape()
    labels = {"kv_cache_group": "full", "block_size": str(BLOCK_SIZE), "engine": "0", "model_name": str(model_dir)}
    check_consistent(final)
    # the last step: the longest request alone, with prompt + max_tokens - 1 tokens
    prompt_len, max_tokens = REQUESTS[-1]
    last = paged_usage([prompt_len + max_tokens - 1], BLOCK_SIZE)
    assert final.one("accel_kv_seqs", **labels) == 1
    assert final.one("accel_kv_used_slots", **labels) == last.used
    assert final.one("accel_kv_blocks", **labels) == last.blocks == math.ceil(last.used / BLOCK_SIZE)
    assert final.one("accel_kv_allocated_slots", **labels) == last.allocated

    # over the whole run: sums over steps, as the requests imply and as the simulator counts
    implied_used = sum(p + t for p, m in REQUESTS for t in range(m))
    implied_allocated = sum(BLOCK_SIZE * math.ceil((p + t) / BLOCK_SIZE) for p, m in REQUESTS for t in range(m))
    trace = [Request(arrival=0, prompt_len=p, output_len=m) for p, m in REQUESTS]
    totals = simulate(trace, PagedAllocator(1 << 16, BLOCK_SIZE)).totals
    assert (totals.used, totals.allocated) == (implied_used, implied_allocated)
    assert final.one("accel_kv_used_slot_steps_total", **labels) == implied_used
    assert final.one("accel_kv_allocated_slot_steps_total", **labels) == implied_allocated
    assert final.one("accel_kv_steps_total", **labels) >= max(m for _, m in REQUESTS)

    # vLLM's own metrics are still served next to ours
    assert "vllm:num_requests_running" in final.text
    server.stop()
    log = server.log()
    assert re.search(r"accel KV: \d+ seqs, [\d,]+ slots used / [\d,]+ allocated \([\d.]+% internal\), "
                     r"[\d,]+ blocks", log), log[-4000:]
    assert server.leftover_metric_dirs() == [], "the metrics directory outlived the server"


K = 3
SUPPORT = ["Customer: my refund ticket #123 is late", "Where is my delivery? order 55"]
OTHER = ["The model is", "A small prompt answer"]


def test_speculation_metrics_equal_the_proposers_stats(tiny_model_dir, vllm_server, tmp_path,
                                                       speculation_refusal):
    if speculation_refusal is not None:
        pytest.skip(speculation_refusal)
    target = tiny_model_dir("gqa-d64")
    poor = tiny_model_dir("draft-d32", seed=7)
    config = tmp_path / "drafts.yaml"
    config.write_text(textwrap.dedent(f"""
        num_speculative_tokens: {K}
        domains:
          support:
            draft: {target}
            match: {{keywords: [refund, delivery, order]}}
        default:
          draft: {poor}
        controller: {{adaptive: true, min_samples: 4, probe_interval: 8}}
    """).lstrip())
    spec = {"method": "custom_class", "model": "accel_plugin.adapters.vllm.DomainDraftProposer",
            "num_speculative_tokens": K}
    # the other way to /metrics: vLLM serves PROMETHEUS_MULTIPROC_DIR, and accel's files go there
    prometheus_dir = tmp_path / "prometheus"
    prometheus_dir.mkdir()
    server = vllm_server(
        target, "--max-num-seqs", "4", "--speculative-config", json.dumps(spec),
        "--worker-extension-cls", "accel_plugin.adapters.vllm.proposer.SpeculationStatsExtension",
        env={"ACCEL_DRAFT_CONFIG": str(config), "VLLM_SERVER_DEV_MODE": "1", "ACCEL_METRICS_LOG_INTERVAL": "1",
             "PROMETHEUS_MULTIPROC_DIR": str(prometheus_dir)},
    )

    def complete(prompt):
        body = {"model": str(target), "prompt": prompt, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
        return server.post("/v1/completions", body)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(complete, SUPPORT + OTHER))

    stats = server.post("/collective_rpc", {"method": "accel_speculation_stats"})["results"][0]
    samples = server.scrape()
    assert set(stats) == {"support", "default"}
    assert stats["support"]["drafted"] > 0 and stats["support"]["accepted"] > 0
    for domain, s in stats.items():
        labels = {"domain": domain, "engine": "0", "model_name": str(target)}
        assert samples.one("accel_spec_drafted_tokens_total", **labels) == s["drafted"]
        assert samples.one("accel_spec_accepted_tokens_total", **labels) == s["accepted"]
        assert samples.one("accel_spec_draft_steps_total", **labels) == s["steps"]
        assert samples.one("accel_spec_k", **labels) == s["k"]
        assert samples.one("accel_spec_state", state=s["state"], **labels) == 1
        assert samples.one("accel_spec_acceptance_rate", **labels) == pytest.approx(s["acceptance_rate"])
        assert samples.one("accel_spec_mean_acceptance_length", **labels) == pytest.approx(
            s["mean_acceptance_length"])
    # the identical draft is (nearly) always accepted, the random one (nearly) never
    assert samples.one("accel_spec_acceptance_rate", domain="support") > 0.9
    steps = samples.one("accel_spec_propose_steps_total")
    seconds = samples.one("accel_spec_propose_seconds_total")
    assert steps > 0 and seconds > 0
    assert 1e3 * seconds / steps == pytest.approx(stats["support"]["propose_ms_per_step"])
    assert "vllm:spec_decode_num_draft_tokens_total" in samples.text
    assert sorted(p.name.split("_accel-")[0] for p in prometheus_dir.glob("*_accel-*.db")) == [
        "counter", "gauge_mostrecent"]
    assert re.search(r"speculation: support a=(n/a|[\d.]+) k=\d \w+", server.log())
