"""Sample one prompt many times with real vLLM (temperature > 0, a seed per request); print one JSON line.

Used by integration/test_vllm_speculative_sampling.py in a subprocess. Request
``i`` has ``seed = seed0 + i``, so a run is reproducible and the requests are
independent samples.

    python vllm_spec_sample.py MODEL_DIR --prompt "The model is" --num-samples 2000 \\
        --max-tokens 4 --temperature 0.3 --spec-json '{"method": "custom_class", ...}'

The result line (``RESULT {...}``) has the prompt's token ids, whether
``expand_batch_to_tokens`` works in this process once accel-plugin is loaded
(``expand_ok``), whether accel-plugin had to replace vLLM's own (``fix_installed``,
patch 4 of adapters/vllm/_patches.py), and ``runs``: ``as_is`` (vLLM with the
plugins it loads) and, with ``--also-unfixed`` when the fix was installed,
``unfixed`` (the same requests with vLLM's own function put back).
Each run has the generated token ids per request, vLLM's spec-decode counters and
accel's per-domain counters for that run alone.

``expand_batch_to_tokens`` spreads per-request sampling parameters (temperature,
top-k, top-p) over the draft positions before the rejection sampler. vLLM CPU
0.32's C++ shim for its kernel writes into an int64 copy of the output and never
copies it back, so at temperature > 0 the target probabilities the drafts are
verified against come from uninitialised memory.
"""

import argparse
import json
import time

from vllm_spec_generate import spec_counters


def expand_works() -> bool:
    """Whether this process's ``expand_batch_to_tokens`` spreads float temperatures correctly."""
    from accel_plugin.adapters.vllm import _patches

    return not _patches.expand_batch_to_tokens_broken()


def _delta(after, before):
    if isinstance(after, list):
        return [a - b for a, b in zip(after, before or [0] * len(after))]
    return after - (before or 0)


def _snapshot(llm, accel: bool) -> tuple[dict, dict]:
    stats = llm.collective_rpc("accel_speculation_stats")[0] if accel else {}
    return spec_counters(llm), {d: {k: s[k] for k in ("drafted", "accepted", "steps")} for d, s in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--num-samples", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--seed0", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--spec-json", default="null")
    parser.add_argument("--also-unfixed", action="store_true",
                        help="when accel-plugin replaced vLLM's expand_batch_to_tokens, also run with vLLM's own")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    spec = json.loads(args.spec_json)
    accel = bool(spec) and spec.get("method") == "custom_class"
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=128,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_seqs=args.max_num_seqs,
        seed=0,
        disable_log_stats=False,
        **({"speculative_config": spec} if spec else {}),
        worker_extension_cls="accel_plugin.adapters.vllm.proposer.SpeculationStatsExtension",
    )
    params = [
        SamplingParams(temperature=args.temperature, seed=args.seed0 + i, max_tokens=args.max_tokens, ignore_eos=True)
        for i in range(args.num_samples)
    ]

    def run() -> dict:
        counters0, accel0 = _snapshot(llm, accel)
        t0 = time.perf_counter()
        outputs = llm.generate([args.prompt] * args.num_samples, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        counters1, accel1 = _snapshot(llm, accel)
        return {
            "prompt_token_ids": list(outputs[0].prompt_token_ids),
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "seconds": seconds,
            "spec": {k: _delta(v, counters0.get(k)) for k, v in counters1.items()},
            "accel": {d: {k: _delta(v, accel0.get(d, {}).get(k)) for k, v in s.items()} for d, s in accel1.items()},
        }

    from accel_plugin.adapters.vllm import _patches

    expand_ok = expand_works()  # after LLM(): the platform has installed its kernels, the plugin its fix
    fix_installed = _patches.sampler_fix_installed()
    runs = {"as_is": run()}
    if args.also_unfixed and fix_installed:
        _patches.uninstall_sampler_fix()
        runs["unfixed"] = run()
    print("RESULT " + json.dumps({"expand_ok": expand_ok, "fix_installed": fix_installed, "runs": runs}),
          flush=True)


if __name__ == "__main__":
    main()
