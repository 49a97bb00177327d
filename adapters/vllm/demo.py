"""The vLLM side of `accel demo`: one engine per configuration, timed generation.

vLLM is imported here, inside the adapter, never by the core. The CLI
(:mod:`accel_plugin.cli.demo`) runs every configuration in its own subprocess::

    python -m accel_plugin.adapters.vllm.demo '{"target": ..., "batches": ...}'

which prints one line ``RESULT {json}``. The engine runs in vLLM's single-process
mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the caller), so the domain
proposer lives in this process and its per-domain counters are read directly with
:func:`accel_plugin.adapters.vllm.proposer.collect_stats`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"


def spec_config(num_speculative_tokens: int = 5) -> dict:
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_speculative_tokens}


def _spec_counters(llm: Any) -> dict:
    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_"):
            key = metric.name.removeprefix("vllm:spec_decode_")
            out[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def measure(target: str | Path, *, warmup: list[list[str]], timed: list[dict], spec: dict | None = None,
            max_tokens: int = 64, dtype: str = "float32", max_model_len: int = 512, repeats: int = 1) -> dict:
    """Start one engine, run the ``warmup`` batches untimed, then every ``timed``
    entry (``{"name": str, "prompts": [...]}``, one ``generate`` call each).

    Each timed entry runs ``repeats`` times; its time is the fastest run's.
    Returns per timed entry: generated tokens, seconds and the greedy token ids;
    vLLM's spec-decode counters; the proposer's per-domain counters (when ``spec``
    is the domain proposer and the proposer lives in this process) read after the
    warm-up and at the end, so that the timed part can be told apart.
    """
    import torch
    from vllm import LLM, SamplingParams

    # denormal floats make CPU matmuls/exp many times slower, data-dependently; the
    # demo's timings must not hinge on them (flushing changes values below ~1e-38 only)
    torch.set_flush_denormal(True)
    t0 = time.perf_counter()
    llm = LLM(
        model=str(target),
        dtype=dtype,
        enforce_eager=True,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_seqs=16,
        seed=0,
        disable_log_stats=False,
        **({"speculative_config": spec} if spec else {}),
    )
    startup_s = time.perf_counter() - t0

    def stats() -> dict | None:
        if not spec or spec.get("method") != "custom_class":
            return None
        from .proposer import collect_stats

        return collect_stats()

    def clock() -> tuple[int, float]:
        from .proposer import live_proposers

        cores = [p.core for p in live_proposers()] if spec else []
        return sum(c.num_steps for c in cores), sum(c.propose_seconds for c in cores)

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    for prompts in warmup:
        llm.generate(prompts, params, use_tqdm=False)
    warmup_s = time.perf_counter() - t0
    after_warmup = stats()
    runs = []
    for entry in timed:
        # best of `repeats` (the machine is shared: the fastest run is the least disturbed);
        # the proposer's counters cover all repeats
        best, steps, propose_s = float("inf"), 0, 0.0
        for _ in range(max(1, repeats)):
            steps0, propose0 = clock()
            t0 = time.perf_counter()
            outputs = llm.generate(entry["prompts"], params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            steps1, propose1 = clock()
            if seconds < best:
                best, steps, propose_s = seconds, steps1 - steps0, propose1 - propose0
        runs.append({
            "name": entry["name"],
            "seconds": best,
            "propose_steps": steps,
            "propose_seconds": propose_s,
            "generated": sum(len(o.outputs[0].token_ids) for o in outputs),
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "stats": stats(),
        })
    return {
        "startup_s": startup_s,
        "warmup_s": warmup_s,
        "runs": runs,
        "after_warmup": after_warmup,
        "final": stats(),
        "spec": _spec_counters(llm) if spec else {},
    }


def run_configuration(target: str | Path, *, draft_config: str | Path | None = None,
                      attention_backend: str = "flash", num_speculative_tokens: int = 5,
                      timeout_s: float = 600, **kwargs: Any) -> dict:
    """:func:`measure` in a fresh Python process (one engine per process, single-process
    vLLM so that the proposer's counters are readable); speculation with the domain
    proposer when ``draft_config`` is given. Raises ``RuntimeError`` with the
    subprocess's output tail when it fails."""
    import os
    import subprocess

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "ACCEL_ATTENTION_BACKEND": attention_backend,
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.pop("ACCEL_DRAFT_CONFIG", None)
    # the Triton interpreter would take many minutes: on CPU the demo times the kernels'
    # pure-torch reference (the accel backend warns once that it does)
    env.pop("TRITON_INTERPRET", None)
    args = {"target": str(target), **kwargs}
    if draft_config is not None:
        env["ACCEL_DRAFT_CONFIG"] = str(draft_config)
        args["spec"] = spec_config(num_speculative_tokens)
    cmd = [sys.executable, "-m", "accel_plugin.adapters.vllm.demo", json.dumps(args)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"vLLM run did not finish within {timeout_s:.0f} s") from exc
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"vLLM run failed (exit code {proc.returncode}):\n{tail}")
    result = json.loads(line[len("RESULT "):])
    result["warnings"] = sorted({l.strip() for l in proc.stderr.splitlines() if "accel_plugin" in l and "Warning" in l})
    return result


def main(argv: list[str] | None = None) -> int:
    args = json.loads((argv if argv is not None else sys.argv[1:])[0])
    result = measure(args.pop("target"), **args)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
