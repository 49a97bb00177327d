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
    parser.add_argument("--target", required=True, metavar="DIR", help="target model directory (HF format)")
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--draft", metavar="DIR", help="draft model to start from (same tokenizer)")
    start.add_argument("--from-target-layers", metavar="LAYERS", type=_layers,
                       help="start from these target layers instead, e.g. 0,1,2,3,29 or 0-3,29")
    parser.add_argument("--prompts", required=True, metavar="FILE",
                        help="the domain's prompts: one per line, or JSONL with a 'prompt' key")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the tuned draft is written")
    parser.add_argument("--train-layers", type=_number(int, 0), default=1,
                        help="with --from-target-layers: how many of the last layers are trained (default 1); "
                             "the others stay the target's")
    parser.add_argument("--head-vocab", type=_number(int, 1), default=None, metavar="N",
                        help="with --from-target-layers: prune the head to the N tokens the target uses most on the "
                             "training prompts (default: the whole vocabulary)")
    parser.add_argument("--chat", action="store_true",
                        help="wrap each prompt as a user message in the target tokenizer's chat template; the "
                             "target's continuations then end with its end-of-turn token, as served answers do")
    parser.add_argument("--held-out", metavar="FILE", default=None,
                        help="prompts for the acceptance report (same formats as --prompts) instead of a "
                             "--holdout share of --prompts; then every prompt of --prompts trains")
    parser.add_argument("--steps", type=_number(int, 0), default=200,
                        help="optimiser steps in all; 0 writes the starting draft untrained (default 200)")
    parser.add_argument("--batch-size", type=_number(int, 1), default=8, help="prompts per step (default 8)")
    parser.add_argument("--lr", type=_number(float, 0.0, 1.0, low_open=True), default=1e-3,
                        help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--loss", choices=("kl", "nll"), default="kl",
                        help="kl: match the target's top-k probabilities; nll: its greedy tokens (default kl)")
    parser.add_argument("--gen-tokens", type=_number(int, 1, 1024), default=64,
                        help="target tokens generated per prompt (default 64)")
    parser.add_argument("--gen-batch-size", type=_number(int, 1, 1024), default=64,
                        help="prompts the target continues at once while building the data (default 64: on a CPU "
                             "a decode step costs about its weight reads, so a large batch is nearly free)")
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
    draft = check_model_dir(args.draft, "--draft") if args.draft else None
    if draft is not None and (args.head_vocab is not None or args.train_layers != 1):
        raise TuningError("--head-vocab and --train-layers go with --from-target-layers; a --draft keeps its own layout")
    out = Path(args.out).expanduser()
    for flag, other in (("--target", target), ("--draft", draft)):
        if other is not None and out.resolve() == other.resolve():
            raise TuningError(f"--out: {str(out)!r} is the {flag} directory; choose a new directory for the tuned draft")
    if out.exists() and not out.is_dir():
        raise TuningError(f"--out: {str(out)!r} exists and is not a directory")
    if draft is not None:
        check_same_vocabulary(target, draft)
    return target, draft, out


def _encode(tokenizer, texts: list[str], chat: bool, max_tokens: int) -> list[list[int]]:
    """Token ids per prompt (the last ``max_tokens``), wrapped in the chat template with ``chat``."""
    out = []
    for text in texts:
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"][-max_tokens:])
    return out


def _draft_description(args, draft_dir: Path | None) -> Path | str:
    if draft_dir is not None:
        return draft_dir
    return (f"target-layers:{','.join(map(str, args.from_target_layers))}/train:{args.train_layers}"
            f"/head:{args.head_vocab}")


