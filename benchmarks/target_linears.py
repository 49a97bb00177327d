"""Benchmark: TGI's ``F.linear`` against the packed copies' products, per row count, for a target's matrices.

    ~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python benchmarks/target_linears.py   # TGI's torch, with IPEX
    .venv/bin/python -m benchmarks.target_linears --threads 2 --rows 1 8 16 24 32 64   # with vLLM's onednn_mm

What :mod:`accel_plugin.adapters.tgi.packed_linears` decides at start-up, shown in full:
the products of one decode step of the target (random matrices of its shapes, from its
``config.json``: per layer the fused q/k/v, o, fused gate/up and down matrices, as TGI
holds them, then the LM head), each layer's matrices distinct so that the weights
stream from memory as in a real step, at each row count (a batch of ``b`` requests
verifying ``k`` drafts multiplies ``b (k + 1)`` rows), with ``F.linear`` (TGI's
``FastLinear``), oneDNN's prepacked copy and the native few-row product's copy
(:mod:`accel_plugin.kernels.cpu_linear`; ``n/a`` where it cannot be built), and where vLLM
is installed, vLLM's CPU product (``onednn_mm``, what vLLM's float32 layers multiply by;
:mod:`accel_plugin.adapters.vllm.packed_linears` replaces it by the native copy). Median of
``--repeats`` passes, ms per step; then the row counts up to which the start-up
measurement (:func:`~accel_plugin.adapters.tgi.packed_linears.dense_rows`, with the
product the start-up takes: the native one where available) keeps ``F.linear``.
Threads: ``--threads`` (default 1, what ``benchmarks/tgi_speculative.py`` gives TGI).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

import torch

from accel_plugin.models.dirs import linear_shapes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=None, help="the target's config.json (default: SmolLM2's)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if importlib.util.find_spec("intel_extension_for_pytorch") is not None:
        import intel_extension_for_pytorch  # noqa: F401  (TGI's CPU process has it loaded)
    from accel_plugin.adapters.tgi import packed_linears
    from accel_plugin.kernels import cpu_linear
    from accel_plugin.speculative.llama import packed_linear

    torch.set_num_threads(args.threads)
    products: dict = {"oneDNN": packed_linear(torch.float32, torch.device("cpu")), "native": cpu_linear.ops()}
    if importlib.util.find_spec("vllm") is not None:  # vLLM's CPU product (onednn_mm), what its engines multiply by
        from vllm import _custom_ops as vllm_ops

        if getattr(vllm_ops, "_supports_onednn", False):
            products["vLLM onednn_mm"] = (lambda w: vllm_ops.create_onednn_mm(w.t(), 32),
                                          lambda x, handle, bias: vllm_ops.onednn_mm(handle, x, bias))
    if products["oneDNN"] is None and products["native"] is None:
        raise SystemExit("this torch has neither oneDNN's prepacked product nor the native few-row one "
                         f"({cpu_linear.reason()}): nothing to compare")
    if args.config is None:
        from accel_plugin.models import store as model_store
        folder = model_store.cached_path("smollm2")
        if folder is None:
            raise SystemExit("SmolLM2-135M-Instruct is not cached: run `accel models get smollm2`, or pass --config")
        args.config = folder / "config.json"
    if not args.config.is_file():
        raise SystemExit(f"--config {args.config}: no such file (a Llama config.json: hidden_size, intermediate_size, "
                         f"num_attention_heads, num_hidden_layers, vocab_size)")
    config = json.loads(args.config.read_text())
    missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                           "vocab_size") if k not in config]
    if missing:
        raise SystemExit(f"--config {args.config} lacks {', '.join(missing)} (a Llama config.json has them)")
    layer_shapes, head_shape = linear_shapes(config)
    gen = torch.Generator().manual_seed(0)
    groups = {}
    for name, shapes in (("layers", layer_shapes), ("head", [head_shape])):
        weights = [torch.randn(*shape, generator=gen) * 0.02 for shape in shapes]
        groups[name] = {product: [(w, ops[0](w)) for w in weights] for product, ops in products.items() if ops}
    print(f"torch {torch.__version__}, {args.threads} thread(s), {len(layer_shapes)} layer matrices and a "
          f"{head_shape[0]}x{head_shape[1]} head from {args.config}; ms per step, median of {args.repeats}"
          + "".join(f"; {p} product not available" for p, ops in products.items() if ops is None))
    columns = [f"{group} {p}" for group in groups for p in ("F.linear", *products)]
    print("\n| rows | " + " | ".join(columns) + " |\n|" + "---|" * (len(columns) + 1))

    def cell(pairs, rows, use_packed, linear):
        packed_linears.pass_ms(pairs, rows, use_packed, linear)  # warm-up
        return f"{statistics.median(packed_linears.pass_ms(pairs, rows, use_packed, linear) for _ in range(args.repeats)):.1f}"

    with torch.no_grad():
        for rows in args.rows:
            cells = []
            for by_product in groups.values():
                first = next(iter(by_product))
                cells.append(cell(by_product[first], rows, False, products[first][1]))
                cells += [cell(by_product[p], rows, True, ops[1]) if ops else "n/a" for p, ops in products.items()]
            print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)
        used = "native" if products["native"] else "oneDNN"
        picked = {name: packed_linears.dense_rows(by_product[used], products[used][1])
                  for name, by_product in groups.items()}
    print(f"\nthe start-up measurement ({used} product) keeps F.linear up to: {picked} rows "
          f"(of {packed_linears.PROBE_ROWS} measured)")


if __name__ == "__main__":
    main()
