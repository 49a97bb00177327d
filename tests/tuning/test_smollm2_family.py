"""The SmolLM2 demo family: held-out prompts are new text, drafts are small and fit their target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel_plugin.models.store import cached_path

FAMILY = Path(__file__).resolve().parents[2] / "demo_models" / "smollm2"
DOMAINS = ("support", "code", "general")
NGRAM = 8


def _prompts(name: str) -> list[str]:
    return [json.loads(line)["prompt"] for line in (FAMILY / "prompts" / name).read_text().splitlines() if line]


@pytest.fixture(scope="module")
def tokenizer():
    target = cached_path("smollm2")
    if target is None:
        pytest.skip("needs the SmolLM2 target's tokenizer: run `make models` (accel models get smollm2)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target))


def _ngrams(ids: list[int]) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + NGRAM]) for i in range(len(ids) - NGRAM + 1)}


def _shared(tokenizer, held: list[str], tune: list[str]) -> list[str]:
    """Held-out prompts that share an 8-token sequence with any tuning prompt."""
    seen: set[tuple[int, ...]] = set()
    for text in tune:
        seen |= _ngrams(tokenizer.encode(text, add_special_tokens=False))
    return [t for t in held if _ngrams(tokenizer.encode(t, add_special_tokens=False)) & seen]


@pytest.mark.parametrize("domain", DOMAINS)
def test_held_out_prompts_share_no_8_token_sequence_with_tuning_prompts(tokenizer, domain):
    """Tokens of the target's tokenizer, on the user messages (the chat template
    around them is the same for every prompt and is not part of the prompt)."""
    tune, held = _prompts(f"{domain}-tune.jsonl"), _prompts(f"{domain}-heldout.jsonl")
    assert len(held) == 24 and len(tune) >= 300
    shared = _shared(tokenizer, held, tune)
    assert not shared, f"held-out prompts sharing an {NGRAM}-token sequence with tuning prompts: {shared[:3]}"


def test_the_check_can_fail(tokenizer):
    """A copied tuning prompt, or one of its sentences inside new text, is caught."""
    tune = _prompts("support-tune.jsonl")
    copied = tune[0]
    embedded = "Good morning. " + tune[1] + " Thanks a lot!"
    fresh = _prompts("support-heldout.jsonl")[0]
    assert _shared(tokenizer, [copied, embedded, fresh], tune) == [copied, embedded]


def test_committed_drafts_are_small_and_borrow_from_the_target():
    """What is committed stays small: every draft's weights together under 40 MB; the
    embedding (113 MB in float32) is borrowed from the target, never stored."""
    from safetensors import safe_open

    drafts = sorted((FAMILY / "drafts").glob("*/model.safetensors"))
    assert {p.parent.name for p in drafts} >= {"support", "code", "general", "support-untuned"}
    assert sum(p.stat().st_size for p in drafts) < 40 * 2**20
    for path in drafts:
        with safe_open(str(path), framework="pt") as f:
            assert "model.embed_tokens.weight" not in set(f.keys())
        config = json.loads((path.parent / "config.json").read_text())
        assert config["accel_draft"]["from_target"]["model.embed_tokens.weight"] == "model.embed_tokens.weight"
        assert config["vocab_size"] == 49152


def test_drafts_load_against_the_real_target():
    target = cached_path("smollm2")
    if target is None:
        pytest.skip("needs the SmolLM2 target: run `make models` (accel models get smollm2)")
    import torch

    from accel_plugin.speculative.llama import LlamaDraftModel

    for name in ("support", "support-untuned"):
        model = LlamaDraftModel(FAMILY / "drafts" / name, max_len=64, initial_slots=1, target_dir=target,
                                dtype=torch.float32)
        assert model.head_vocab is not None and model.forward_bytes < 60 * 2**20