def tune(args) -> dict:
    """The whole command; returns the report. Raises TuningError for bad input."""
    import collections

    import torch

    from ..tuning.acceptance import greedy_continuations
    from ..tuning.distill import DistillSettings, build_dataset, distill
    from ..tuning.draft_lm import draft_from_target, head_vocab_from_counts, load_draft
    from ..tuning.models import load_lm, load_tokenizer
    from ..tuning.prompts import read_prompts, split_holdout

    target_dir, draft_dir, out = _check_paths(args)
    prompts = read_prompts(args.prompts)
    if args.held_out:
        train, held = prompts, read_prompts(args.held_out, flag="--held-out")
    else:
        train, held = split_holdout(prompts, args.holdout, args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    settings = DistillSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, loss=args.loss,
                               gen_tokens=args.gen_tokens, checkpoint_every=args.checkpoint_every, seed=args.seed,
                               holdout=args.holdout)
    prompt_key = ([p.text for p in train] + ["<held-out>"] + [p.text for p in held]
                  + (["<chat>"] if args.chat else []))
    key = settings.data_key(target_dir, _draft_description(args, draft_dir), prompt_key)
    dataset_key = settings.dataset_key(target_dir, prompt_key)
    ckpt_dir = out / "checkpoints"
    if args.no_resume:
        shutil.rmtree(ckpt_dir, ignore_errors=True)

    tokenizer = load_tokenizer(target_dir)
    target = load_lm(target_dir)
    started = time.time()
    data_file = ckpt_dir / "dataset.pt"
    data = torch.load(data_file, weights_only=True) if data_file.is_file() else None
    if data is not None and data.get("key") != dataset_key:
        raise TuningError(
            f"--out: {ckpt_dir} holds the target's answers to other prompts (or of another target or "
            "--gen-tokens); pass --no-resume to start over, or choose another --out"
        )
    if data is None:
        train_ids = _encode(tokenizer, [p.text for p in train], args.chat, settings.max_prompt_tokens)
        held_ids = [ids for ids in _encode(tokenizer, [p.text for p in held], args.chat, settings.max_prompt_tokens)
                    if ids]
        stop_ids = frozenset([tokenizer.eos_token_id]) if args.chat and tokenizer.eos_token_id is not None else frozenset()
        bar = _bar(len(train_ids) + len(held_ids), "target continuations")
        items = build_dataset(target, train_ids, settings, progress=bar.update, batch_size=args.gen_batch_size,
                              stop_ids=stop_ids)
        held_conts = greedy_continuations(target, held_ids, settings.gen_tokens, batch_size=args.gen_batch_size,
                                          stop_ids=stop_ids, progress=bar.update)
        bar.close()
        data = {"key": dataset_key, "items": items, "held": [list(pair) for pair in zip(held_ids, held_conts)]}
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        torch.save(data, data_file)
    if not data["held"]:
        raise TuningError("--prompts: every held-out prompt is empty after tokenisation")
    del target

    if draft_dir is not None:
        draft = load_draft(draft_dir, target_dir) if _borrows(draft_dir) else load_lm(draft_dir)
    else:
        head_vocab = None
        if args.head_vocab is not None:
            counts = collections.Counter(t for it in data["items"] for t in it["ids"][it["prompt_len"]:])
            vocab_size = int(json.loads((target_dir / "config.json").read_text())["vocab_size"])
            head_vocab = head_vocab_from_counts(counts, args.head_vocab, vocab_size)
        draft = draft_from_target(target_dir, args.from_target_layers, args.train_layers, head_vocab)
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
        source = json.loads(((draft_dir or target_dir) / "config.json").read_text())
        save_dtype = source.get("dtype") or source.get("torch_dtype") or "float32"
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(draft, "save"):
        draft.save(out, getattr(torch, save_dtype))
    else:
        draft.to(getattr(torch, save_dtype)).save_pretrained(str(out), safe_serialization=True)
    if draft_dir is not None:  # a draft that borrows from the target uses the target's tokenizer
        tok_source = draft_dir if (draft_dir / "tokenizer.json").exists() else target_dir
        for f in tok_source.iterdir():
            if f.is_file() and f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(f, out / f.name)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    report = {
        "target": str(target_dir), "draft": str(draft_dir) if draft_dir else _draft_description(args, None),
        "out": str(out), "prompts": str(args.prompts), "chat": bool(args.chat),
        "train_prompts": len(train), "held_out_prompts": len(data["held"]), "gen_tokens": settings.gen_tokens,
        "loss": settings.loss, "steps": result["steps"], "resumed_from_step": result["start_step"],
        "batch_size": settings.batch_size, "lr": settings.lr, "seed": settings.seed,
        "trained_parameters": trainable,
        "head_vocab": None if getattr(draft, "head_vocab", None) is None else len(draft.head_vocab),
        "first_loss": result["first_loss"], "final_loss": result["final_loss"],
        "loss_curve": result["losses"][:: max(1, len(result["losses"]) // 20)] + result["losses"][-1:],
        "k": args.k, "before": before.to_dict(), "after": after.to_dict(),
        "alpha_gain": after.alpha - before.alpha, "seconds": round(time.time() - started, 1),
    }
    (out / "tune_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _borrows(draft_dir: Path) -> bool:
    from ..speculative.draft_format import DRAFT_KEY

    return DRAFT_KEY in json.loads((draft_dir / "config.json").read_text())


def _fmt_positions(values) -> str:
    return " ".join("  -  " if v is None else f"{v:.2f}" for v in values)


def format_report(r: dict) -> str:
    b, a = r["before"], r["after"]
    resumed = f" (resumed at step {r['resumed_from_step']})" if r["resumed_from_step"] else ""
    lines = [
        f"prompts: {r['train_prompts']} for training, {r['held_out_prompts']} held out; "
        f"{r['gen_tokens']} target tokens each",
        f"distilled: {r['steps']} steps{resumed}, loss ({r['loss']}) {r['first_loss']} -> {r['final_loss']}"
        + (f"; {r['trained_parameters']:,} parameters trained" if r.get("trained_parameters") is not None else "")
        + (f"; head pruned to {r['head_vocab']} tokens" if r.get("head_vocab") else ""),
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
