"""Distil a draft model toward a target on one domain's prompts.

The target continues every training prompt greedily; the draft is trained to
predict those continuations (token-level KL against the target's top-k
probabilities, or NLL of its greedy tokens). A held-out part of the prompt file
measures greedy acceptance before and after. OUT becomes a Hugging Face model
directory (config.json, model.safetensors, tokenizer) to name as a ``draft:`` in
the draft YAML. Checkpoints go to OUT/checkpoints; running the same command again
resumes from the latest one (a larger --steps continues training).

Example:
    accel tune-draft --target models/target --draft models/draft-general \\
        --prompts support.jsonl --out drafts/support --steps 300
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from ..tuning import TuningError

__all__ = ["add_arguments", "main", "run"]


def _number(kind, low, high=None, *, low_open=False, what=""):
    """argparse type: a number in a range; the message names the valid values."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what or kind.__name__}; got {text!r}") from None
        too_low = value <= low if low_open else value < low
        if too_low or (high is not None and value > high):
            bound = f"> {low}" if low_open else f">= {low}"
            if high is not None:
                bound += f" and <= {high}"
            raise argparse.ArgumentTypeError(f"must be {bound}; got {text!r}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--target", required=True, metavar="DIR", help="target model directory (HF format)")
    parser.add_argument("--draft", required=True, metavar="DIR", help="draft model to start from (same tokenizer)")
    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="the domain's prompts: one per line, or JSONL with a 'prompt' key")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the tuned draft is written")
    parser.add_argument("--steps", type=_number(int, 1), default=200, help="optimiser steps in all (default 200)")
    parser.add_argument("--batch-size", type=_number(int, 1), default=8, help="prompts per step (default 8)")
    parser.add_argument("--lr", type=_number(float, 0.0, 1.0, low_open=True), default=1e-3,
                        help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--loss", choices=("kl", "nll"), default="kl",
                        help="kl: match the target's top-k probabilities; nll: its greedy tokens (default kl)")
    parser.add_argument("--gen-tokens", type=_number(int, 1, 1024), default=64,
                        help="target tokens generated per prompt (default 64)")
    parser.add_argument("--holdout", type=_number(float, 0.0, low_open=True, what="a fraction or a count"),
                        default=0.1, help="prompts held out for the acceptance report: a fraction < 1 or a count (default 0.1)")
    parser.add_argument("--k", type=_number(int, 1, 16), default=5,
                        help="tokens drafted per step in the acceptance report (default 5)")
    parser.add_argument("--checkpoint-every", type=_number(int, 1), default=50, help="steps between checkpoints (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split and the batches (default 0)")
    parser.add_argument("--threads", type=_number(int, 1), default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--save-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="dtype of the saved weights; auto = the draft's (default)")
    parser.add_argument("--no-resume", action="store_true", help="delete OUT/checkpoints and start over")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of text")


def _bar(total: int, desc: str, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step" if desc == "distil" else "prompt",
                file=sys.stderr, dynamic_ncols=True, leave=False, disable=None)


def _measure(draft, cache: list[tuple[list[int], list[int]]], k: int):
    from ..tuning.acceptance import match_flags, simulate

    return simulate([match_flags(draft, ids, cont) for ids, cont in cache], k)


def _check_paths(args) -> tuple[Path, Path, Path]:
    from ..tuning.models import check_model_dir, check_same_vocabulary

    target = check_model_dir(args.target, "--target", need_tokenizer=True)
    draft = check_model_dir(args.draft, "--draft")
    out = Path(args.out).expanduser()
    for flag, other in (("--target", target), ("--draft", draft)):
        if out.resolve() == other.resolve():
            raise TuningError(f"--out: {str(out)!r} is the {flag} directory; choose a new directory for the tuned draft")
    if out.exists() and not out.is_dir():
        raise TuningError(f"--out: {str(out)!r} exists and is not a directory")
    check_same_vocabulary(target, draft)
    return target, draft, out


