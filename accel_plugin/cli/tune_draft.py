"""Distil a draft model toward a target on one domain's prompts.

The target continues every training prompt greedily; the draft is trained to
predict those continuations (token-level KL against the target's top-k
probabilities, or NLL of its greedy tokens). A held-out part of the prompt file
measures greedy acceptance before and after. OUT becomes a Hugging Face model
directory (config.json, model.safetensors, tokenizer) to name as a ``draft:`` in
the draft YAML. Checkpoints go to OUT/checkpoints; running the same command again
resumes from the latest one (a larger --steps continues training).

A draft may also be cut from the target itself (``--from-target-layers``):
target layers kept as they are (borrowed from the target when the draft is
loaded, so not stored), the last ``--train-layers`` of them copied and trained,
the target's embedding shared, and the head pruned to the ``--head-vocab`` tokens
the target uses most on the training prompts. Such a draft stores only what was
trained (a few MB) and names its target in config.json.

Examples:
    accel tune-draft --target models/target --draft models/draft-general \\
        --prompts support.jsonl --out drafts/support --steps 300
    accel tune-draft --target smollm2/hf --from-target-layers 0,1,2,3,29 --train-layers 1 \\
        --head-vocab 4096 --chat --prompts support-tune.jsonl --out drafts/support --steps 300
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from ..tuning import TuningError
from ..tuning.settings import TuneSettings
from .common import number_arg

__all__ = ["add_arguments", "main", "run", "settings_from_args"]


def _layers(text: str) -> list[int]:
    """argparse type: ``0,1,2`` or ``0-3,29`` -> [0, 1, 2, 3, 29]."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer indices like 0,1,2 or 0-3,29; got {text!r}") from None
    if not out or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected distinct layer indices like 0,1,2 or 0-3,29; got {text!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    ranges, choices = TuneSettings.RANGES, TuneSettings.CHOICES
    # the defaults are TuneSettings' (declared once there); help shows them with %(default)s
    default = {f.name: f.default for f in fields(TuneSettings)}
    parser.add_argument("--target", required=True, metavar="DIR", help="target model directory (HF format)")
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--draft", metavar="DIR", help="draft model to start from (same tokenizer)")
    start.add_argument("--from-target-layers", metavar="LAYERS", type=_layers,
                       help="start from these target layers instead, e.g. 0,1,2,3,29 or 0-3,29")
    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="the domain's prompts: one per line, or JSONL with a 'prompt' key")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the tuned draft is written")
    parser.add_argument("--train-layers", type=number_arg(ranges["train_layers"]), default=default["train_layers"],
                        help="with --from-target-layers: how many of the last layers are trained (default %(default)s); "
                             "the others stay the target's")
    parser.add_argument("--head-vocab", type=number_arg(ranges["head_vocab"]), default=default["head_vocab"], metavar="N",
                        help="with --from-target-layers: prune the head to the N tokens the target uses most on the "
                             "training prompts (default: the whole vocabulary)")
    parser.add_argument("--chat", action="store_true",
                        help="wrap each prompt as a user message in the target tokenizer's chat template; the "
                             "target's continuations then end with its end-of-turn token, as served answers do")
    parser.add_argument("--held-out", metavar="FILE", default=default["held_out"],
                        help="prompts for the acceptance report (same formats as --prompts) instead of a "
                             "--holdout share of --prompts; then every prompt of --prompts trains")
    parser.add_argument("--steps", type=number_arg(ranges["steps"]), default=default["steps"],
                        help="optimiser steps in all; 0 writes the starting draft untrained (default %(default)s)")
    parser.add_argument("--batch-size", type=number_arg(ranges["batch_size"]), default=default["batch_size"],
                        help="prompts per step (default %(default)s)")
    parser.add_argument("--lr", type=number_arg(ranges["lr"]), default=default["lr"],
                        help="AdamW learning rate (default %(default)s)")
    parser.add_argument("--lr-schedule", choices=choices["lr_schedule"], default=default["lr_schedule"],
                        help="constant: the learning rate after a 10-step warm-up; cosine: then decayed to a tenth "
                             "of it by --steps (a resumed run with a larger --steps follows the new curve) "
                             "(default %(default)s)")
    parser.add_argument("--loss", choices=choices["loss"], default=default["loss"],
                        help="kl: match the target's top-k probabilities; nll: its greedy tokens (default %(default)s)")
    parser.add_argument("--gen-tokens", type=number_arg(ranges["gen_tokens"]), default=default["gen_tokens"],
                        help="target tokens generated per prompt (default %(default)s)")
    parser.add_argument("--gen-batch-size", type=number_arg(ranges["gen_batch_size"]), default=default["gen_batch_size"],
                        help="prompts the target continues at once while building the data (default %(default)s: on a CPU "
                             "a decode step costs about its weight reads, so a large batch is nearly free)")
    parser.add_argument("--holdout", type=number_arg(ranges["holdout"], what="a fraction or a count"),
                        default=default["holdout"], help="prompts held out for the acceptance report: a fraction < 1 or a count (default %(default)s)")
    parser.add_argument("--k", type=number_arg(ranges["k"]), default=default["k"],
                        help="tokens drafted per step in the acceptance report (default %(default)s)")
    parser.add_argument("--checkpoint-every", type=number_arg(ranges["checkpoint_every"]), default=default["checkpoint_every"],
                        help="steps between checkpoints (default %(default)s)")
    parser.add_argument("--seed", type=number_arg(ranges["seed"]), default=default["seed"], help="seed of the held-out split and the batches (default %(default)s)")
    parser.add_argument("--threads", type=number_arg(ranges["threads"]), default=default["threads"],
                        help="torch CPU threads (default: torch's)")
    parser.add_argument("--save-dtype", choices=choices["save_dtype"], default=default["save_dtype"],
                        help="dtype of the saved weights; auto = the draft's (default)")
    parser.add_argument("--no-resume", action="store_true", help="delete OUT/checkpoints and start over")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of text")


def settings_from_args(args: argparse.Namespace) -> TuneSettings:
    """The parsed flags as :class:`TuneSettings` (``--no-resume`` -> ``resume=False``)."""
    return TuneSettings(
        target=args.target, prompts=args.prompts, out=args.out, draft=args.draft,
        from_target_layers=args.from_target_layers, train_layers=args.train_layers, head_vocab=args.head_vocab,
        chat=args.chat, held_out=args.held_out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        lr_schedule=args.lr_schedule,
        loss=args.loss, gen_tokens=args.gen_tokens, gen_batch_size=args.gen_batch_size, holdout=args.holdout,
        k=args.k, checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads,
        save_dtype=args.save_dtype, resume=not args.no_resume,
    )


def run(args: argparse.Namespace) -> int:
    from ..tuning.tune import format_report, tune

    try:
        report = tune(settings_from_args(args))
    except TuningError as exc:
        print(f"accel tune-draft: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run as if ``accel tune-draft`` had been typed with ``argv``."""
    from .common import run_command

    return run_command("tune-draft", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
