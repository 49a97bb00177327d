"""MODEL_CARD.md for each demo model, from the logs the build stages left in the model dirs."""

from __future__ import annotations

import json
from pathlib import Path

import demo_data

ROLES = {
    "target": "the target model: the one vLLM serves; drafts are checked against it",
    "draft-general": "the general draft: a small model trained on the code and prose domains only; it has "
                     "never seen a support dialogue, as an off-the-shelf draft would not have seen a "
                     "company's support traffic",
    "draft-support": "the support-tuned draft: draft-general distilled toward the target on support prompts "
                     "with `accel tune-draft`",
}

DATA = f"""\
Three domains, offline and deterministic (see `demo_models/demo_data.py`):

- **code**: the source of {len(demo_data.CODE_MODULES)} standard-library modules (a fixed, sorted list in
  `demo_data.CODE_MODULES`) of the Python that ran the build (version below);
- **prose**: English text of the Python reference documentation shipped with CPython as
  `pydoc_data/topics.py` (technical prose; every 10th topic held out for prompts);
- **support**: customer-support dialogues from a seeded template generator (8 intents with
  slots: names, products, order numbers, dates, carriers, prices). Generated text, built to
  be predictable: the agent's reply follows from the customer's message.

One byte-level BPE tokenizer (2048 tokens, trained on equal parts of the three domains) is
shared by all models. Training windows of 128 tokens are drawn from the domains with the
shares given under Training."""


def _arch(config: dict) -> str:
    return (f"LlamaForCausalLM, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
            f"{config['num_attention_heads']} heads ({config['num_key_value_heads']} KV heads) of "
            f"{config.get('head_dim') or config['hidden_size'] // config['num_attention_heads']}, "
            f"MLP {config['intermediate_size']}, vocab {config['vocab_size']}")


def _params(config: dict) -> tuple[int, int]:
    """(all parameters, parameters used per token excluding the embedding lookup)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    attn = h * d * (2 * config["num_attention_heads"] + 2 * config["num_key_value_heads"])
    per_layer = attn + 3 * h * i + 2 * h
    body = config["num_hidden_layers"] * per_layer + h
    return body + 2 * v * h, body + v * h


def card(name: str, model_dir: Path) -> str:
    config = json.loads((model_dir / "config.json").read_text())
    total, per_token = _params(config)
    size = (model_dir / "model.safetensors").stat().st_size
    lines = [
        f"# {name}",
        "",
        f"Role: {ROLES.get(name, name)}.",
        "",
        "Part of the accel-plugin demo model family: a toy, only good for showing speculative",
        "decoding. It writes plausible-looking text in three narrow domains, and is briefly",
        "trained on purpose (the whole family builds in about 20 minutes on one CPU core).",
        "",
        "| | |",
        "| --- | --- |",
        f"| architecture | {_arch(config)} |",
        f"| parameters | {total / 1e6:.2f}M ({per_token / 1e6:.2f}M per token, without the embedding lookup) |",
        f"| weights | model.safetensors, {config.get('dtype') or config.get('torch_dtype')}, {size / 1e6:.1f} MB |",
        f"| built with | Python {demo_data.python_version()}, torch, transformers; CPU, seeded |",
        "",
        "## Data",
        "",
        DATA,
        "",
        "## Training",
        "",
    ]
    log_file, report_file = model_dir / "build_log.json", model_dir / "tune_report.json"
    if log_file.is_file():
        log = json.loads(log_file.read_text())
        curve = log["curve"]
        lines += [
            f"Next-token loss, AdamW (lr {log['lr']}, warm-up then cosine to 10%), {log['steps']} steps of "
            f"{log['batch_size']} x {log['seq_len']} tokens ({log['steps'] * log['batch_size'] * log['seq_len']:,} "
            f"tokens), seed {log['seed']}, {log['seconds']} s on one CPU thread.",
            "",
            "Share of training windows per domain: " + ", ".join(f"{d} {w:.0%}" for d, w in log["mixture"].items()) + ".",
            "",
            f"Tokens per domain in the corpus: " + ", ".join(f"{d} {n:,}" for d, n in log["tokens_per_domain"].items())
            + " (the last 5% of each held out).",
            "",
            f"Training loss: {curve[0][1]:.3f} at step {curve[0][0] + 1}, {curve[-1][1]:.3f} at step {curve[-1][0] + 1}.",
            "Held-out loss per domain: " + ", ".join(f"{d} {v:.3f}" for d, v in log["eval_loss"].items()) + ".",
            "",
            "The training loss is of single batches (noisy: the domains differ a lot in difficulty). The "
            "held-out code loss is above the training loss because the held-out part is the end of the "
            "module list, other modules than those trained on.",
            "",
            "Loss curve (step: loss): " + ", ".join(f"{s + 1}: {v:.2f}" for s, v in curve[:: max(1, len(curve) // 8)]) + ".",
        ]
    if report_file.is_file():
        r = json.loads(report_file.read_text())
        b, a = r["before"], r["after"]
        lines += [
            "Starts from draft-general (see its card for its pre-training), then:",
            "",
            "`accel tune-draft --target models/target --draft models/draft-general "
            f"--prompts prompts/support-tune.jsonl --steps {r['steps']}` ({r['loss']} loss on target-generated "
            f"continuations of {r['gen_tokens']} tokens, {r['train_prompts']} training prompts, batch "
            f"{r['batch_size']}, lr {r['lr']}, seed {r['seed']}, {r['seconds']} s).",
            "",
            f"Distillation loss: {r['first_loss']:.3f} at step 1, {r['final_loss']:.3f} at step {r['steps']}.",
            "",
            f"Greedy acceptance on {r['held_out_prompts']} held-out support prompts, k={r['k']}: "
            f"alpha {b['alpha']:.3f} before (draft-general), {a['alpha']:.3f} after "
            f"({r['alpha_gain']:+.3f}); mean acceptance length {b['mean_acceptance_length']:.2f} -> "
            f"{a['mean_acceptance_length']:.2f}.",
        ]
    lines += [
        "",
        "## Rebuild",
        "",
        "```",
        ".venv/bin/python demo_models/build.py --force   # about 20-25 minutes on one CPU core",
        "```",
        "",
        "Seeded and offline; the same Python version (stdlib sources) and library versions give",
        "the same data, and very nearly the same weights (CPU float arithmetic may differ across",
        "machines). The demo never rebuilds.",
        "",
    ]
    return "\n".join(lines)


def write_all(models: Path, build_dir: Path) -> None:
    for model_dir in sorted(p for p in models.iterdir() if (p / "config.json").is_file()):
        (model_dir / "MODEL_CARD.md").write_text(card(model_dir.name, model_dir))
