"""Drafts that borrow tensors from their target, with a pruned head (draft_format)."""

from __future__ import annotations

import json

import pytest
import torch

from accel_plugin.speculative.draft_format import DraftFormatError, load_tensors, read_spec
from accel_plugin.speculative.llama import LlamaDraftModel
from accel_plugin.speculative.llama_weights import DraftModelError
from accel_plugin.tuning.draft_lm import draft_from_target, head_vocab_from_counts, load_draft


@pytest.fixture(scope="module")
def cut_draft(tmp_path_factory, target_dir):
    """Target layers 0 and 1 (layer 0 borrowed, layer 1 stored), head of 64 tokens."""
    out = tmp_path_factory.mktemp("cut") / "draft"
    vocab = torch.arange(3, 3 + 64 * 5, 5)
    draft = draft_from_target(target_dir, [0, 1], train_layers=1, head_vocab=vocab)
    draft.save(out)
    return out, vocab


def test_saved_draft_stores_only_what_it_does_not_borrow(cut_draft, target_dir):
    out, vocab = cut_draft
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" not in names
    assert not any(n.startswith("model.layers.0.") for n in names)
    assert any(n.startswith("model.layers.1.") for n in names)
    assert "accel.head_vocab" in names
    spec = read_spec(json.loads((out / "config.json").read_text()))
    assert spec.from_target["model.layers.0."] == "model.layers.0."
    tensors, _ = load_tensors(out, target_dir)
    target, _ = load_tensors(target_dir)
    assert torch.equal(tensors["model.embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert torch.equal(tensors["model.layers.0.mlp.down_proj.weight"], target["model.layers.0.mlp.down_proj.weight"])


def test_lean_forward_of_a_pruned_draft_equals_the_training_module(cut_draft, target_dir):
    """The draft engine's forward and greedy ids match DraftLM's (the tuning view)."""
    out, vocab = cut_draft
    lean = LlamaDraftModel(out, max_len=64, initial_slots=1, target_dir=target_dir)
    assert lean.lm_head.shape[0] == len(vocab) and torch.equal(lean.head_vocab, vocab)
    assert lean.forward_bytes < sum(t.numel() * 4 for t in load_tensors(target_dir)[0].values())
    module = load_draft(out, target_dir)
    tokens = torch.randint(0, 300, (1, 11), generator=torch.Generator().manual_seed(1))
    logits = lean.forward(tokens, torch.tensor([0]), torch.tensor([11]), torch.tensor([lean.alloc_slot()]))
    ref = module(input_ids=tokens).logits[0, -1]
    assert (logits[0] - ref).abs().max() < 2e-4
    assert int(lean.greedy(logits)[0]) == int(vocab[ref.argmax()])
    assert int(lean.greedy(logits)[0]) in set(vocab.tolist())


def test_a_borrowing_draft_needs_its_target(cut_draft, tiny_models):
    out, _ = cut_draft
    with pytest.raises(DraftModelError, match="no target model directory was given"):
        LlamaDraftModel(out, max_len=32, initial_slots=1)
    other = tiny_models("gqa-d32", seed=123)  # same shapes, other weights
    with pytest.raises(DraftModelError, match="made for another target model"):
        LlamaDraftModel(out, max_len=32, initial_slots=1, target_dir=other)


def test_bad_spec_is_refused_with_the_valid_keys(tmp_path):
    with pytest.raises(DraftFormatError, match="valid keys: format, from_target, head_vocab, target"):
        read_spec({"accel_draft": {"format": 1, "from_targt": {}}}, "x/config.json")
    with pytest.raises(DraftFormatError, match="reads format 1"):
        read_spec({"accel_draft": {"format": 7}})
    with pytest.raises(DraftFormatError, match="prefix"):
        read_spec({"accel_draft": {"format": 1, "from_target": {"model.layers.0.": "model.layers.0.q"}}})


def test_head_vocab_from_counts():
    ids = head_vocab_from_counts({5: 10, 7: 10, 2: 3, 9: 1}, 3, 100)
    assert ids.tolist() == [2, 5, 7]
    assert head_vocab_from_counts({1: 1}, 3, 100).tolist() == [0, 1, 2]
    from accel_plugin.tuning import TuningError

    with pytest.raises(TuningError, match="--head-vocab must be in 1..100"):
        head_vocab_from_counts({}, 101, 100)
