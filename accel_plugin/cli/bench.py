"""Benchmarks. ``accel bench acceptance``: how well each domain's draft predicts the target.

For every domain of the draft YAML (prompts routed as the proposer routes them):
greedy acceptance per position and overall, mean acceptance length, the cost ratio
c = draft step / target step, the k that maximises the expected speedup
S = (1 - a^(k+1)) / ((1 - a)(k c + 1)), the break-even acceptance at that k, and
the expected and simulated speedup. "Simulated" replays the speculative rounds
with measured step times; the end-to-end number in a real server comes from
`accel demo`.

Step times: both models run the draft engine's lean forward (1 token, KV cache,
batch 1). A serving framework's target step is slower than that (scheduling,
sampling); pass --target-step-ms with the step time measured there to get its c.

Example:
    accel bench acceptance --config drafts.yaml --target models/target \\
        --prompts prompts.jsonl --plot speedup.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..tuning import TuningError
from .tune_draft import _number

__all__ = ["add_arguments", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    acc = sub.add_parser("acceptance", help="acceptance, cost ratio and speedup per domain of a draft YAML",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    acc.add_argument("--config", required=True, metavar="YAML", help="the draft YAML (ACCEL_DRAFT_CONFIG format)")
    acc.add_argument("--target", required=True, metavar="DIR", help="the target model directory (HF format)")
    acc.add_argument("--prompts", required=True, metavar="FILE", help="prompts: one per line, or JSONL with 'prompt' (+ 'domain')")
    acc.add_argument("--gen-tokens", type=_number(int, 1, 1024), default=64, help="target tokens per prompt (default 64)")
    acc.add_argument("--chat", action="store_true",
                     help="wrap each prompt as a user message in the target tokenizer's chat template")
    acc.add_argument("--max-prompts", type=_number(int, 1), default=None, help="at most this many prompts per domain")
    acc.add_argument("--k-max", type=_number(int, 1, 16), default=None,
                     help="largest k tried (default: the YAML's num_speculative_tokens per domain)")
    acc.add_argument("--target-step-ms", type=_number(float, 0.0, low_open=True), default=None,
                     help="target step time in ms measured elsewhere (e.g. in vLLM); default: measured here")
    acc.add_argument("--threads", type=_number(int, 1), default=None, help="torch CPU threads (default: torch's)")
    acc.add_argument("--plot", metavar="PNG", default=None, help="write speedup vs k per domain to this PNG")
    acc.add_argument("--json", action="store_true", help="print JSON instead of the table")
    acc.set_defaults(_bench=_acceptance)


def _fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def format_table(report: dict) -> str:
    rows = report["domains"]
    lines = [
        f"target step {report['target_step_ms']:.2f} ms ({report['target_step_source']}); "
        f"{report['gen_tokens']} target tokens per prompt; greedy",
        "",
    ]
    head = ("domain", "draft", "prompts", "alpha", "mean acc.len", "c", "best k", "break-even", "expected S", "simulated S")
    table = [head]
    for r in rows:
        draft = Path(r["draft"]).name if r["draft"] else "(none)"
        if "curve" not in r:
            table.append((r["domain"], draft, str(r["prompts"]), "-", "-", "-", "0", "-", "1.00x", "1.00x"))
            continue
        table.append((
            r["domain"], draft, str(r["prompts"]), f"{r['alpha']:.3f}", f"{r['mean_acceptance_length']:.2f}",
            f"{r['c']:.3f}", str(r["best_k"]), f"{r['break_even_alpha']:.3f}",
            f"{r['expected_speedup']:.2f}x", f"{r['simulated_speedup']:.2f}x",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    lines.append("")
    lines.append("acceptance per position (k = k_max; position p counted when positions < p were accepted):")
    for r in rows:
        if "curve" in r:
            lines.append(f"  {r['domain']:<12} " + " ".join(_fmt(v) for v in r["per_position"])
                         + f"   draft step {r['draft_step_ms']:.3f} ms")
    lines.append("")
    lines.append("expected speedup by k (simulated in brackets):")
    for r in rows:
        if "curve" in r:
            lines.append(f"  {r['domain']:<12} " + "  ".join(
                f"k={p['k']}: {p['expected_speedup']:.2f} ({p['simulated_speedup']:.2f})" for p in r["curve"]))
    return "\n".join(lines)


def _acceptance(args) -> dict:
    from ..config import DraftConfigError, load_draft_config
    from ..tuning.bench import bench_acceptance, plot_speedup
    from ..tuning.models import check_model_dir
    from ..tuning.prompts import read_prompts

    if not Path(args.config).is_file():
        raise TuningError(f"--config: draft YAML {args.config!r} does not exist")
    try:
        config = load_draft_config(args.config)
    except DraftConfigError as exc:
        raise TuningError(f"--config: {exc}") from None
    target = check_model_dir(args.target, "--target", need_tokenizer=True)
    prompts = read_prompts(args.prompts)
    if args.plot and not args.plot.lower().endswith(".png"):
        raise TuningError(f"--plot: expected a .png file name; got {args.plot!r}")
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise TuningError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    report = bench_acceptance(config, target, prompts, gen_tokens=args.gen_tokens, max_prompts=args.max_prompts,
                              chat=args.chat,
                              target_step_ms=args.target_step_ms, k_max=args.k_max)
    if args.plot:
        report["plot"] = str(plot_speedup(report, args.plot))
    return report


def run(args: argparse.Namespace) -> int:
    try:
        report = args._bench(args)
    except TuningError as exc:
        print(f"accel bench {args.bench}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_table(report))
        if report.get("plot"):
            print(f"\nplot: {report['plot']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run as if ``accel bench`` had been typed with ``argv``."""
    from . import run_command

    return run_command("bench", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
