"""Benchmark: a draft that reads the target's last hidden state (EAGLE's kind) against a shipped draft.

    .venv/bin/python -m benchmarks.hidden_state_draft --dataset OUT/checkpoints/dataset.pt
    .venv/bin/python -m benchmarks.hidden_state_draft --dataset ... --layers 28,29 --steps 1500

Would a draft that sees what the target computed accept far more often than one cut
from the target's first layers? The question decides whether such a draft is worth
building into the proposer (docs/speculative.md: support at batch 8 needs a first-token
acceptance near 0.75; the shipped support draft reads about 0.5). This trains one
offline and measures it on the same held-out answers as the shipped draft; nothing is
served.

The data is an ``accel tune-draft`` run's ``checkpoints/dataset.pt`` (the target's
greedy answers to the training prompts with its top-k probabilities, and the held-out
prompts with their answers), so both drafts learn from and are measured on the same
tokens. The head (EAGLE-1's shape, Li et al. 2024): at position ``j`` it takes the
token ``x_j``'s embedding and the target's last hidden state at ``j - 1`` (the one that
chose ``x_j``), ``fc`` of both, then ``--layers`` decoder layers initialised from those
target layers, the target's final norm, and the shipped draft's (pruned) head; its
logits at ``j`` predict ``x_{j+1}``, as the target's do. Trained on the continuation
positions with the ``kl`` loss of ``accel tune-draft`` plus EAGLE's smooth-L1 loss of its
output against the target's hidden state at ``j`` (what it feeds itself for a second
draft token). Learning rate: ``accel tune-draft``'s warm-up and cosine.

Measured on the held-out answers, greedy, exactly as ``accel tune-draft`` measures a
draft (:mod:`accel_plugin.tuning.acceptance`): teacher-forced, whether the draft's argmax
after each prefix of the answer is the target's next token; replayed as speculative
rounds of ``k`` = 1 and 2 (acceptance per position, tokens per target step). The head's
first draft token sees the target's real hidden state; its second sees its own output
in place of the target's (computed exactly, one extra position per first token
accepted). Printed beside them: how sure the target is of its own answers (its
probability of its greedy token, from the dataset's top-k), the ceiling a draft learned
from its distributions meets where the target itself nearly ties.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from accel_plugin.cli.common import int_list_arg

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TARGET = Path("~/.cache/accel-plugin/models/smollm2/hf").expanduser()
DEFAULT_DRAFT = ROOT / "demo_models" / "smollm2" / "drafts" / "support"


#: An argparse type: the target layers the head's layers start from (``29``, ``28,29``).
layer_list = int_list_arg("target layers", 0, 1023, "28,29")


def load_dataset(path: Path) -> tuple[list[dict], list[tuple[list[int], list[int]]]]:
    """The training items and held-out (prompt, answer) pairs of a tune-draft dataset."""
    import torch

    if not path.is_file():
        raise SystemExit(f"--dataset: {path} is not a file; give the checkpoints/dataset.pt of an "
                         "`accel tune-draft --out DIR` run (DIR/checkpoints/dataset.pt)")
    data = torch.load(path, weights_only=False)
    if not isinstance(data, dict) or not {"items", "held"} <= set(data) or not data["held"]:
        raise SystemExit(f"--dataset: {path} is no tune-draft dataset (expected keys 'items' and 'held', "
                         "held-out prompts included)")
    return data["items"], [(list(p), list(c)) for p, c in data["held"]]


def target_features(target, seqs: list[list[int]], batch: int = 16) -> list:
    """The target's last hidden state (after its final norm) at every position, float16."""
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(seqs), batch):
            group = seqs[start:start + batch]
            width = max(map(len, group))
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.long)
            for r, seq in enumerate(group):
                ids[r, :len(seq)] = torch.tensor(seq)
                mask[r, :len(seq)] = 1
            hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
            out += [hidden[r, :len(seq)].to(torch.float16).clone() for r, seq in enumerate(group)]
    return out


