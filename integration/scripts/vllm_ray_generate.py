"""Run real vLLM on its Ray executor, on a local Ray cluster this script starts; print one JSON line.

Used by integration/test_vllm_ray.py in a subprocess. The script starts a
one-node Ray cluster (``ray.init``: its GCS, raylet and workers are this process's
children, bound to 127.0.0.1 when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set,
and stopped by ``ray.shutdown()`` at the end), then builds one engine per run with
``distributed_executor_backend="ray"``, one after the other (vLLM is imported once):

    python vllm_ray_generate.py MODEL_DIR --num-cpus 4 --runs-json '[
        {"label": "accel-tp2", "tp": 2, "pp": 1, "env": {"ACCEL_ATTENTION_BACKEND": "paged"},
         "prompts": [...], "max_tokens": 8}, ...]'

A run's ``env`` is set in this (the driver's) process only, after the cluster
started: the Ray workers get those variables only if vLLM's Ray executor copies
them. Run keys: ``label``, ``tp``, ``pp``, ``prompts``, ``max_tokens``; optional
``env``, ``engine_kwargs`` and ``shim`` (false: the driver runs this engine
without :func:`allow_ray_on_cpu`; it shows vLLM's refusal).

vLLM 0.32's CPU platform declares no Ray device (``CpuPlatform.ray_device_key`` is
empty) and so refuses the Ray executor ("current platform cpu does not support
ray."). :func:`allow_ray_on_cpu` (test-only, not part of accel-plugin) gives it
Ray's ``GPU`` resource name instead; the cluster declares that many logical GPUs
(Ray's bookkeeping: no GPU is used, torch stays on the CPU). It runs in this
process (per run) and, as Ray's ``worker_process_setup_hook``, in every Ray
worker process.

Result per run: greedy ``token_ids``; ``workers``: per Ray worker its rank, pid,
the attention backend of its layers and the ``ACCEL_*`` variables it sees;
``plain_ray_task_env``: the ``ACCEL_*`` variables a plain Ray task (not vLLM's)
sees meanwhile; ``accel_stats``: the proposer's per-domain counters from every
worker (``SpeculationStatsExtension``); ``metrics``: the accel samples in the run's
``ACCEL_METRICS_DIR``; ``spec``: vLLM's spec-decode counters; ``seconds``.
Or, when the engine fails, ``error``: the phase (``start``, ``generate``), the
exception's type and message.
"""

import argparse
import gc
import json
import os
import time

from vllm_spec_generate import spec_counters  # this folder is sys.path[0]

SCRIPTS = os.path.dirname(os.path.abspath(__file__))


def allow_ray_on_cpu() -> None:
    """Test-only: let vLLM's CPU platform place its workers with Ray's ``GPU``
    resource (see the module docstring)."""
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.ray_device_key = "GPU"


def _accel_env() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ACCEL_")}


def _worker_info(worker) -> dict:
    """Runs in each Ray worker (collective_rpc): rank, pid, backends, ACCEL_* variables."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = get_layers_from_vllm_config(worker.vllm_config, Attention)
    return {"rank": worker.rank, "pid": os.getpid(), "env": _accel_env(),
            "attention_backends": sorted({layer.attn_backend.get_name() for layer in layers.values()})}


def _plain_task_env() -> dict:
    import ray

    return ray.get(ray.remote(num_cpus=0)(_accel_env).remote())


def _run(model: str, run: dict) -> dict:
    from vllm import LLM, SamplingParams

    saved = {k: os.environ.get(k) for k in run.get("env", {})}
    os.environ.update(run.get("env", {}))
    llm = None
    try:
        kwargs = dict(
            model=model, dtype="float32", enforce_eager=True, max_model_len=512,
            kv_cache_memory_bytes=64 * 2**20, max_num_seqs=16, seed=0, block_size=32,
            tensor_parallel_size=run["tp"], pipeline_parallel_size=run["pp"],
            distributed_executor_backend="ray", disable_log_stats=False,
            worker_extension_cls="accel_plugin.adapters.vllm.proposer.SpeculationStatsExtension",
        )
        kwargs.update(run.get("engine_kwargs", {}))
        from vllm.platforms.cpu import CpuPlatform

        CpuPlatform.ray_device_key = "GPU" if run.get("shim", True) else ""  # the driver's side of the shim
        t0 = time.perf_counter()
        phase = "start"
        try:  # a refusal is a result (the test says which ones it expects)
            llm = LLM(**kwargs)
            t1 = time.perf_counter()
            phase = "generate"
            params = SamplingParams(temperature=0.0, max_tokens=run["max_tokens"], ignore_eos=True)
            outputs = llm.generate(run["prompts"], params, use_tqdm=False)
            t2 = time.perf_counter()
        except Exception as exc:
            return {"error": {"phase": phase, "type": type(exc).__name__, "message": str(exc)},
                    "seconds": {"until_error": round(time.perf_counter() - t0, 1)}}
        speculative = kwargs.get("speculative_config") is not None
        metrics_dir = os.environ.get("ACCEL_METRICS_DIR")
        result = {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "workers": llm.collective_rpc(_worker_info),
            "plain_ray_task_env": _plain_task_env(),
            "accel_stats": llm.collective_rpc("accel_speculation_stats"),
            "spec": spec_counters(llm) if speculative else {},
            "metrics": _metrics(metrics_dir) if metrics_dir else None,
            "seconds": {"start": round(t1 - t0, 1), "generate": round(t2 - t1, 1)},
        }
        return result
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()  # kills this engine's Ray actors
            del llm
            gc.collect()
        _remove_placement_groups()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _remove_placement_groups() -> None:
    """Free the placement groups (and so the actors) of the engines that ran: vLLM
    0.32's Ray executor leaves its group behind at shutdown, and after a failed
    start, and the next engine would wait for the group's resources forever."""
    import ray
    from ray.util.placement_group import PlacementGroup

    for group_id, info in ray.util.placement_group_table().items():
        if info["state"] != "REMOVED":
            ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
    deadline = time.monotonic() + 60  # removal is asynchronous: wait until the GPUs are free again
    while ray.available_resources().get("GPU", 0) < ray.cluster_resources().get("GPU", 0):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray resources not freed: {ray.available_resources()}")
        time.sleep(0.2)


def _metrics(directory: str) -> list:
    """The accel samples in ``directory``, as [name, {label: value}, value] rows."""
    from accel_plugin.observability.metrics_files import read_metrics

    return [[name, dict(labels), value] for (name, labels), value in sorted(read_metrics(directory).items())]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--runs-json", required=True)
    parser.add_argument("--num-cpus", type=int, default=4)
    args = parser.parse_args()
    # Test script only: lets collective_rpc ship the functions above to the workers.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SCRIPTS, os.environ.get("PYTHONPATH")) if p)
    import ray

    runs = json.loads(args.runs_json)
    world = max(run["tp"] * run["pp"] for run in runs)
    hook = {"worker_process_setup_hook": "vllm_ray_generate.allow_ray_on_cpu"}
    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, num_gpus=world, include_dashboard=False, log_to_driver=True,
             runtime_env=hook)
    try:
        node = ray.nodes()[0]["NodeManagerAddress"]
        started = round(time.perf_counter() - t0, 1)
        results = {}
        for run in runs:
            results[run["label"]] = _run(args.model, run)
            print(f"RUN {run['label']} " + json.dumps(results[run["label"]]), flush=True)  # progress
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps({"pid": os.getpid(), "ray_node_address": node, "ray_start_seconds": started,
                                  "runs": results}), flush=True)


if __name__ == "__main__":
    main()