def tune(args) -> dict:
    """The whole command; returns the report. Raises TuningError for bad input."""
    import torch

    from ..tuning.acceptance import greedy_continuation
    from ..tuning.distill import DistillSettings, build_dataset, distill
    from ..tuning.models import load_lm, load_tokenizer
    from ..tuning.prompts import read_prompts, split_holdout

    target_dir, draft_dir, out = _check_paths(args)
    prompts = read_prompts(args.prompts)
    train, held = split_holdout(prompts, args.holdout, args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    settings = DistillSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, loss=args.loss,
                               gen_tokens=args.gen_tokens, checkpoint_every=args.checkpoint_every, seed=args.seed,
                               holdout=args.holdout)
    key = settings.data_key(target_dir, draft_dir, [p.text for p in prompts])
    ckpt_dir = out / "checkpoints"
    if args.no_resume:
        shutil.rmtree(ckpt_dir, ignore_errors=True)

    tokenizer = load_tokenizer(target_dir)
    target, draft = load_lm(target_dir), load_lm(draft_dir)
    started = time.time()
    data_file = ckpt_dir / "dataset.pt"
    data = torch.load(data_file, weights_only=False) if data_file.is_file() else None
    if data is not None and data.get("key") != key:
        raise TuningError(
            f"--out: {ckpt_dir} holds checkpoints of a different run (other models, prompts or settings); "
            "pass --no-resume to start over, or choose another --out"
        )
    if data is None:
        bar = _bar(len(train) + len(held), "target continuations")
        items = build_dataset(target, tokenizer, [p.text for p in train], settings, progress=bar.update)
        held_cache = []
        for p in held:
            ids = tokenizer(p.text, add_special_tokens=False)["input_ids"][-settings.max_prompt_tokens:]
            if ids:
                held_cache.append((ids, greedy_continuation(target, ids, settings.gen_tokens)))
            bar.update(1)
        bar.close()
        data = {"key": key, "items": items, "held": held_cache}
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        torch.save(data, data_file)
    if not data["held"]:
        raise TuningError("--prompts: every held-out prompt is empty after tokenisation")
    before = _measure(draft, data["held"], args.k)

    bar = _bar(settings.steps, "distil")

    def progress(step: int, loss: float) -> None:
        if bar.n < step:
            bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    result = distill(draft, data["items"], settings, ckpt_dir, key, pad_id=tokenizer.pad_token_id or 0,
                     progress=progress)
    bar.close()
    after = _measure(draft, data["held"], args.k)

    save_dtype = args.save_dtype
    if save_dtype == "auto":
        draft_config = json.loads((draft_dir / "config.json").read_text())
        save_dtype = draft_config.get("dtype") or draft_config.get("torch_dtype") or "float32"
    out.mkdir(parents=True, exist_ok=True)
    draft.to(getattr(torch, save_dtype)).save_pretrained(str(out), safe_serialization=True)
    tok_source = draft_dir if (draft_dir / "tokenizer.json").exists() else target_dir
    for f in tok_source.iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    report = {
        "target": str(target_dir), "draft": str(draft_dir), "out": str(out), "prompts": str(args.prompts),
        "train_prompts": len(train), "held_out_prompts": len(data["held"]), "gen_tokens": settings.gen_tokens,
        "loss": settings.loss, "steps": result["steps"], "resumed_from_step": result["start_step"],
        "batch_size": settings.batch_size, "lr": settings.lr, "seed": settings.seed,
        "first_loss": result["first_loss"], "final_loss": result["final_loss"],
        "loss_curve": result["losses"][:: max(1, len(result["losses"]) // 20)] + result["losses"][-1:],
        "k": args.k, "before": before.to_dict(), "after": after.to_dict(),
        "alpha_gain": after.alpha - before.alpha, "seconds": round(time.time() - started, 1),
    }
    (out / "tune_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _fmt_positions(values) -> str:
    return " ".join("  -  " if v is None else f"{v:.2f}" for v in values)


def format_report(r: dict) -> str:
    b, a = r["before"], r["after"]
    resumed = f" (resumed at step {r['resumed_from_step']})" if r["resumed_from_step"] else ""
    lines = [
        f"prompts: {r['train_prompts']} for training, {r['held_out_prompts']} held out; "
        f"{r['gen_tokens']} target tokens each",
        f"distilled: {r['steps']} steps{resumed}, loss ({r['loss']}) {r['first_loss']} -> {r['final_loss']}",
        f"held-out greedy acceptance, k={r['k']}:",
        f"  {'':8} {'alpha':>6} {'mean acc. len':>14}   per position",
        f"  {'before':8} {b['alpha']:6.3f} {b['mean_acceptance_length']:14.2f}   {_fmt_positions(b['per_position'])}",
        f"  {'after':8} {a['alpha']:6.3f} {a['mean_acceptance_length']:14.2f}   {_fmt_positions(a['per_position'])}",
        f"  {'change':8} {r['alpha_gain']:+6.3f}",
        f"saved: {r['out']} (use it as a `draft:` in the draft YAML; report in tune_report.json)",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        report = tune(args)
    except TuningError as exc:
        print(f"accel tune-draft: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run as if ``accel tune-draft`` had been typed with ``argv``."""
    from . import run_command

    return run_command("tune-draft", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
