"""Run real vLLM on a local model and print greedy outputs as JSON (one line).

Used by integration tests in a subprocess, so that vLLM's own multiprocess mode
(engine core and worker processes) runs exactly as it does for a user.

    python vllm_generate.py MODEL_DIR --prompts-json '["a", "b"]' --max-tokens 8
"""

import argparse
import json
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompts-json", required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--engine-kwargs-json", default="{}")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_seqs=16,
        seed=0,
        **json.loads(args.engine_kwargs_json),
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outputs = llm.generate(json.loads(args.prompts_json), params, use_tqdm=False)
    result = {
        "pid": os.getpid(),
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        # Whether vLLM ran accel-plugin's general-plugin entry point in this process.
        "registered_in_driver": bool(
            getattr(sys.modules.get("accel_plugin.adapters.vllm"), "_REGISTERED", False)
        ),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
