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
import sys

from ..tuning import TuningError
from ..tuning.settings import BenchSettings
from .common import number_arg, output_file_arg

__all__ = ["add_arguments", "main", "run", "settings_from_args"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    acc = sub.add_parser("acceptance", help="acceptance, cost ratio and speedup per domain of a draft YAML",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ranges = BenchSettings.RANGES
    acc.add_argument("--config", required=True, metavar="YAML", help="the draft YAML (ACCEL_DRAFT_CONFIG format)")
    acc.add_argument("--target", required=True, metavar="DIR", help="the target model directory (HF format)")
    acc.add_argument("--prompts", required=True, metavar="FILE", help="prompts: one per line, or JSONL with 'prompt' (+ 'domain')")
    acc.add_argument("--gen-tokens", type=number_arg(ranges["gen_tokens"]), default=64,
                     help="target tokens per prompt (default 64)")
    acc.add_argument("--chat", action="store_true",
                     help="wrap each prompt as a user message in the target tokenizer's chat template")
    acc.add_argument("--max-prompts", type=number_arg(ranges["max_prompts"]), default=None,
                     help="at most this many prompts per domain")
    acc.add_argument("--k-max", type=number_arg(ranges["k_max"]), default=None,
                     help="largest k tried (default: the YAML's num_speculative_tokens per domain)")
    acc.add_argument("--target-step-ms", type=number_arg(ranges["target_step_ms"]), default=None,
                     help="target step time in ms measured elsewhere (e.g. in vLLM); default: measured here")
    acc.add_argument("--threads", type=number_arg(ranges["threads"]), default=None,
                     help="torch CPU threads (default: torch's)")
    acc.add_argument("--plot", metavar="PNG", type=output_file_arg(".png"), default=None, help="write speedup vs k per domain to this PNG")
    acc.add_argument("--json", action="store_true", help="print JSON instead of the table")
    acc.set_defaults(_bench=_acceptance)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """The parsed flags of ``accel bench acceptance`` as :class:`BenchSettings`."""
    return BenchSettings(
        config=args.config, target=args.target, prompts=args.prompts, gen_tokens=args.gen_tokens, chat=args.chat,
        max_prompts=args.max_prompts, k_max=args.k_max, target_step_ms=args.target_step_ms, threads=args.threads,
        plot=args.plot,
    )


def _acceptance(args: argparse.Namespace) -> dict:
    from ..tuning.bench import run_acceptance

    return run_acceptance(settings_from_args(args))


def run(args: argparse.Namespace) -> int:
    from ..tuning.bench import format_table
    from .common import report

    return report(f"bench {args.bench}", lambda: args._bench(args), format_table, args.json, TuningError)


def main(argv: list[str] | None = None) -> int:
    """Run as if ``accel bench`` had been typed with ``argv``."""
    from .common import run_command

    return run_command("bench", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
