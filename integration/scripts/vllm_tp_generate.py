"""Run real vLLM at several tensor-parallel sizes in one process; print one JSON line.

Used by integration/test_vllm_tensor_parallel.py in a subprocess. Each run builds
one engine after the other (vLLM is imported once); a run may set environment
variables for its engine (``ACCEL_ATTENTION_BACKEND``, ``ACCEL_DRAFT_CONFIG``):
with ``tensor_parallel_size > 1`` vLLM spawns fresh worker processes for the
engine, and they read the variables then.

    python vllm_tp_generate.py MODEL_DIR --runs-json '[
        {"label": "flash-tp2", "tp": 2, "env": {"ACCEL_ATTENTION_BACKEND": "flash"},
         "prompts": [...], "max_tokens": 8}, ...]'

Run keys: ``label``, ``tp``, ``prompts``, ``max_tokens``; optional ``env``,
``engine_kwargs``, ``record_drafts`` (digest of every draft the proposer of each
rank produced) and ``perturb_drafts_on_ranks`` (those ranks hand vLLM shifted
drafts instead of their own, after recording them: shows whose drafts vLLM verifies).

Result per run: greedy ``token_ids``; ``ranks``: per TP rank its pid, the attention
backend of every layer and, for a speculative run, its draft digest and counters;
``spec``: vLLM's spec-decode counters; ``seconds``: engine start and generate.
"""

import argparse
import gc
import json
import os
import time

from vllm_spec_generate import spec_counters  # this folder is sys.path[0]


def _rank_info(worker) -> dict:
    """Runs in each worker (collective_rpc): rank, pid, attention backends."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = get_layers_from_vllm_config(worker.vllm_config, Attention)
    return {"rank": worker.rank, "pid": os.getpid(),
            "attention_backends": sorted({layer.attn_backend.get_name() for layer in layers.values()})}


def _record_drafts(worker, perturb_ranks) -> int:
    """Runs in each worker: wrap the proposer vLLM calls (the model runner's drafter)
    so that it keeps a digest of the drafts it produces; on ``perturb_ranks`` hand
    vLLM shifted drafts instead. Returns this worker's rank."""
    import hashlib

    drafter = worker.model_runner.drafter
    original = drafter.propose
    digest = hashlib.sha256()
    counts = {"calls": 0, "draft_tokens": 0}
    vocab = worker.vllm_config.model_config.get_vocab_size()
    perturb = worker.rank in perturb_ranks

    def propose(*args, **kwargs):
        drafts = original(*args, **kwargs)
        digest.update(json.dumps(drafts).encode())
        counts["calls"] += 1
        counts["draft_tokens"] += sum(len(d) for d in drafts)
        return [[(t + 1) % vocab for t in d] for d in drafts] if perturb else drafts

    drafter.propose = propose
    drafter.tp_test_record = lambda: {"digest": digest.hexdigest(), **counts, "perturbed": perturb}
    return worker.rank


def _draft_record(worker) -> dict:
    from accel_plugin.adapters.vllm.proposer import collect_stats

    return {"rank": worker.rank, **worker.model_runner.drafter.tp_test_record(), "accel": collect_stats()}


def _run(model: str, run: dict) -> dict:
    from vllm import LLM, SamplingParams

    saved = {k: os.environ.get(k) for k in run.get("env", {})}
    os.environ.update(run.get("env", {}))
    try:
        tp = run["tp"]
        kwargs = dict(
            model=model, dtype="float32", enforce_eager=True, max_model_len=512,
            kv_cache_memory_bytes=64 * 2**20, max_num_seqs=16, seed=0, block_size=32,
            tensor_parallel_size=tp, disable_log_stats=False,
            **({"distributed_executor_backend": "mp"} if tp > 1 else {}),
        )
        kwargs.update(run.get("engine_kwargs", {}))
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        t1 = time.perf_counter()
        speculative = kwargs.get("speculative_config") is not None
        if speculative and run.get("record_drafts"):
            llm.collective_rpc(_record_drafts, args=(run.get("perturb_drafts_on_ranks", []),))
        params = SamplingParams(temperature=0.0, max_tokens=run["max_tokens"], ignore_eos=True)
        outputs = llm.generate(run["prompts"], params, use_tqdm=False)
        t2 = time.perf_counter()
        ranks = llm.collective_rpc(_rank_info)
        if speculative and run.get("record_drafts"):
            for info, record in zip(ranks, llm.collective_rpc(_draft_record)):
                info["drafts"] = record
        result = {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "ranks": ranks,
            "spec": spec_counters(llm) if speculative else {},
            "seconds": {"start": round(t1 - t0, 1), "generate": round(t2 - t1, 1)},
        }
        del llm
        gc.collect()
        return result
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--runs-json", required=True)
    args = parser.parse_args()
    # Test script only: lets collective_rpc ship the functions above to worker processes.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    runs = {run["label"]: _run(args.model, run) for run in json.loads(args.runs_json)}
    print("RESULT " + json.dumps({"pid": os.getpid(), "runs": runs}), flush=True)


if __name__ == "__main__":
    main()
