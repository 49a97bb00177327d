"""Rebuild the demo model family from scratch: offline, seeded, CPU only.

    .venv/bin/python demo_models/build.py            # everything (about 20 minutes, 1 core)
    .venv/bin/python demo_models/build.py --only target --target-steps 50

Stages (each skipped when its output is complete, unless ``--force``):

1. ``tokenizer``: one byte-level BPE (2048 tokens) trained on the three domains;
2. ``target``: a Llama model (~11M parameters) trained on the mixture;
3. ``draft-general``: a Llama model (~0.95M parameters) trained on code and prose
   only (it never sees a support dialogue, as an off-the-shelf draft would not);
4. ``prompts``: held-out prompts per domain (``prompts/bench.jsonl``) and support
   prompts for tuning (``prompts/support-tune.jsonl``), plus ``drafts.yaml`` (the
   tuned draft for support) and ``drafts-untuned.yaml`` (the general draft for all);
5. ``draft-support``: ``accel tune-draft`` of the general draft toward the target
   on the support prompts;
6. ``cards``: a MODEL_CARD.md per model, from the logs the stages wrote.

Run it as a script (not ``python -m``): the repo root must not be on ``sys.path``,
or its ``kernels/`` folder would shadow the PyPI package of that name. The demo
never rebuilds; the outputs under ``demo_models/models/`` are committed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import demo_data

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
PROMPTS = HERE / "prompts"
DOMAINS = ("code", "prose", "support")
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")

#: name -> architecture (LlamaConfig fields); head_dim 64 for the accel kernels
ARCHS = {
    "target": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                   num_attention_heads=6, num_key_value_heads=2, head_dim=64),
    "draft-general": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, head_dim=64),
}
#: share of training windows per domain
MIXTURES = {
    "target": {"code": 1 / 3, "prose": 1 / 3, "support": 1 / 3},
    # a general draft that has never seen a support dialogue: what an off-the-shelf
    # small model is to a company's support traffic; tune-draft then teaches it
    "draft-general": {"code": 0.5, "prose": 0.5, "support": 0.0},
}
VOCAB_SIZE = 2048
SEQ_LEN = 128


def log(msg: str) -> None:
    print(f"[build {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------- corpus


def domain_documents(support_docs: int = 3000) -> dict[str, list[str]]:
    return {
        "code": demo_data.code_documents(),
        "prose": demo_data.prose_documents(),
        "support": demo_data.support_documents(support_docs, seed=1),
    }


def build_tokenizer(out: Path, docs: dict[str, list[str]]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    # the same amount of text from each domain, so no domain dominates the merges
    budget = 400_000
    sample = []
    for name in DOMAINS:
        taken = 0
        for d in docs[name]:
            sample.append(d)
            taken += len(d)
            if taken > budget:
                break
    tok.train_from_iterator(sample, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(out))
    return fast


def token_streams(tokenizer, docs: dict[str, list[str]]):
    """Per domain: one long int64 tensor, documents separated by ``</s>``."""
    import torch

    streams = {}
    for name in DOMAINS:
        ids: list[int] = []
        for d in docs[name]:
            ids.extend(tokenizer(d, add_special_tokens=False)["input_ids"])
            ids.append(tokenizer.eos_token_id)
        streams[name] = torch.tensor(ids, dtype=torch.long)
    return streams


# ------------------------------------------------------------------ training


def train_lm(name: str, tokenizer, streams, *, steps: int, batch_size: int, lr: float, seed: int,
             mixture: dict[str, float]) -> dict:
    """Next-token training on windows drawn from the domains with ``mixture`` weights; returns the log."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **ARCHS[name],
    )
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    rng = random.Random(seed)
    # the last 5% of each stream is held out for the evaluation loss
    split = {d: int(len(s) * 0.95) for d, s in streams.items()}

    def window(domain: str, lo: int, hi: int):
        start = rng.randrange(lo, hi - SEQ_LEN - 1)
        return streams[domain][start:start + SEQ_LEN]

    curve = []
    started = time.time()
    model.train()
    for step in range(steps):
        picked = rng.choices(DOMAINS, weights=[mixture[d] for d in DOMAINS], k=batch_size)
        batch = torch.stack([window(d, 0, split[d]) for d in picked])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == steps - 1:
            curve.append((step, round(loss.item(), 4)))
        if step % 50 == 0 or step == steps - 1:
            log(f"{name}: step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - started:.0f}s)")
    model.eval()
    eval_loss = {}
    with torch.no_grad():
        for d in DOMAINS:
            xs = torch.stack([window(d, split[d], len(streams[d])) for _ in range(16)])
            eval_loss[d] = round(model(input_ids=xs, labels=xs).loss.item(), 4)
    return {"model": model, "params": params, "curve": curve, "eval_loss": eval_loss,
            "seconds": round(time.time() - started), "steps": steps, "batch_size": batch_size,
            "seq_len": SEQ_LEN, "lr": lr, "seed": seed, "mixture": mixture}


