"""Run real vLLM on a local model and print greedy outputs as JSON (one line).

Used by integration tests in a subprocess, so that vLLM's own multiprocess mode
(engine core and worker processes) runs exactly as it does for a user.

    python vllm_generate.py MODEL_DIR --prompts-json '["a", "b"]' --max-tokens 8

Optional:
  --runs-json '[{"label": "stock", "engine_kwargs": {}},
                {"label": "flash", "engine_kwargs": {"attention_backend": "ACCEL_FLASH"}}]'
      build one engine after the other in this process (saves vLLM's import time);
      the result then has "runs": {label: {...}} besides the first run's keys.
  --prefix-prompts-json '[...]'  generated first in each engine, outputs dropped
      (fills the prefix cache before the measured prompts).
  --logprobs N                   also return the top-N logprobs of every generated token.
  --metrics                      also return vLLM's counters (spec decode, prefix cache)
      of each run's engine.
"""

import argparse
import gc
import json
import os
import sys


def _attention_backends(worker) -> list[str]:
    """Runs in each worker (vLLM's collective_rpc): the backend of every attention layer."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = get_layers_from_vllm_config(worker.vllm_config, Attention)
    return sorted({layer.attn_backend.get_name() for layer in layers.values()})


def _counters(llm) -> dict:
    values = {}
    for metric in llm.get_metrics():
        if hasattr(metric, "value") and not isinstance(metric.value, float):
            values[metric.name] = values.get(metric.name, 0) + metric.value
        elif hasattr(metric, "values"):
            prev = values.get(metric.name, [])
            merged = [a + b for a, b in zip(prev, metric.values)] if prev else list(metric.values)
            values[metric.name] = merged
    return values


def _run(args, prompts, engine_kwargs) -> dict:
    # Test script only: lets collective_rpc ship _attention_backends to worker processes.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_seqs=16,
        seed=0,
    )
    if args.metrics:
        kwargs["disable_log_stats"] = False
    kwargs.update(engine_kwargs)
    llm = LLM(**kwargs)
    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=args.logprobs
    )
    if args.prefix_prompts_json:
        llm.generate(json.loads(args.prefix_prompts_json), params, use_tqdm=False)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "attention_backends": sorted({n for names in llm.collective_rpc(_attention_backends) for n in names}),
    }
    if args.logprobs is not None:
        result["logprobs"] = [
            [{str(tok): lp.logprob for tok, lp in step.items()} for step in o.outputs[0].logprobs]
            for o in outputs
        ]
    if args.metrics:
        # vLLM re-creates its Prometheus collectors with each engine: values are this engine's.
        result["metrics"] = _counters(llm)
    del llm
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompts-json", required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--engine-kwargs-json", default="{}")
    parser.add_argument("--runs-json", default=None)
    parser.add_argument("--prefix-prompts-json", default=None)
    parser.add_argument("--logprobs", type=int, default=None)
    parser.add_argument("--metrics", action="store_true")
    args = parser.parse_args()

    prompts = json.loads(args.prompts_json)
    common = json.loads(args.engine_kwargs_json)
    runs = json.loads(args.runs_json) if args.runs_json else [{"label": "default", "engine_kwargs": {}}]
    results = {}
    for run in runs:
        results[run["label"]] = _run(args, prompts, {**common, **run.get("engine_kwargs", {})})
    first = results[runs[0]["label"]]
    result = {
        "pid": os.getpid(),
        "token_ids": first["token_ids"],
        "texts": first["texts"],
        # Whether vLLM ran accel-plugin's general-plugin entry point in this process.
        "registered_in_driver": bool(
            getattr(sys.modules.get("accel_plugin.adapters.vllm"), "_REGISTERED", False)
        ),
    }
    if args.runs_json:
        result["runs"] = results
    else:
        result.update({k: v for k, v in first.items() if k not in result})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
