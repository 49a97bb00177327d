"""Benchmark: vLLM's own CPU attention (CPU_ATTN) vs ACCEL_FLASH vs ACCEL_PAGED, plain decoding.

    .venv/bin/python -m benchmarks.cpu_attention                  # float32 and bfloat16, batch 1 8 32 64
    .venv/bin/python -m benchmarks.cpu_attention --dtypes float32 --batches 1 8 --max-tokens 32

Model: SmolLM2-135M-Instruct (``accel models path smollm2``; 9 query / 3 KV heads, head
size 64), greedy, ``ignore_eos``, no speculation, block size 32 (CPU_ATTN's), eager.
Each engine runs in its own process (``--worker``), all of them started and warmed up
first; then per round and batch size the engines run one after another, the order rotating,
so only one uses the CPU at a time. Printed per dtype and batch: generated tokens/s per
engine (the median round), each accel engine's ratio to CPU_ATTN (the median of the rounds'
paired ratios), whether its greedy ids equal CPU_ATTN's in every round, and the attention
backend every engine really used, read back from its worker. On CPU the accel engines run
the native CPU kernels where they build, else the kernels' torch CPU path (each worker's
start-up line names which; ``TRITON_INTERPRET`` is removed from the workers' environment).
One run: numbers from a shared machine move.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: label -> ACCEL_ATTENTION_BACKEND (None: vLLM's own backend)
ENGINES = {"CPU_ATTN": None, "ACCEL_FLASH": "flash", "ACCEL_PAGED": "paged"}
PROMPT = ("Question {i}: a customer writes that order number {n} arrived late and the box was "
          "damaged. Write a short, polite answer that explains what happens next.")


def prompts(batch: int) -> list[str]:
    return [PROMPT.format(i=i, n=4000 + 37 * i) for i in range(batch)]


def _backends(worker) -> list[str]:
    """Runs in the worker (``collective_rpc``): the backend of every attention layer."""
    from accel_plugin.adapters.vllm._compat import attention_backend_names

    return attention_backend_names(worker.vllm_config)


def worker(args: dict) -> int:
    """One engine: READY with its backends, then a RESULT per batch size read from stdin."""
    import torch
    from vllm import LLM, SamplingParams

    torch.set_flush_denormal(True)  # timings must not hinge on denormals
    llm = LLM(model=args["model"], dtype=args["dtype"], enforce_eager=True, max_model_len=512, block_size=32,
              max_num_seqs=max(args["batches"]), kv_cache_memory_bytes=args["kv_bytes"], seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=args["max_tokens"], ignore_eos=True)
    llm.generate(prompts(2), params, use_tqdm=False)  # warm-up
    backends = sorted({n for names in llm.collective_rpc(_backends) for n in names})
    print("READY " + json.dumps({"backends": backends}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        batch = json.loads(line)["batch"]
        t0 = time.perf_counter()
        outputs = llm.generate(prompts(batch), params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        ids = [list(o.outputs[0].token_ids) for o in outputs]
        print("RESULT " + json.dumps({"seconds": seconds, "tokens": sum(map(len, ids)), "ids": ids}), flush=True)
    return 0


class _Engine:
    def __init__(self, label: str, backend: str | None, args: dict):
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
               "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        env.pop("TRITON_INTERPRET", None)
        env.pop("ACCEL_DRAFT_CONFIG", None)
        env.pop("ACCEL_ATTENTION_BACKEND", None)
        if backend:
            env["ACCEL_ATTENTION_BACKEND"] = backend
        self.label = label
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.cpu_attention", "--worker", json.dumps(args)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._expect("READY")

    def _expect(self, kind: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith(kind + " "):
                return json.loads(line[len(kind) + 1:])
        raise RuntimeError(f"{self.label}: the worker ended (exit {self.proc.wait()}) before {kind}")

    def run(self, batch: int) -> dict:
        self.proc.stdin.write(json.dumps({"batch": batch}) + "\n")
        self.proc.stdin.flush()
        return self._expect("RESULT")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)


def run(dtype: str, batches: list[int], model: str, max_tokens: int, kv_bytes: int, rounds: int) -> list[dict]:
    args = {"model": model, "dtype": dtype, "batches": batches, "max_tokens": max_tokens, "kv_bytes": kv_bytes}
    engines = {}
    try:
        for label, backend in ENGINES.items():
            engines[label] = _Engine(label, backend, args)
            print(f"  {dtype}: {label} ready, backends {engines[label].ready['backends']}", file=sys.stderr)
        labels = list(engines)
        rows = [{"dtype": dtype, "batch": batch, "rounds": [],
                 "backends": {label: e.ready["backends"] for label, e in engines.items()}} for batch in batches]
        for r in range(rounds):
            for i, row in enumerate(rows):
                shift = (i + r) % len(labels)  # who goes first rotates with the batch and the round
                order = labels[shift:] + labels[:shift]
                row["rounds"].append({label: engines[label].run(row["batch"]) for label in order})
        return rows
    finally:
        for engine in engines.values():
            engine.close()


def _rate(result: dict) -> float:
    return result["tokens"] / result["seconds"]


def table(rows: list[dict]) -> str:
    """tok/s: the median round; ratio: the median of the rounds' paired ratios (same round, engines
    back to back); greedy ids: equal to CPU_ATTN's in every round."""
    lines = ["| dtype | batch | CPU_ATTN tok/s | ACCEL_FLASH tok/s | ACCEL_PAGED tok/s | greedy ids equal |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        rounds = row["rounds"]
        cells = [f"{statistics.median(_rate(r['CPU_ATTN']) for r in rounds):.1f}"]
        same = []
        for label in ("ACCEL_FLASH", "ACCEL_PAGED"):
            rate = statistics.median(_rate(r[label]) for r in rounds)
            ratio = statistics.median(_rate(r[label]) / _rate(r["CPU_ATTN"]) for r in rounds)
            cells.append(f"{rate:.1f} ({ratio:.2f}x)")
            same.append("yes" if all(r[label]["ids"] == r["CPU_ATTN"]["ids"] for r in rounds) else "NO")
        lines.append(f"| {row['dtype']} | {row['batch']} | {' | '.join(cells)} | {' / '.join(same)} |")
    backends = rows[0]["backends"] if rows else {}
    lines.append("")
    lines.append(f"{len(rows[0]['rounds']) if rows else 0} round(s); backends read back: "
                 + ", ".join(f"{k} -> {'/'.join(v)}" for k, v in backends.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per batch size (median reported)")
    parser.add_argument("--model", help="model directory (default: accel models path smollm2)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    model = args.model
    if model is None:
        from accel_plugin.models import store

        path = store.cached_path("smollm2")
        if path is None:
            parser.error("SmolLM2 is not in the model cache: run `accel models get smollm2` or pass --model")
        model = str(path)
    if min(args.batches) < 1:
        parser.error(f"--batches must be >= 1; got {args.batches}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1; got {args.rounds}")
    rows = []
    for dtype in args.dtypes:
        rows += run(dtype, args.batches, model, args.max_tokens, args.kv_cache_mb * 2**20, args.rounds)
        print(f"  {dtype} done:\n{table(rows[-len(args.batches):])}", file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
