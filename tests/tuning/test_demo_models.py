"""The committed demo model family: loadable, one tokenizer, model cards, small."""

from __future__ import annotations

import json
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "demo_models"
MODELS = ("target", "draft-general", "draft-support")


def test_demo_models_are_committed_complete_and_small():
    total = 0
    vocab = None
    for name in MODELS:
        model_dir = DEMO / "models" / name
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "MODEL_CARD.md"):
            assert (model_dir / f).is_file(), f"{name}/{f} is missing; rebuild with demo_models/build.py"
        total += sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
        assert not (model_dir / "checkpoints").exists(), f"{name}: tune-draft checkpoints must not be committed"
        card = (model_dir / "MODEL_CARD.md").read_text()
        for needle in ("## Data", "## Training", "## Rebuild", "demo_models/build.py"):
            assert needle in card, f"{name}: model card lacks {needle!r}"
        tokens = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
        vocab = vocab or tokens
        assert tokens == vocab, f"{name} does not share the family's tokenizer"
    assert total < 40e6, f"demo models take {total / 1e6:.1f} MB; the budget is 40 MB"


def test_drafts_are_at_least_10x_cheaper_per_token():
    def per_token(name):
        c = json.loads((DEMO / "models" / name / "config.json").read_text())
        h, d = c["hidden_size"], c["head_dim"]
        attn = h * d * 2 * (c["num_attention_heads"] + c["num_key_value_heads"])
        return c["num_hidden_layers"] * (attn + 3 * h * c["intermediate_size"]) + c["vocab_size"] * h

    for draft in ("draft-general", "draft-support"):
        assert per_token("target") >= 10 * per_token(draft)


def test_demo_models_load_and_the_yaml_validates():
    from accel_plugin.speculative.draft_config import check_against_target, load_draft_config
    from accel_plugin.tuning.loaders import load_lm

    config = load_draft_config(DEMO / "drafts.yaml")
    check_against_target(config, DEMO / "models" / "target")
    for name in MODELS:
        assert load_lm(DEMO / "models" / name).config.vocab_size == 2048


def test_the_tutorial_quotes_the_committed_tune_report():
    report = json.loads((DEMO / "models" / "draft-support" / "tune_report.json").read_text())
    tutorial = (DEMO.parent / "docs" / "tutorial-domain-draft.md").read_text()
    for value in (report["before"]["alpha"], report["after"]["alpha"]):
        assert f"{value:.3f}" in tutorial, "docs/tutorial-domain-draft.md is out of date with the demo models"
    assert (DEMO.parent / "docs" / "img" / "speedup-by-domain.png").is_file()
