"""A short demonstration run of real vLLM with accel-plugin loaded (used by `accel demo`).

vLLM is imported here, inside the adapter, never by the core.
"""

from __future__ import annotations

import time
from pathlib import Path

DEMO_PROMPTS = (
    "Customer: my refund ticket",
    "def parse_order(",
    "The attention kernel reads the cache",
)


def generate(model_dir: Path, *, prompts=DEMO_PROMPTS, max_tokens: int = 24) -> list[dict]:
    """Greedy generation with vLLM (CPU settings); returns one dict per prompt."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_seqs=8,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(list(prompts), params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return [
        {
            "prompt": o.prompt,
            "text": o.outputs[0].text,
            "tokens": len(o.outputs[0].token_ids),
            "tokens_per_s": generated / elapsed,
        }
        for o in outputs
    ]
