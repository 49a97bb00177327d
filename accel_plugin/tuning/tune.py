"""Distil a draft model toward a target on one domain's prompts: the whole of ``accel tune-draft``.

:func:`tune` takes a :class:`~accel_plugin.tuning.settings.TuneSettings`: it checks
the directories, has the target continue the prompts (cached in OUT/checkpoints,
reused on resume), builds or loads the starting draft, measures its greedy
acceptance on the held-out prompts, distils it (:mod:`.distill`), measures again,
and saves OUT as a model directory with ``tune_report.json``. :func:`format_report`
renders that report as text.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from .errors import TuningError
from .settings import TuneSettings

__all__ = ["format_report", "tune"]


def _bar(total: int, desc: str, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step" if desc == "distil" else "prompt",
                file=sys.stderr, dynamic_ncols=True, leave=False, disable=None)


def _measure(draft, cache: list[tuple[list[int], list[int]]], k: int):
    from .acceptance import match_flags, simulate

    return simulate([match_flags(draft, ids, cont) for ids, cont in cache], k)


def _check_paths(settings: TuneSettings) -> tuple[Path, Path, Path]:
    from .loaders import check_model_dir, check_same_vocabulary

    target = check_model_dir(settings.target, "--target", need_tokenizer=True)
    draft = check_model_dir(settings.draft, "--draft") if settings.draft else None
    if draft is not None and (settings.head_vocab is not None or settings.train_layers != 1):
        raise TuningError("--head-vocab and --train-layers go with --from-target-layers; a --draft keeps its own layout")
    out = Path(settings.out).expanduser()
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


def _draft_description(settings: TuneSettings, draft_dir: Path | None) -> Path | str:
    if draft_dir is not None:
        return draft_dir
    return (f"target-layers:{','.join(map(str, settings.from_target_layers))}/train:{settings.train_layers}"
            f"/head:{settings.head_vocab}")


def tune(settings: TuneSettings) -> dict:
    """Distil, measure, save; returns the report (also written to OUT/tune_report.json).
    Raises :class:`TuningError`, naming the flag, for bad input."""
    import collections

    import torch

    from .acceptance import greedy_continuations
    from .distill import DistillSettings, build_dataset, distill
    from .draft_lm import draft_from_target, head_vocab_from_counts
    from .loaders import load_draft_model, load_lm, load_tokenizer
    from .prompts import read_prompts, split_holdout

    target_dir, draft_dir, out = _check_paths(settings)
    prompts = read_prompts(settings.prompts)
    if settings.held_out:
        train, held = prompts, read_prompts(settings.held_out, flag="--held-out")
    else:
        train, held = split_holdout(prompts, settings.holdout, settings.seed)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    distill_settings = DistillSettings(**settings.training_settings())
    prompt_key = ([p.text for p in train] + ["<held-out>"] + [p.text for p in held]
                  + (["<chat>"] if settings.chat else []))
    key = distill_settings.data_key(target_dir, _draft_description(settings, draft_dir), prompt_key)
    dataset_key = distill_settings.dataset_key(target_dir, prompt_key)
    ckpt_dir = out / "checkpoints"
    if not settings.resume:
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
        max_tokens, chat = distill_settings.max_prompt_tokens, settings.chat
        train_ids = _encode(tokenizer, [p.text for p in train], chat, max_tokens)
        held_ids = [ids for ids in _encode(tokenizer, [p.text for p in held], chat, max_tokens) if ids]
        stop_ids = frozenset([tokenizer.eos_token_id]) if chat and tokenizer.eos_token_id is not None else frozenset()
        bar = _bar(len(train_ids) + len(held_ids), "target continuations")
        items = build_dataset(target, train_ids, distill_settings, progress=bar.update,
                              batch_size=settings.gen_batch_size, stop_ids=stop_ids)
        held_conts = greedy_continuations(target, held_ids, distill_settings.gen_tokens,
                                          batch_size=settings.gen_batch_size, stop_ids=stop_ids, progress=bar.update)
        bar.close()
        data = {"key": dataset_key, "items": items, "held": [list(pair) for pair in zip(held_ids, held_conts)]}
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        torch.save(data, data_file)
    if not data["held"]:
        raise TuningError("--prompts: every held-out prompt is empty after tokenisation")
    del target

    if draft_dir is not None:
        draft = load_draft_model(draft_dir, target_dir)
    else:
        head_vocab = None
        if settings.head_vocab is not None:
            counts = collections.Counter(t for it in data["items"] for t in it["ids"][it["prompt_len"]:])
            vocab_size = int(json.loads((target_dir / "config.json").read_text())["vocab_size"])
            head_vocab = head_vocab_from_counts(counts, settings.head_vocab, vocab_size)
        draft = draft_from_target(target_dir, list(settings.from_target_layers), settings.train_layers, head_vocab)
    before = _measure(draft, data["held"], settings.k)

    bar = _bar(distill_settings.steps, "distil")

    def progress(step: int, loss: float) -> None:
        if bar.n < step:
            bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    result = distill(draft, data["items"], distill_settings, ckpt_dir, key, pad_id=tokenizer.pad_token_id or 0,
                     progress=progress)
    bar.close()
    after = _measure(draft, data["held"], settings.k)

    save_dtype = settings.save_dtype
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
        "target": str(target_dir), "draft": str(draft_dir) if draft_dir else _draft_description(settings, None),
        "out": str(out), "prompts": str(settings.prompts), "chat": bool(settings.chat),
        "train_prompts": len(train), "held_out_prompts": len(data["held"]),
        "gen_tokens": distill_settings.gen_tokens,
        "loss": distill_settings.loss, "steps": result["steps"], "resumed_from_step": result["start_step"],
        "batch_size": distill_settings.batch_size, "lr": distill_settings.lr,
        "lr_schedule": distill_settings.lr_schedule, "seed": distill_settings.seed,
        "trained_parameters": trainable,
        "head_vocab": None if getattr(draft, "head_vocab", None) is None else len(draft.head_vocab),
        "first_loss": result["first_loss"], "final_loss": result["final_loss"],
        "loss_curve": result["losses"][:: max(1, len(result["losses"]) // 20)] + result["losses"][-1:],
        "k": settings.k, "before": before.to_dict(), "after": after.to_dict(),
        "alpha_gain": after.alpha - before.alpha, "seconds": round(time.time() - started, 1),
    }
    (out / "tune_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _fmt_positions(values) -> str:
    return " ".join("  -  " if v is None else f"{v:.2f}" for v in values)


def format_report(r: dict) -> str:
    """The report of :func:`tune` as text: the data, the distillation, acceptance before and after."""
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