def shifted(features):
    """Per position j the feature of j - 1 (zeros at 0): what the head reads beside x_j."""
    import torch

    return torch.cat([torch.zeros(1, features.shape[1]), features[:-1].float()], 0)


def hidden_state_head(target, layers: list[int], head_vocab):
    """The head as a torch module: ``forward(ids, previous_features, mask)`` -> (its hidden state, logits)."""
    import copy

    import torch
    import torch.nn.functional as F
    from transformers import LlamaModel

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    embed = target.model.embed_tokens.weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()  # the embedding again where they are tied
    head_weight = lm_head.index_select(0, head_vocab) if head_vocab is not None else lm_head
    source = target.state_dict()

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            size = config.hidden_size
            self.fc = torch.nn.Linear(2 * size, size, bias=False)
            self.body = LlamaModel(config)
            self.body.embed_tokens = None  # it reads the target's, frozen
            for n, layer in enumerate(layers):
                prefix = f"model.layers.{layer}."
                self.body.layers[n].load_state_dict({k.removeprefix(prefix): v.clone() for k, v in source.items()
                                                     if k.startswith(prefix)})
            self.body.norm.load_state_dict({"weight": target.model.norm.weight.detach().clone()})
            with torch.no_grad():  # starts as the mean of the token's embedding and the feature
                eye = torch.eye(size)
                self.fc.weight.copy_(torch.cat([eye, eye], 1) * 0.5 + 0.01 * torch.randn_like(self.fc.weight))

        def forward(self, ids, previous, mask=None):
            x = self.fc(torch.cat([F.embedding(ids, embed), previous], -1))
            hidden = self.body(inputs_embeds=x, attention_mask=mask).last_hidden_state
            return hidden, F.linear(hidden, head_weight)

    return Head()


def train(head, items: list[dict], features: list, *, steps: int, lr: float, seed: int, head_vocab,
          vocab_size: int, reg_weight: float = 1.0, batch_size: int = 8, progress=None) -> list[float]:
    """Train ``head`` in place; returns the loss every 100 steps."""
    import random

    import torch
    import torch.nn.functional as F

    from accel_plugin.tuning.distill import kl_loss, lr_factor, training_batch
    from accel_plugin.tuning.settings import TrainingSettings

    settings = TrainingSettings(steps=steps, lr=lr, lr_schedule="cosine")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, settings))
    index = None
    if head_vocab is not None:
        index = torch.full((vocab_size,), -1, dtype=torch.long)  # token id -> its row of the pruned head
        index[head_vocab] = torch.arange(len(head_vocab))
    torch.manual_seed(seed)
    curve = []
    head.train()
    for step in range(steps):
        rng = random.Random(seed * 1_000_003 + step)
        picked = [rng.randrange(len(items)) for _ in range(batch_size)]
        ids, mask, rows, cols, _, top_i, top_p = training_batch([items[i] for i in picked], pad_id=0)
        previous = torch.zeros(*ids.shape, features[0].shape[1])
        wanted = torch.zeros_like(previous)
        for r, i in enumerate(picked):
            n = len(items[i]["ids"])
            previous[r, :n], wanted[r, :n] = shifted(features[i]), features[i].float()
        hidden, logits = head(ids, previous, mask)
        loss = kl_loss(logits[rows, cols], index[top_i] if index is not None else top_i, top_p)
        loss = loss + reg_weight * F.smooth_l1_loss(hidden[mask.bool()], wanted[mask.bool()])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            curve.append(round(loss.item(), 4))
            if progress:
                progress(step + 1, curve[-1])
    head.eval()
    return curve


