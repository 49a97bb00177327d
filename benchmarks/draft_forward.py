"""Benchmark: one draft forward against one target forward, per batch size and dtype.

    .venv/bin/python -m benchmarks.draft_forward
    .venv/bin/python -m benchmarks.draft_forward --batches 1 8 32 --dtypes float32 bfloat16 --context 200

What is timed: :meth:`LlamaDraftModel.forward` of a draft (default: the SmolLM2
demo's ``support`` draft) for one new token per row after a cached context of
``--context`` tokens, at each batch size and dtype; and, for the cost ratio ``c``,
the same one-token forward of the target itself, loaded with the same lean Llama
code (:class:`LlamaDraftModel` on the target's folder, float32). That target time
is an *estimate* of the framework's plain step: a torch-eager forward with
contiguous per-request KV, no scheduler, no sampler, no paged attention; the
``c`` that vLLM measures divides by its real step, which costs more, so its ``c``
is lower than the one printed here.

Also timed (``draft k``): one :meth:`DraftEngine.draft` call of ``k`` tokens per row
for running requests (one new verified token each), per draft token, which adds
the engine's host work around the forwards.

Precisions: ``float32``, ``bfloat16`` (weights, activations and KV) and ``mixed``
(float32 compute with bfloat16 weights: what ``dtype: bfloat16`` runs as on a CPU;
without native bfloat16, bfloat16 weights for forwards of at most
:data:`~accel_plugin.speculative.llama.SMALL_BATCH_ROWS` rows; with it, bfloat16
weights for every forward, by the native few-row product up to
:data:`~accel_plugin.speculative.llama.NATIVE_BF16_ROWS` rows), and ``mixed-torch``
(the same without the native product: on a CPU with native bfloat16, torch's bfloat16
product at every row count; elsewhere plain float32).

Printed per batch and precision: ms per draft forward (median of ``--iters``, the
smallest of ``--rounds`` rounds), ms per target forward, ``c`` measured, and the
weight-size estimate (draft bytes one forward reads / target bytes, each in the
dtype it runs in) and their ratio (the goal of issue 23: at most 1.5).
Threads: ``--threads`` (default 2, what vLLM's CPU worker uses on this machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

DEMO = Path(__file__).resolve().parent.parent / "demo_models" / "smollm2"

#: the precisions compared: ``mixed`` is what ``dtype: bfloat16`` runs as on a CPU
#: (:func:`accel_plugin.speculative.llama.resolve_precision`), ``mixed-torch`` the same
#: without the native few-row product
PRECISIONS = {
    "float32": {"dtype": torch.float32},
    "bfloat16": {"dtype": torch.bfloat16},
    "mixed": {"dtype": torch.float32, "small_batch_weights": torch.bfloat16},
    "mixed-torch": {"dtype": torch.float32, "small_batch_weights": torch.bfloat16, "small_batch_rows": 0},
}


def _target_dir() -> Path:
    from accel_plugin.models.store import cached_path

    path = cached_path("smollm2")
    if path is None:
        raise SystemExit("the smollm2 target is not fetched: run `make models` or pass --target DIR")
    return path


def _prefilled(model, batch: int, context: int, seed: int = 0) -> torch.Tensor:
    """Allocate ``batch`` slots and run a ``context``-token prompt into each; return the slots."""
    rng = np.random.default_rng(seed)
    slots = torch.tensor([model.alloc_slot() for _ in range(batch)], dtype=torch.long)
    for b in range(batch):
        tokens = torch.from_numpy(rng.integers(3, 4000, (1, context)))
        model.forward(tokens, torch.zeros(1, dtype=torch.long), torch.tensor([context]), slots[b : b + 1])
    return slots


def _time_forward(model, slots: torch.Tensor, context: int, iters: int, rounds: int) -> float:
    batch = len(slots)
    tokens = torch.full((batch, 1), 7, dtype=torch.long)
    start = torch.full((batch,), context, dtype=torch.long)
    q_lens = torch.ones(batch, dtype=torch.long)
    best = float("inf")
    for _ in range(rounds):
        model.forward(tokens, start, q_lens, slots)  # warm-up
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            model.forward(tokens, start, q_lens, slots)
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times))
    return best * 1e3


def _time_engine(draft_dir: Path, target_dir: Path, precision: dict, batch: int, context: int, k: int,
                 iters: int) -> float:
    """ms per draft token of DraftEngine.draft for ``batch`` running requests."""
    from accel_plugin.speculative.draft_engine import DraftEngine, DraftJob
    from accel_plugin.speculative.llama import LlamaDraftModel

    max_len = context + (iters + 2) * (k + 1) + 8
    engine = DraftEngine(max_len=max_len, target_dir=str(target_dir))
    engine.models[str(draft_dir)] = LlamaDraftModel(draft_dir, max_len=max_len, target_dir=target_dir, **precision)
    rng = np.random.default_rng(1)
    contexts = [rng.integers(3, 4000, context) for _ in range(batch)]
    caches = [engine.new_cache(str(draft_dir)) for _ in range(batch)]
    times = []
    for step in range(iters + 1):
        jobs = [DraftJob(c, ctx, k) for c, ctx in zip(caches, contexts)]
        result = engine.draft(str(draft_dir), jobs)
        if step:
            times.append(result.seconds / result.rounds)
        contexts = [np.append(ctx, d[0]) for ctx, d in zip(contexts, result.drafts)]
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    from accel_plugin.speculative.llama import LlamaDraftModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=Path, default=DEMO / "drafts" / "support")
    parser.add_argument("--target", type=Path, default=None, help="the target's folder (default: the smollm2 cache)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "mixed"], choices=list(PRECISIONS))
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, default=5, help="draft tokens per engine call (the 'engine' column)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target_dir = args.target or _target_dir()
    max_len = args.context + 64
    target = LlamaDraftModel(target_dir, dtype=torch.float32, max_len=max_len, initial_slots=max(args.batches))
    drafts = {name: LlamaDraftModel(args.draft, max_len=max_len, initial_slots=max(args.batches),
                                    target_dir=target_dir, **PRECISIONS[name])
              for name in args.dtypes}
    print(f"draft {args.draft.name}, target {target_dir}, context {args.context}, threads {args.threads}")
    print("target time: the lean torch-eager forward of the target (float32), an estimate of the plain step")
    header = (f"{'batch':>5} {'dtype':>9} {'draft ms':>9} {'engine ms/tok':>13} {'target ms':>9} "
              f"{'c':>6} {'c (size)':>8} {'c/size':>6}")
    print(header)
    for batch in args.batches:
        t_slots = _prefilled(target, batch, args.context)
        target_ms = _time_forward(target, t_slots, args.context, max(5, args.iters // 4), args.rounds)
        for s in t_slots.tolist():
            target.free_slot(s)
        for name, model in drafts.items():
            slots = _prefilled(model, batch, args.context)
            draft_ms = _time_forward(model, slots, args.context, args.iters, args.rounds)
            for s in slots.tolist():
                model.free_slot(s)
            engine_ms = _time_engine(args.draft, target_dir, PRECISIONS[name], batch, args.context, args.k,
                                     max(3, args.iters // 4))
            size = model.forward_bytes_at(batch) / target.forward_bytes
            c = draft_ms / target_ms
            print(f"{batch:>5} {name:>9} {draft_ms:>9.2f} {engine_ms:>13.2f} {target_ms:>9.2f} "
                  f"{c:>6.3f} {size:>8.3f} {c / size:>6.2f}")


if __name__ == "__main__":
    main()
