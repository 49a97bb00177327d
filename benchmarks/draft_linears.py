"""Benchmark: a draft's matrix products per row count, torch against the native few-row product.

    .venv/bin/python -m benchmarks.draft_linears
    .venv/bin/python -m benchmarks.draft_linears --rows 8 10 12 14 16 --cold 600   # as in a server
    ~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python benchmarks/draft_linears.py   # TGI's torch

One pass over the matrices of one draft forward (random matrices of the draft's shapes,
from its ``config.json``: per layer the fused q/k/v, o, fused gate/up and down, then
the LM head, pruned to ``accel_draft``'s head vocabulary where the draft has one), at
each row count, with ``F.linear`` in float32, ``F.linear`` in bfloat16 (activations
cast; AMX where the CPU has it) and the native few-row product
(:mod:`accel_plugin.kernels.cpu_linear`) of float32 and of bfloat16 matrices (``n/a``
where it cannot be built). Median of ``--repeats`` passes, ms per pass. What
:data:`accel_plugin.speculative.llama.NATIVE_BF16_ROWS` was chosen from.

``--cold MB`` reads a buffer of that many megabytes before every timed pass, so the
matrices come from memory as in a server, where a target step (SmolLM2-135M in
float32: about 540 MB) runs between two draft forwards; by default (0) the passes run
back to back and the matrices stay in the CPU's caches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from accel_plugin.models.dirs import linear_shapes

DRAFT = Path(__file__).resolve().parent.parent / "demo_models" / "smollm2" / "drafts" / "support"


def _head_vocab(draft: Path) -> int | None:
    """Rows of a pruned head (``accel.head_vocab`` in the draft's safetensors), or None."""
    from safetensors import safe_open

    with safe_open(str(draft / "model.safetensors"), "pt") as f:
        return f.get_slice("accel.head_vocab").get_shape()[0] if "accel.head_vocab" in f.keys() else None


def main(argv: list[str] | None = None) -> None:
    from accel_plugin.kernels import cpu_linear

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", type=Path, default=DRAFT, help="a draft's folder (default: the demo's support draft)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cold", type=int, default=0, metavar="MB",
                        help="megabytes read before every timed pass (evicts the matrices; default 0: warm)")
    args = parser.parse_args(argv)
    if args.cold < 0:
        parser.error(f"--cold must be 0 (warm) or a positive number of megabytes; got {args.cold}")
    if not (args.draft / "config.json").is_file():
        raise SystemExit(f"--draft {args.draft}: no config.json there (a Llama draft's folder)")
    config = json.loads((args.draft / "config.json").read_text())
    layers, head = linear_shapes(config)
    shapes = [*layers, (_head_vocab(args.draft) or head[0], head[1])]  # a pruned head: its rows
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(*shape, generator=gen) * 0.02 for shape in shapes]
    as_bf16 = [w.bfloat16() for w in weights]
    columns = {"F.linear fp32": lambda x: [F.linear(a, w) for a, w in zip(x, weights)],
               "F.linear bf16": lambda x: [F.linear(a.bfloat16(), w).float() for a, w in zip(x, as_bf16)]}
    for dtype, name in ((torch.float32, "native fp32"), (torch.bfloat16, "native bf16")):
        ops = cpu_linear.ops(dtype)
        if ops is None:
            columns[name] = None
            continue
        packed = [ops[0](w) for w in weights]
        columns[name] = lambda x, packed=packed, linear=ops[1]: [linear(a, p) for a, p in zip(x, packed)]
    flush = torch.ones(args.cold * 2**18) if args.cold else None  # float32: 4 bytes each
    print(f"torch {torch.__version__}, {args.threads} thread(s), {len(shapes)} matrices of {args.draft} "
          f"(head {shapes[-1][0]}x{shapes[-1][1]}); ms per pass, median of {args.repeats}; "
          + (f"{args.cold} MB read before each pass (cold)" if flush is not None else "passes back to back (warm)"))
    print("\n| rows | " + " | ".join(columns) + " |\n|" + "---|" * (len(columns) + 1))
    with torch.no_grad():
        for rows in args.rows:
            x = [torch.randn(rows, k, generator=gen) for _, k in shapes]
            cells = []
            for run in columns.values():
                if run is None:
                    cells.append("n/a")
                    continue
                run(x)  # warm-up
                times = []
                for _ in range(args.repeats):
                    if flush is not None:
                        flush.sum()
                    t0 = time.perf_counter()
                    run(x)
                    times.append(time.perf_counter() - t0)
                cells.append(f"{statistics.median(times) * 1e3:.2f}")
            print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