def head_flags(head, held, features, head_vocab) -> tuple[list[list[bool]], list[list[bool]]]:
    """Per held-out answer token i: the head's first draft is right (teacher-forced), and
    (where it is) its second draft, fed its own hidden state, is right too."""
    import torch

    firsts, seconds = [], []
    with torch.inference_mode():
        for (prompt, answer), feats in zip(held, features):
            seq = prompt + answer
            hidden, logits = head(torch.tensor([seq]), shifted(feats)[None])
            predicted = logits[0].argmax(-1)
            if head_vocab is not None:
                predicted = head_vocab[predicted]
            first, second = [], []
            for i in range(len(answer)):
                j = len(prompt) - 1 + i  # the logits at j predict seq[j + 1] = answer[i]
                ok = int(predicted[j]) == seq[j + 1]
                ok2 = False
                if ok and j + 2 < len(seq):
                    previous = shifted(feats[:j + 2])[None].clone()
                    previous[0, j + 1] = hidden[0, j]  # its own output where the target's is not known yet
                    _, logits2 = head(torch.tensor([seq[:j + 2]]), previous)
                    token = logits2[0, -1].argmax()
                    ok2 = int(head_vocab[token] if head_vocab is not None else token) == seq[j + 2]
                first.append(ok)
                second.append(ok2)
            firsts.append(first)
            seconds.append(second)
    return firsts, seconds


def two_position_rounds(firsts, seconds, k: int) -> dict:
    """Greedy rounds of ``k`` (1 or 2) drafts on per-token flags, as
    :func:`accel_plugin.tuning.acceptance.simulate` replays them, the second draft's
    flag given by ``seconds`` (the head's own feature in place of the target's)."""
    if k not in (1, 2):
        raise ValueError(f"k must be 1 or 2; got {k}")
    accepted, tested, rounds, tokens = [0] * k, [0] * k, 0, 0
    for first, second in zip(firsts, seconds):
        n, j = len(first), 0
        while j < n:
            m = 0
            if j < n - 1:
                tested[0] += 1
                if first[j]:
                    accepted[0], m = accepted[0] + 1, 1
                    if k == 2 and j + 1 < n - 1:
                        tested[1] += 1
                        if second[j]:
                            accepted[1], m = accepted[1] + 1, 2
            rounds, tokens, j = rounds + 1, tokens + m + 1, j + m + 1
    return {"per_position": [round(a / t, 3) if t else None for a, t in zip(accepted, tested)],
            "tokens_per_step": round(tokens / rounds, 3) if rounds else None}


def target_confidence(items: list[dict]) -> dict:
    """How sure the target is of its own greedy answers: its top-1 probability (renormalised
    over the top-k kept) at every answer position, mean and shares above 0.5 and 0.9."""
    import torch

    top = torch.cat([it["top_prob"][:, 0].float() for it in items])
    return {"mean": round(top.mean().item(), 3), "above_0.5": round((top > 0.5).float().mean().item(), 3),
            "above_0.9": round((top > 0.9).float().mean().item(), 3)}


