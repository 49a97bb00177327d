"""accel-plugin under vLLM's Ray executor (``distributed_executor_backend="ray"``), on a
local one-node Ray cluster on 127.0.0.1 that the helper script starts and stops.

One subprocess (scripts/vllm_ray_generate.py) starts Ray, then builds one engine per
configuration, one after the other, each with two Ray worker actors:

- ``accel-tp2``: tensor parallel 2 on vLLM's default Ray executor (RayExecutorV2),
  ``ACCEL_ATTENTION_BACKEND=paged``, the domain proposer (``ACCEL_DRAFT_CONFIG``),
  ``ACCEL_METRICS_DIR``;
- ``accel-tp2-v1``: the same on vLLM's first Ray executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``,
  which copies only listed prefixes: accel-plugin adds ``ACCEL_``), ``ACCEL_ATTENTION_BACKEND=flash``;
- ``stock-tp2``: no ``ACCEL_*`` variable;
- ``unshimmed`` and ``stock-pp2``: what vLLM refuses (below).

The ``ACCEL_*`` variables are set in the driver only, after the cluster started, so
the Ray workers see them only because vLLM's Ray executor copies them (a plain Ray
task started meanwhile does not see them). Greedy outputs equal stock's; every
worker's layers report the accel backend; the proposer's counters read from the
workers (``SpeculationStatsExtension``) equal the accel metric files rank 0 wrote
into ``ACCEL_METRICS_DIR`` (docs/observability.md).

What vLLM 0.32's CPU build refuses: the Ray executor itself ("current platform cpu
does not support ray.": ``CpuPlatform.ray_device_key`` is empty). The script gives
the platform Ray's ``GPU`` resource name (test-only, in the driver and as Ray's worker
set-up hook) and the cluster that many logical GPUs; ``unshimmed`` runs without it. Pipeline parallel 2 then starts but its first step fails in vLLM's
scheduler (``stock-pp2``, no accel setting). Each refusal is asserted, so the day
vLLM accepts one, a test says so. docs/scale.md ("Across nodes") has the measured run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs Ray (pip install ray; make setup)")]

SCRIPT = Path(__file__).parent / "scripts" / "vllm_ray_generate.py"
PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"
K = 3
_rng = random.Random(0)
#: a token prompt over one 32-token block (default domain), a support and a default text prompt
PROMPTS = [{"prompt_token_ids": [_rng.randrange(3, 380) for _ in range(33)]},
           "Customer: my refund ticket #123 is late", "The model is"]
MAX_TOKENS = 8
#: the environment of the Ray cluster and of the driver (no ACCEL_* variable):
#: Ray and vLLM on loopback only, one thread per rank, no NUMA binding (one node here)
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_HOST_IP": "127.0.0.1",
           "RAY_USAGE_STATS_ENABLED": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
LAYOUTS = {"tp2": {"tp": 2, "pp": 1}, "pp2": {"tp": 1, "pp": 2}}


def _subprocess_env(root: Path) -> dict:
    unset = {"VLLM_CPU_KVCACHE_SPACE"}  # conftest.py's 1 GiB per rank: the script's 64 MiB instead
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_") and k not in unset}
    env.update(RAY_ENV, TMPDIR=str(root))
    return env


def _draft_config(root: Path, target: Path, poor: Path) -> Path:
    """``support`` drafts with the target itself (accepted), ``default`` with a random draft."""
    path = root / "ray-drafts.yaml"
    path.write_text(textwrap.dedent(f"""
        num_speculative_tokens: {K}
        domains:
          support:
            draft: {target}
            match: {{keywords: [refund, delivery, order]}}
        default:
          draft: {poor}
    """).lstrip("\n"))
    return path


SPECULATIVE = {"speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K}}
#: vLLM's first Ray executor (RayDistributedExecutor): the one that copies only the
#: variables whose prefix VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY lists
V1_EXECUTOR = {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}


def runs_table(root: Path, config: Path) -> list[dict]:
    """Accel and stock at TP 2 on vLLM's default Ray executor, accel at TP 2 on its
    first Ray executor, then vLLM as it is (refuses) and stock at PP 2 (fails).
    ``accel-tp2`` comes first: the driver's ``register()`` runs once per process, at
    its first engine, and adds ``ACCEL_`` to vLLM's Ray prefix list only when an
    accel setting is set then (``accel-tp2-v1`` relies on it, as a user's would)."""
    common = {"prompts": PROMPTS, "max_tokens": MAX_TOKENS}
    return [
        {"label": "accel-tp2", **LAYOUTS["tp2"], **common, "engine_kwargs": SPECULATIVE,
         "env": {"ACCEL_ATTENTION_BACKEND": "paged", "ACCEL_DRAFT_CONFIG": str(config),
                 "ACCEL_METRICS_DIR": str(root / "metrics-tp2")}},
        {"label": "stock-tp2", **LAYOUTS["tp2"], **common},
        {"label": "accel-tp2-v1", **LAYOUTS["tp2"], **common,
         "env": {**V1_EXECUTOR, "ACCEL_ATTENTION_BACKEND": "flash", "ACCEL_METRICS_DIR": str(root / "metrics-v1")}},
        {"label": "unshimmed", **LAYOUTS["tp2"], "prompts": PROMPTS[:1], "max_tokens": 1, "shim": False},
        {"label": "stock-pp2", **LAYOUTS["pp2"], "prompts": PROMPTS[:1], "max_tokens": 2},
    ]


def _run_script(target: Path, root: Path, runs: list[dict], timeout: int = 900) -> dict:
    cmd = [sys.executable, str(SCRIPT), str(target), "--num-cpus", "4", "--runs-json", json.dumps(runs)]
    log_path = root / "ray-driver.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, env=_subprocess_env(root), stdout=subprocess.PIPE, stderr=log,
                              text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{log_path.read_text()[-6000:]}"
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def ray_result(tiny_model_dir, tmp_path_factory):
    target = tiny_model_dir("gqa-d64")
    root = tmp_path_factory.mktemp("ray")
    config = _draft_config(root, target, tiny_model_dir("draft-d32", seed=7))
    result = _run_script(target, root, runs_table(root, config))
    print(json.dumps({label: run.get("seconds") for label, run in result["runs"].items()}))
    return result, config


def test_the_cluster_is_on_loopback(ray_result):
    result, _ = ray_result
    assert result["ray_node_address"] == "127.0.0.1"


def test_vllm_cpu_refuses_ray_as_it_is(ray_result):
    """Without the test's shim vLLM's CPU platform refuses the Ray executor at start-up."""
    assert ray_result[0]["runs"]["unshimmed"]["error"] == {
        "phase": "start", "type": "ValueError", "message": "current platform cpu does not support ray."}


@pytest.mark.parametrize("accel_label", ["accel-tp2", "accel-tp2-v1"])
def test_greedy_equals_stock_on_the_ray_executor(ray_result, accel_label):
    runs = ray_result[0]["runs"]
    accel, stock = runs[accel_label], runs["stock-tp2"]
    assert "error" not in accel and "error" not in stock, (accel.get("error"), stock.get("error"))
    assert [len(t) for t in stock["token_ids"]] == [MAX_TOKENS] * len(PROMPTS)
    assert accel["token_ids"] == stock["token_ids"]
    assert [w["attention_backends"] for w in stock["workers"]] == [["CPU_ATTN"]] * 2
    assert all("ACCEL_ATTENTION_BACKEND" not in w["env"] for w in stock["workers"]), stock["workers"]


@pytest.mark.parametrize("accel_label, backend, name", [("accel-tp2", "paged", "ACCEL_PAGED"),
                                                        ("accel-tp2-v1", "flash", "ACCEL_FLASH")])
def test_settings_reach_the_ray_workers(ray_result, accel_label, backend, name):
    result, config = ray_result
    accel = result["runs"][accel_label]
    workers = accel["workers"]
    assert sorted(w["rank"] for w in workers) == [0, 1] and len({w["pid"] for w in workers}) == 2
    assert result["pid"] not in {w["pid"] for w in workers}  # Ray actors, not the driver
    for w in workers:
        assert w["env"]["ACCEL_ATTENTION_BACKEND"] == backend, w
        assert w["attention_backends"] == [name], w  # each rank's layers
    if accel_label == "accel-tp2":
        assert all(w["env"]["ACCEL_DRAFT_CONFIG"] == str(config) for w in workers), workers
    # Ray itself does not carry them: a plain task on the same cluster meanwhile sees none
    assert "ACCEL_ATTENTION_BACKEND" not in accel["plain_ray_task_env"]


@pytest.mark.parametrize("accel_label", ["accel-tp2", "accel-tp2-v1"])
def test_accel_metrics_are_readable(ray_result, accel_label):
    """Rank 0 wrote the KV accounting into the run's ACCEL_METRICS_DIR (copied to the workers)."""
    accel = ray_result[0]["runs"][accel_label]
    steps = [value for name, _, value in accel["metrics"] if name == "accel_kv_steps_total"]
    assert steps and steps[0] > 0, accel["metrics"]


def test_proposer_runs_in_the_ray_workers_and_its_counters_are_the_metrics(ray_result):
    accel = ray_result[0]["runs"]["accel-tp2"]
    assert 0 < accel["spec"]["num_accepted_tokens"] <= accel["spec"]["num_draft_tokens"], accel["spec"]
    stats = accel["accel_stats"]  # one dict per worker (SpeculationStatsExtension)
    assert len(stats) == 2 and _counters(stats[0]) == _counters(stats[1]), stats  # both ranks draft the same
    drafted = {domain: s["drafted"] for domain, s in stats[0].items()}
    assert drafted["support"] > 0, stats[0]
    files = {(name, labels.get("domain")): value for name, labels, value in accel["metrics"]}
    for domain, count in drafted.items():
        assert files[("accel_spec_drafted_tokens_total", domain)] == count, (domain, files)


def _counters(stats: dict) -> dict:
    """The per-domain counters (not the timings, which are each rank's own)."""
    return {domain: {k: s[k] for k in ("state", "k", "steps", "drafted", "accepted")} for domain, s in stats.items()}


def test_vllm_fails_pipeline_parallel_on_ray_here(ray_result):
    """Stock vLLM 0.32 (CPU, with the shim) starts a PP 2 engine on Ray but its first
    step fails in vLLM's scheduler; the day it passes, this test says so."""
    error = ray_result[0]["runs"]["stock-pp2"].get("error")
    assert error is not None and (error["phase"], error["type"]) == ("generate", "KeyError"), error
