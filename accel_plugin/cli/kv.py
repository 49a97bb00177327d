"""KV-cache fragmentation. ``accel kv simulate``: replay a request trace against KV-cache allocators.

Allocators: contiguous (one chunk of max_model_len per request, first-fit),
contiguous-oracle (a chunk of exactly the length the request reaches), paged at
each --block-sizes, and paged at block 16 with prefix sharing (full blocks of a
shared prefix held once). For each: internal, reserved and external waste as % of
the slots held, slot-step weighted over the replay, and how many requests ran at
once while others waited for memory (mean, peak, ratio to contiguous).

Trace: --trace FILE.jsonl, one request per line, {"arrival": STEP, "prompt_len": N,
"output_len": N} plus optional "prefix_id" + "prefix_len" and "max_output_len"; or
a seeded synthetic ShareGPT-like trace (--requests, --seed, --arrival-rate).
A step adds one token to every running request. Definitions: docs/observability.md.

Example:
    accel kv simulate --requests 1000 --seed 0 --plot kv.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from ..ranges import Range
from .common import number_arg, output_file_arg

if TYPE_CHECKING:
    from ..observability.kv_simulator import SimResult
    from ..observability.kv_trace import Request

__all__ = ["RANGES", "add_arguments", "format_table", "main", "plot", "report", "run", "trace_summary"]

#: valid values of the numeric flags of ``accel kv simulate``
RANGES: dict[str, Range] = {
    "requests": Range(int, 1, 100_000),
    "seed": Range(int, 0),
    "arrival_rate": Range(float, 0.0, 10_000.0, low_open=True),
    "max_model_len": Range(int, 2, 1 << 20),
    "cache_tokens": Range(int, 2, 1 << 31),
    "block_size": Range(int, 1, 1 << 16),
}
DEFAULTS = {"requests": 1000, "seed": 0, "arrival_rate": 1.0}
#: = ``accel_plugin.observability.kv_simulator.DEFAULT_BLOCK_SIZES``, not imported here: ``accel --help`` stays light
DEFAULT_BLOCK_SIZES = (1, 8, 16, 32, 64, 256)


def _block_sizes(text: str) -> tuple[int, ...]:
    valid = RANGES["block_size"]
    hint = f"comma-separated integers {valid}, e.g. 1,8,16,32,64,256"
    sizes = []
    for part in text.split(","):
        try:
            size = int(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {hint}; got {text!r}") from None
        if size not in valid:
            raise argparse.ArgumentTypeError(f"each must be {valid} ({hint}); got {size}")
        if size not in sizes:
            sizes.append(size)
    return tuple(sizes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="kv", metavar="ACTION", required=True)
    sim = sub.add_parser("simulate", help="waste and concurrency of contiguous vs paged allocation on a trace",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sim.add_argument("--trace", metavar="FILE.jsonl", default=None, help="the request trace (default: synthetic)")
    sim.add_argument("--requests", type=number_arg(RANGES["requests"]), default=None,
                     help=f"synthetic trace: number of requests (default {DEFAULTS['requests']})")
    sim.add_argument("--seed", type=number_arg(RANGES["seed"]), default=None,
                     help=f"synthetic trace: random seed (default {DEFAULTS['seed']})")
    sim.add_argument("--arrival-rate", type=number_arg(RANGES["arrival_rate"]), default=None,
                     help=f"synthetic trace: requests arriving per step, Poisson (default {DEFAULTS['arrival_rate']})")
    sim.add_argument("--block-sizes", type=_block_sizes, default=DEFAULT_BLOCK_SIZES, metavar="N,N,...",
                     help="paged block sizes to compare (default " + ",".join(map(str, DEFAULT_BLOCK_SIZES)) + ")")
    sim.add_argument("--max-model-len", type=number_arg(RANGES["max_model_len"]), default=2048,
                     help="longest sequence; what contiguous allocation reserves per request (default 2048)")
    sim.add_argument("--cache-tokens", type=number_arg(RANGES["cache_tokens"]), default=None,
                     help="KV-cache size in token slots (default 16 x --max-model-len)")
    sim.add_argument("--no-prefix-sharing", dest="prefix_sharing", action="store_false",
                     help="leave out the 'paged b=16 +prefix' row")
    sim.add_argument("--plot", metavar="PNG", type=output_file_arg(".png"), default=None,
                     help="write waste and concurrency per allocator to this PNG")
    sim.add_argument("--json", action="store_true", help="print JSON instead of the table")
    sim.set_defaults(_kv=_simulate)


def _simulate(args: argparse.Namespace) -> tuple[dict, list]:
    from ..observability.kv_simulator import compare_allocators
    from ..observability.kv_trace import load_trace, synthetic_trace

    cache_tokens = args.cache_tokens or 16 * args.max_model_len
    if args.trace:
        given = [f for f in ("requests", "seed", "arrival_rate") if getattr(args, f) is not None]
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise ValueError(f"{flags}: only for the synthetic trace, not with --trace")
        requests = load_trace(args.trace, args.max_model_len)
        summary = trace_summary(requests, args.trace)
    else:
        settings = {f: DEFAULTS[f] if getattr(args, f) is None else getattr(args, f) for f in DEFAULTS}
        requests = synthetic_trace(settings["requests"], settings["seed"], args.max_model_len, settings["arrival_rate"])
        summary = {**trace_summary(requests, "synthetic", settings["seed"]), "arrival_rate": settings["arrival_rate"]}
    results = compare_allocators(requests, cache_tokens=cache_tokens, max_model_len=args.max_model_len,
                                 block_sizes=args.block_sizes, prefix_sharing=args.prefix_sharing)
    out = report(results, summary, cache_tokens=cache_tokens, max_model_len=args.max_model_len)
    if args.plot:
        out["plot"] = str(plot(results, args.plot))
    return out, results


def trace_summary(requests: Sequence[Request], source: str, seed: int | None = None) -> dict:
    """What the trace was: size, seed, length medians, shared prefixes, arrival span."""
    prefixed = [r for r in requests if r.prefix_id is not None]
    return {
        "source": source, "requests": len(requests), "seed": seed,
        "prompt_len_median": statistics.median(r.prompt_len for r in requests),
        "output_len_median": statistics.median(r.output_len for r in requests),
        "prompt_len_mean": round(statistics.fmean(r.prompt_len for r in requests), 1),
        "output_len_mean": round(statistics.fmean(r.output_len for r in requests), 1),
        "shared_prefix_requests": len(prefixed),
        "prefix_ids": len({r.prefix_id for r in prefixed}),
        "last_arrival": max(r.arrival for r in requests),
    }


PARTS = ("internal", "reserved", "external", "waste")


def report(results: Sequence[SimResult], summary: dict, *, cache_tokens: int, max_model_len: int) -> dict:
    """The JSON report of ``accel kv simulate``: the trace and one row per allocator."""
    base = next((r.mean_concurrent for r in results if r.allocator == "contiguous"), None)
    rows = []
    for r in results:
        rows.append({
            "allocator": r.allocator, "block_size": r.block_size, "prefix_sharing": r.prefix_sharing,
            "capacity_tokens": r.capacity,
            **{f"{part}_pct": round(r.totals.percent(part), 2) for part in PARTS},
            "mean_concurrent": None if r.mean_concurrent is None else round(r.mean_concurrent, 2),
            "peak_concurrent": r.peak_concurrent,
            "ratio_vs_contiguous": round(r.mean_concurrent / base, 2) if base and r.mean_concurrent else None,
            "steps": r.steps, "preemptions": r.preemptions, "slot_steps": asdict(r.totals),
        })
    return {
        "trace": summary, "cache_tokens": cache_tokens, "max_model_len": max_model_len,
        "average": "slot-step weighted: sum over steps of each component / sum over steps of held "
                   "(allocated + external); mean_concurrent over the steps at which requests waited",
        "rows": rows,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(report: dict) -> str:
    """The aligned table of ``accel kv simulate`` with the trace line above it."""
    t = report["trace"]
    source = t["source"]
    if source == "synthetic":
        source = f"synthetic (seed {t['seed']}, {t.get('arrival_rate')} arrivals/step)"
    lines = [
        (f"trace: {source}: {t['requests']} requests, "
         f"prompt_len median {t['prompt_len_median']:g} (mean {t['prompt_len_mean']:g}), "
         f"output_len median {t['output_len_median']:g} (mean {t['output_len_mean']:g}), "
         f"{t['shared_prefix_requests']} share one of {t['prefix_ids']} prefixes, "
         f"last arrival at step {t['last_arrival']}"),
        (f"cache: {report['cache_tokens']} token slots, max_model_len {report['max_model_len']}; "
         "waste in % of held slots (allocated + external), slot-step weighted; "
         "concurrent = running requests while others waited"),
        "",
    ]
    header = ("allocator", "internal %", "reserved %", "external %", "waste %",
              "mean concurrent", "peak", "x contiguous", "steps", "preempted")
    rows = [(r["allocator"], _fmt(r["internal_pct"], ".1f"), _fmt(r["reserved_pct"], ".1f"),
             _fmt(r["external_pct"], ".1f"), _fmt(r["waste_pct"], ".1f"), _fmt(r["mean_concurrent"], ".1f"),
             str(r["peak_concurrent"]), _fmt(r["ratio_vs_contiguous"], ".2f"), str(r["steps"]), str(r["preemptions"]))
            for r in report["rows"]]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if all(r["mean_concurrent"] is None for r in report["rows"]):
        lines.append("\nno request ever waited for memory: raise --requests or --arrival-rate, or lower --cache-tokens")
    return "\n".join(lines)


def plot(results: Sequence[SimResult], path: str):
    """PNG: stacked waste per allocator (left); running requests per step (right)."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=110, gridspec_kw={"width_ratios": [1, 1.3]})
    names = [r.allocator for r in results]
    bottom = [0.0] * len(results)
    for part, color in (("internal", "C0"), ("reserved", "C1"), ("external", "C3")):
        values = [r.totals.percent(part) for r in results]
        left.barh(names, values, left=bottom, color=color, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    for y, total in enumerate(bottom):
        left.text(total + 1, y, f"{total:.1f}%", va="center", fontsize=8)
    left.set_xlim(0, 110)
    left.invert_yaxis()
    left.set_xlabel("waste, % of held KV slots (slot-step weighted)")
    left.legend(fontsize=8, loc="lower right")
    left.grid(axis="x", alpha=0.3)
    window = max(1, max(r.steps for r in results) // 200)  # a mean per window: readable, same area
    for i, r in enumerate(results):
        starts = range(0, len(r.concurrency), window)
        means = [sum(r.concurrency[s:s + window]) / len(r.concurrency[s:s + window]) for s in starts]
        right.plot(starts, means, color=f"C{i % 10}", linewidth=1, label=r.allocator)
    right.set_xlabel("step")
    right.set_ylabel(f"running requests (mean of {window} steps)")
    right.set_title("requests in the cache at once", fontsize=10)
    right.grid(alpha=0.3)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    from .common import report

    # ValueError: TraceError, SimulationError, a bad --plot
    return report(f"kv {args.kv}", lambda: args._kv(args)[0], format_table, args.json)


def main(argv: list[str] | None = None) -> int:
    """Run as if ``accel kv`` had been typed with ``argv``."""
    from .common import run_command

    return run_command("kv", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