def _stats_dict(stats) -> dict:
    pairs = zip(stats.accepted_per_pos, stats.tested_per_pos)
    return {"per_position": [round(a / t, 3) if t else None for a, t in pairs],
            "tokens_per_step": round(stats.tokens / stats.rounds, 3) if stats.rounds else None}


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, required=True,
                        help="an `accel tune-draft` run's checkpoints/dataset.pt")
    parser.add_argument("--target", type=Path, default=DEFAULT_TARGET, help="the target's model folder")
    parser.add_argument("--draft", type=Path, default=DEFAULT_DRAFT,
                        help="the draft to compare with; its pruned head is the head's too")
    parser.add_argument("--layers", type=layer_list, default=(29,), help="target layers the head's layers start from")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.threads < 1 or not args.lr > 0:
        parser.error(f"--steps and --threads must be >= 1 and --lr > 0; got {args.steps}, {args.threads}, {args.lr}")

    import torch

    from accel_plugin.tuning.acceptance import match_flags, simulate
    from accel_plugin.tuning.errors import TuningError
    from accel_plugin.tuning.loaders import check_model_dir, load_draft_model, load_lm

    torch.set_num_threads(args.threads)
    items, held = load_dataset(args.dataset)
    try:
        target_dir = check_model_dir(args.target, "--target")
        draft_dir = check_model_dir(args.draft, "--draft")
        draft = load_draft_model(draft_dir, target_dir)
    except TuningError as exc:
        raise SystemExit(str(exc)) from None
    target = load_lm(target_dir)
    if max(args.layers) >= target.config.num_hidden_layers:
        raise SystemExit(f"--layers: the target has layers 0-{target.config.num_hidden_layers - 1}; "
                         f"got {','.join(map(str, args.layers))}")
    head_vocab = getattr(draft, "head_vocab", None)
    t0 = time.perf_counter()
    train_features = target_features(target, [it["ids"] for it in items])
    held_features = target_features(target, [p + c for p, c in held])
    print(f"target hidden states of {len(items)} + {len(held)} sequences: {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    torch.manual_seed(args.seed)  # the head's fc starts from a seeded draw
    head = hidden_state_head(target, args.layers, head_vocab)
    trained = sum(p.numel() for p in head.parameters() if p.requires_grad)
    t0 = time.perf_counter()
    curve = train(head, items, train_features, steps=args.steps, lr=args.lr, seed=args.seed, head_vocab=head_vocab,
                  vocab_size=target.config.vocab_size,
                  progress=lambda s, loss: print(f"step {s}/{args.steps} loss {loss}", file=sys.stderr))
    print(f"trained {trained / 1e6:.2f} M parameters, {args.steps} steps: {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)

    firsts, seconds = head_flags(head, held, held_features, head_vocab)
    shipped = [match_flags(draft, p, c) for p, c in held]
    draft_layers = getattr(draft, "hf", draft).config.num_hidden_layers
    rows = {
        f"shipped draft ({args.draft.name}, {draft_layers} layers)": {
            "teacher_forced": round(sum(map(sum, shipped)) / sum(map(len, shipped)), 3),
            "k1": _stats_dict(simulate(shipped, 1)), "k2": _stats_dict(simulate(shipped, 2))},
        f"hidden-state head (target layers {','.join(map(str, args.layers))}, {trained / 1e6:.2f} M trained)": {
            "teacher_forced": round(sum(map(sum, firsts)) / sum(map(len, firsts)), 3),
            "k1": two_position_rounds(firsts, seconds, 1), "k2": two_position_rounds(firsts, seconds, 2)},
    }
    confidence = target_confidence(items)
    print(f"{len(held)} held-out answers ({sum(map(len, firsts))} tokens) of {args.dataset}; "
          f"{len(items)} training answers, {args.steps} steps")
    print(f"the target's probability of its own greedy token over the training answers (of its top "
          f"{items[0]['top_prob'].shape[1]}): mean {confidence['mean']:.3f}; above 0.5 at "
          f"{confidence['above_0.5']:.0%} of them, above 0.9 at {confidence['above_0.9']:.0%}")
    print(f"{'draft':<58} {'all tokens':>10} {'k=1 pos 1':>9} {'k=2 pos 1, 2':>13} {'tok/step k=1, k=2':>18}")
    for name, r in rows.items():
        k1, k2 = r["k1"], r["k2"]
        print(f"{name:<58} {_num(r['teacher_forced']):>10} {_num(k1['per_position'][0]):>9} "
              f"{_num(k2['per_position'][0]):>6} {_num(k2['per_position'][1]):>6} "
              f"{_num(k1['tokens_per_step']):>9} {_num(k2['tokens_per_step']):>8}")
    if args.json:
        args.json.write_text(json.dumps({"dataset": str(args.dataset), "layers": list(args.layers),
                                         "steps": args.steps,
                                         "loss_curve": curve, "target_confidence": confidence,
                                         "drafts": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