def save_model(out: Path, model, tokenizer_dir: Path, info: dict) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    info = {k: v for k, v in info.items() if k != "model"}
    (out / "build_log.json").write_text(json.dumps(info, indent=1) + "\n")


# ------------------------------------------------------------------- prompts


DRAFTS_YAML = """\
# The demo's draft configuration (ACCEL_DRAFT_CONFIG): paths relative to this file.
num_speculative_tokens: 5
domains:
  support:
    draft: models/draft-support
    match:
      regex: ['(?m)^(Customer|Agent):']
  code:
    draft: models/draft-general
    match:
      regex: ['(?m)^\\s*(def|class|import|from|return) ']
default:
  draft: models/draft-general
controller:
  adaptive: true
"""


def write_prompts() -> None:
    bench = {
        "support": demo_data.support_prompts(24, seed=1001),
        "code": demo_data.code_prompts(24, seed=1002),
        "prose": demo_data.prose_prompts(24, seed=1003),
    }
    demo_data.write_prompts(PROMPTS / "bench.jsonl", bench)
    demo_data.write_prompts(PROMPTS / "support-tune.jsonl", {"support": demo_data.support_prompts(400, seed=2001)})
    (HERE / "drafts.yaml").write_text(DRAFTS_YAML)
    untuned = DRAFTS_YAML.replace("models/draft-support", "models/draft-general").replace(
        "# The demo's draft configuration", "# Before tuning: the general draft for every domain")
    (HERE / "drafts-untuned.yaml").write_text(untuned)


def relative_report_paths(report: Path) -> None:
    """The committed tune report names paths relative to demo_models/, not this machine's."""
    data = json.loads(report.read_text())
    for key in ("target", "draft", "out", "prompts"):
        data[key] = str(Path(data[key]).resolve().relative_to(HERE))
    report.write_text(json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("tokenizer", "target", "draft-general", "prompts", "draft-support", "cards"),
                        action="append", help="run only these stages (repeatable)")
    parser.add_argument("--force", action="store_true", help="rebuild stages whose output exists")
    parser.add_argument("--target-steps", type=int, default=450)
    parser.add_argument("--draft-steps", type=int, default=600)
    parser.add_argument("--tune-steps", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    stages = args.only or ["tokenizer", "target", "draft-general", "prompts", "draft-support", "cards"]
    tok_dir = HERE / "build" / "tokenizer"
    docs = None

    def need(path: Path) -> bool:
        return args.force or not (path / "model.safetensors").exists()

    if "tokenizer" in stages and (args.force or not (tok_dir / "tokenizer.json").exists()):
        docs = domain_documents()
        log("training the tokenizer")
        build_tokenizer(tok_dir, docs)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    streams = None
    for name, steps, bs, lr, seed in (("target", args.target_steps, 16, 3e-3, 0),
                                      ("draft-general", args.draft_steps, 16, 3e-3, 1)):
        if name in stages and need(MODELS / name):
            docs = docs or domain_documents()
            streams = streams or token_streams(tokenizer, docs)
            log(f"{name}: tokens per domain " + ", ".join(f"{d} {len(s)}" for d, s in streams.items()))
            info = train_lm(name, tokenizer, streams, steps=steps, batch_size=bs, lr=lr, seed=seed,
                            mixture=MIXTURES[name])
            info["tokens_per_domain"] = {d: len(s) for d, s in streams.items()}
            save_model(MODELS / name, info["model"], tok_dir, info)
            log(f"{name}: saved, eval loss {info['eval_loss']}")
    if "prompts" in stages:
        write_prompts()
        log("prompts and drafts.yaml written")
    if "draft-support" in stages and need(MODELS / "draft-support"):
        from accel_plugin.cli import tune_draft

        rc = tune_draft.main([
            "--target", str(MODELS / "target"), "--draft", str(MODELS / "draft-general"),
            "--prompts", str(PROMPTS / "support-tune.jsonl"), "--out", str(MODELS / "draft-support"),
            "--steps", str(args.tune_steps), "--batch-size", "16", "--threads", str(args.threads), "--save-dtype", "bfloat16",
        ])
        if rc:
            return rc
        shutil.rmtree(MODELS / "draft-support" / "checkpoints", ignore_errors=True)
        relative_report_paths(MODELS / "draft-support" / "tune_report.json")
    if "cards" in stages:
        import model_cards

        model_cards.write_all(MODELS, HERE / "build")
        log("model cards written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
