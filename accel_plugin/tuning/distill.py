"""Distil a draft toward a target on one domain's prompts (DistillSpec-style).

Data: for each training prompt the target's greedy continuation of
``gen_tokens`` tokens, and the target's top-``top_k`` next-token probabilities at
every continuation position (one teacher-forced target forward); both computed in
batches of ``batch_size`` prompts. Computed once, stored in
``checkpoints/dataset.pt``, reused on resume.

Loss on continuation positions only (prompt tokens are context):

- ``kl``: cross-entropy of the draft against the target's top-k probabilities,
  renormalised (forward KL(target || draft) up to the target's entropy, a
  constant); the draft learns the target's ranking, not just its argmax;
- ``nll``: cross-entropy against the target's greedy tokens.

A draft with a pruned head (``draft.head_vocab``) is trained over its own tokens:
the target's probabilities are restricted to them and renormalised; greedy tokens
outside them do not count.

Training: AdamW, a 10-step warm-up then a constant learning rate (``lr_schedule``
``constant``) or one decayed along a cosine to a tenth of it at ``steps``
(``cosine``), gradient norm clipped at 1.0. Batches are drawn with a generator
seeded by ``(seed, step)``, so a run resumed from a checkpoint does exactly what an
uninterrupted run would (with ``cosine``, one of the same ``steps``).
Checkpoints (``step-000100.pt``: draft weights, optimiser state, the step) go to
``checkpoints/`` every ``checkpoint_every`` steps and at the end.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .acceptance import greedy_continuations
from .errors import TuningError
from .settings import TrainingSettings

__all__ = ["DistillSettings", "build_dataset", "distill", "kl_loss", "latest_checkpoint", "lr_factor", "training_batch"]

WARMUP_STEPS = 10
#: ``cosine``: the learning rate at the last step, as a share of ``lr``
COSINE_FLOOR = 0.1


def lr_factor(step: int, settings: TrainingSettings) -> float:
    """The share of ``settings.lr`` at optimiser step ``step`` (0-based): the warm-up,
    then 1 (``constant``) or a cosine from 1 down to :data:`COSINE_FLOOR` at ``steps``."""
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    if settings.lr_schedule == "constant" or step < WARMUP_STEPS:
        return warm
    done = min(1.0, (step - WARMUP_STEPS) / max(1, settings.steps - 1 - WARMUP_STEPS))
    return COSINE_FLOOR + (1.0 - COSINE_FLOOR) * 0.5 * (1.0 + math.cos(math.pi * done))


@dataclass(frozen=True)
class DistillSettings(TrainingSettings):
    """What a distillation run does: :class:`TrainingSettings` (``accel tune-draft``'s
    training flags) and how the target's answers are taken."""

    #: the target's probabilities kept per position (the ``kl`` loss)
    top_k: int = 32
    #: prompts are cut to their last this many tokens
    max_prompt_tokens: int = 256

    def data_key(self, target: Path, draft: Path | str, prompts: list[str]) -> str:
        """Fingerprint of everything a training run depends on (not ``steps``); checkpoints
        carry it. ``draft`` is the starting draft's directory or how it is made."""
        draft = str(draft.resolve()) if isinstance(draft, Path) else draft
        blob = json.dumps({
            "dataset": self.dataset_key(target, prompts), "draft": draft,
            **{k: v for k, v in asdict(self).items() if k not in ("steps", "checkpoint_every")},
        }, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def dataset_key(self, target: Path, prompts: list[str]) -> str:
        """Fingerprint of what the target's answers depend on: the target, the prompts
        and how they are continued (not the draft, not the training settings)."""
        blob = json.dumps({
            "target": str(target.resolve()), "prompts": prompts, "top_k": self.top_k,
            "gen_tokens": self.gen_tokens, "max_prompt_tokens": self.max_prompt_tokens,
        }, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def build_dataset(target, prompts_ids: list[list[int]], settings: DistillSettings,
                  progress: Callable[[int], None] | None = None, batch_size: int = 16,
                  stop_ids: frozenset[int] = frozenset()) -> list[dict]:
    """Per prompt (token ids): ids (prompt + target continuation, which ends after a
    token of ``stop_ids``), prompt length, top-k targets."""
    import torch

    prompts_ids = [ids[-settings.max_prompt_tokens:] for ids in prompts_ids if ids]
    if not prompts_ids:
        raise TuningError("--prompts: every training prompt is empty after tokenisation")
    conts = greedy_continuations(target, prompts_ids, settings.gen_tokens, batch_size=batch_size, stop_ids=stop_ids)
    items = []
    forward_batch = min(batch_size, 16)  # full-vocabulary logits of every position: keep the batch modest
    for start in range(0, len(prompts_ids), forward_batch):
        group = list(zip(prompts_ids[start:start + forward_batch], conts[start:start + forward_batch]))
        width = max(len(ids) + len(cont) for ids, cont in group)
        full = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for r, (ids, cont) in enumerate(group):
            full[r, :len(ids) + len(cont)] = torch.tensor(ids + cont)
            mask[r, :len(ids) + len(cont)] = 1
        with torch.inference_mode():
            logits = target(input_ids=full, attention_mask=mask).logits
        for r, (ids, cont) in enumerate(group):
            rows = logits[r, len(ids) - 1:len(ids) - 1 + len(cont)].float()
            probs, index = rows.softmax(-1).topk(settings.top_k, dim=-1)
            items.append({
                "ids": ids + cont, "prompt_len": len(ids),
                "top_index": index.to(torch.int32),
                "top_prob": (probs / probs.sum(-1, keepdim=True)).to(torch.float16),
            })
        if progress:
            progress(len(group))
    return items


def training_batch(items: list[dict], pad_id: int):
    """Right-padded ids, attention mask, and per continuation position: the row,
    the position whose logits predict it, the greedy token and the top-k targets."""
    import torch

    width = max(len(it["ids"]) for it in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    rows, cols, tokens, top_i, top_p = [], [], [], [], []
    for r, it in enumerate(items):
        n, p = len(it["ids"]), it["prompt_len"]
        ids[r, :n] = torch.tensor(it["ids"])
        mask[r, :n] = 1
        rows += [r] * (n - p)
        cols += list(range(p - 1, n - 1))
        tokens += it["ids"][p:]
        top_i.append(it["top_index"].long())
        top_p.append(it["top_prob"].float())
    return (ids, mask, torch.tensor(rows), torch.tensor(cols), torch.tensor(tokens),
            torch.cat(top_i), torch.cat(top_p))


def kl_loss(logits, top_i, top_p):
    """The ``kl`` loss: cross-entropy of ``logits`` (positions x head tokens) against the
    target's top-k probabilities ``top_p`` of head rows ``top_i`` (-1: a token the head
    lacks, left out and the rest renormalised; a position with none of them left out)."""
    import torch.nn.functional as F

    present = top_i >= 0
    weights = top_p * present
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-9)
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, top_i.clamp(min=0))
    return -(weights * logp).sum(-1)[present.any(-1)].mean()


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step-*.pt"))
    return found[-1] if found else None


def distill(draft, dataset: list[dict], settings: DistillSettings, ckpt_dir: Path, data_key: str,
            pad_id: int, progress: Callable[[int, float], None] | None = None) -> dict:
    """Train ``draft`` in place up to ``settings.steps``, resuming from ``ckpt_dir``.

    Returns ``{"start_step", "steps", "first_loss", "final_loss", "losses"}``.
    ``progress(step, loss)`` is called after every step.
    """
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=settings.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, settings))
    start, losses = 0, []
    last = latest_checkpoint(ckpt_dir)
    if last is not None:
        state = torch.load(last, map_location="cpu", weights_only=True)
        if state["data_key"] != data_key:
            raise TuningError(
                f"--out: {ckpt_dir} holds checkpoints of a different run (other models, prompts or settings); "
                "pass --no-resume to start over, or choose another --out"
            )
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, losses = state["step"], state["losses"]
    if start >= settings.steps:
        return {"start_step": start, "steps": start, "losses": losses,
                "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None}

    def save(step: int) -> None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = ckpt_dir / f"step-{step:06d}.pt"
        torch.save({"step": step, "data_key": data_key, "draft": draft.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "losses": losses}, path)
        for old in ckpt_dir.glob("step-*.pt"):
            if old != path:
                old.unlink()

    head_index = None
    if getattr(draft, "head_vocab", None) is not None:
        vocab_size = max(int(draft.head_vocab.max()) + 1, max(max(it["ids"]) for it in dataset) + 1,
                         max(int(it["top_index"].max()) for it in dataset) + 1)
        head_index = torch.full((vocab_size,), -1, dtype=torch.long)
        head_index[draft.head_vocab] = torch.arange(len(draft.head_vocab))
    draft.train()
    for step in range(start, settings.steps):
        rng = random.Random(settings.seed * 1_000_003 + step)
        picked = [dataset[rng.randrange(len(dataset))] for _ in range(settings.batch_size)]
        ids, mask, rows, cols, tokens, top_i, top_p = training_batch(picked, pad_id)
        logits = draft(input_ids=ids, attention_mask=mask).logits[rows, cols]
        if head_index is not None:  # a pruned head: target token ids -> its rows (-1: not in it)
            top_i, tokens = head_index[top_i], head_index[tokens]
        if settings.loss == "kl":
            loss = kl_loss(logits, top_i, top_p)
        else:
            keep = tokens >= 0
            loss = F.cross_entropy(logits[keep].float(), tokens[keep])
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in draft.parameters() if p.requires_grad], 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 5))
        if progress:
            progress(step + 1, losses[-1])
        if (step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps:
            save(step + 1)
    draft.eval()
    return {"start_step": start, "steps": settings.steps, "losses": losses,
            "first_loss": losses[0], "final_loss": losses[-1]}
