"""benchmarks/load/ at CI size: `vllm serve` with accel's paged backend and the
domain proposer under 16 concurrent streaming clients (32 requests, mixed domains
and lengths, every 6th cancelled after 3 chunks), against a stock server on the
same requests.

Asserted: correctness only. Every request completed or was cancelled by its
client; no error status, error event or broken stream; both servers healthy after
the load, no ERROR line in their logs; every completed output equals stock's token
for token and every cancelled one received a prefix of it; each server used the
attention backend it was meant to. Timing, RSS and draft KV bytes are printed
(``pytest -s``), not asserted: the full-size run and its numbers are in
docs/scale.md, "Load".
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm

CLIENTS, REQUESTS = 16, 32
MAX_TOKENS = (4, 8, 12, 16)
K = 3
PROMPTS = {
    "support": ["Customer: my refund ticket #123 is late.", "Where is my delivery? order 55.",
                "I want a refund for the broken delivery."],
    "code": ["def foo(a, b):", "import os\nclass Model:", "def cache(size):"],
    "default": ["The model is", "A small prompt answer.", "Data is not fast.", "Question: what is the cache"],
}


def _load_benchmark() -> SimpleNamespace:
    """benchmarks/load/'s modules, imported from their folder under a private package name
    (the repository root is not put on sys.path: its kernels/ would shadow the Hugging
    Face ``kernels`` probe of transformers)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "load"
    name = "accel_benchmarks_load"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package  # its modules' relative imports and dataclasses look it up
        spec.loader.exec_module(package)
    modules = {m: importlib.import_module(f"{name}.{m}") for m in ("measure", "results", "servers", "workload")}
    return SimpleNamespace(workload=modules["workload"].workload, measure=modules["measure"].measure,
                           table=modules["results"].table, stock_server_setup=modules["servers"].stock_server_setup,
                           accel_server_setup=modules["servers"].accel_server_setup)


def test_streaming_load_with_cancellations_matches_stock(tiny_model_dir, vllm_server, tmp_path,
                                                         speculation_refusal):
    if speculation_refusal is not None:
        pytest.skip(speculation_refusal)
    load = _load_benchmark()
    target = tiny_model_dir("gqa-d64")
    poor = tiny_model_dir("draft-d32", seed=7)
    config = tmp_path / "drafts.yaml"
    config.write_text(textwrap.dedent(f"""
        num_speculative_tokens: {K}
        domains:
          support:
            draft: {target}
            match: {{keywords: [refund, delivery, order]}}
          code:
            draft: {poor}
            match: {{regex: ['^(def|import) ']}}
        default:
          draft: null
        controller: {{adaptive: true, min_samples: 4, probe_interval: 8}}
    """).lstrip())
    requests = load.workload(PROMPTS, REQUESTS, max_tokens=MAX_TOKENS)
    assert sum(r.cancel_after is not None for r in requests) == REQUESTS // 6

    args, env = load.stock_server_setup()
    stock = vllm_server(target, "--block-size", "32", *args, env=env)
    stock_result, stock_out = load.measure("stock", stock.base, stock.proc.pid, str(target), requests, CLIENTS,
                                           stock.log)
    stock.stop()
    args, env = load.accel_server_setup(config, "paged")
    accel = vllm_server(target, "--block-size", "32", *args, env=env)
    accel_result, _ = load.measure("accel", accel.base, accel.proc.pid, str(target), requests, CLIENTS,
                                   accel.log, reference=stock_out)
    print("\n" + load.table([stock_result, accel_result]))

    for result in (stock_result, accel_result):
        assert result.errors == 0, result.error_samples
        assert result.completed + result.cancelled == REQUESTS
        assert result.cancelled == REQUESTS // 6
        assert result.healthy_after
        assert result.log_errors == [], result.log_errors
    assert accel_result.wrong_tokens == 0
    assert stock_result.backend == "CPU_ATTN"
    assert accel_result.backend == "ACCEL_PAGED"
    assert accel_result.draft_kv_after is not None and accel_result.draft_kv_after > 0
