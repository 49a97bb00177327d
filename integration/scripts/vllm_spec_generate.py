"""Run real vLLM, optionally with speculation, over several batches; print one JSON line.

Used by integration/test_vllm_speculative.py in a subprocess (one engine per
configuration) and by benchmarks/speculative.py.

    python vllm_spec_generate.py MODEL_DIR --batches-json '[["a", "b"], ["c"]]' \\
        --max-tokens-json '[32, 96]' --spec-json '{"method": "custom_class", ...}'

Each batch is one ``generate`` call. The result line (``RESULT {...}``) has the
greedy token ids per batch, wall time and generated tokens per batch, vLLM's
spec-decode counters and, for accel's proposer, its per-domain counters.
"""

import argparse
import json
import os
import time


def spec_counters(llm) -> dict:
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_"):
            key = metric.name.removeprefix("vllm:spec_decode_")
            out[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batches-json", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-tokens-json", default="null", help="a list: max_tokens per batch")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--spec-json", default="null")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--warmup", action="store_true", help="one untimed generate before the batches")
    parser.add_argument("--compile", action="store_true", help="vLLM's default compilation instead of enforce_eager")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    spec = json.loads(args.spec_json)
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=not args.compile,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_seqs=16,
        seed=0,
        disable_log_stats=False,
        **({"speculative_config": spec} if spec else {}),
        # adds the RPC "accel_speculation_stats" to vLLM's worker (any process)
        worker_extension_cls="accel_plugin.adapters.vllm.proposer.SpeculationStatsExtension",
    )
    batches = json.loads(args.batches_json)
    max_tokens = json.loads(args.max_tokens_json) or [args.max_tokens] * len(batches)
    if args.warmup:
        llm.generate(batches[0][:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    token_ids, seconds, generated = [], [], []
    for prompts, n in zip(batches, max_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        token_ids.append([list(o.outputs[0].token_ids) for o in outputs])
        generated.append(sum(len(o.outputs[0].token_ids) for o in outputs))
    accel = None
    if spec and spec.get("method") == "custom_class":
        accel = llm.collective_rpc("accel_speculation_stats")[0]
    result = {
        "pid": os.getpid(),
        "token_ids": token_ids,
        "seconds": seconds,
        "generated": generated,
        "spec": spec_counters(llm) if spec else {},
        "accel": accel,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
