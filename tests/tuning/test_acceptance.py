"""The acceptance simulator, the break-even math and the prompt files."""

from __future__ import annotations

import json

import pytest

from accel_plugin.tuning import TuningError
from accel_plugin.tuning.acceptance import (
    break_even_alpha,
    expected_speedup,
    greedy_continuation,
    match_flags,
    simulate,
    simulated_speedup,
)
from accel_plugin.tuning.prompts import read_prompts, split_holdout

T, F = True, False


def test_per_position_counts_on_a_hand_made_case():
    # rounds (k=3): [T T F] -> 2 accepted + target token; [T T T] -> 3 + 1;
    # [F] -> 0 + 1; [T] then the end (the last token is always the target's)
    stats = simulate([[T, T, F, T, T, T, T, F, T, T]], k=3)
    assert stats.accepted_per_pos == [3, 2, 1]
    assert stats.tested_per_pos == [4, 2, 2]
    assert (stats.rounds, stats.tokens) == (4, 10)
    assert stats.alpha == pytest.approx(6 / 8)
    assert stats.per_position == [0.75, 1.0, 0.5]
    assert stats.mean_acceptance_length == pytest.approx(2.5)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_perfect_and_useless_drafts(k):
    perfect = simulate([[T] * 30, [T] * 7], k)
    assert perfect.alpha == 1.0 and all(p == 1.0 for p in perfect.per_position if p is not None)
    assert perfect.tokens == 37
    useless = simulate([[F] * 30], k)
    assert useless.alpha == 0.0 and useless.mean_acceptance_length == 1.0
    assert useless.per_position[0] == 0.0 and useless.rounds == 30


def test_simulated_speedup_counts_draft_and_verify_steps():
    stats = simulate([[T] * 9], k=2)  # 3 rounds of 3 tokens
    assert (stats.rounds, stats.tokens) == (3, 9)
    # plain: 9 target steps of 4 ms; speculative: 3 x (2 x 1 ms + 4 ms)
    assert simulated_speedup(stats, draft_ms=1.0, target_ms=4.0) == pytest.approx(36 / 18)


@pytest.mark.parametrize("c", [0.05, 0.2, 0.5])
def test_break_even_alpha(c):
    assert break_even_alpha(1, c) == pytest.approx(c, abs=1e-9)  # (1 + a) / (1 + c) = 1
    for k in (2, 4):
        a = break_even_alpha(k, c)
        assert expected_speedup(a, k, c) == pytest.approx(1.0, abs=1e-6)
        assert a > c  # drafting more needs more acceptance
    assert break_even_alpha(3, 1.0) == 1.0  # a draft as slow as the target never pays


def test_draft_equal_to_target_is_always_accepted(tmp_path_factory):
    from accel_plugin.testing.tiny_models import build_tiny_model
    from accel_plugin.tuning.loaders import load_lm

    model = load_lm(build_tiny_model("mha-d32", tmp_path_factory.getbasetemp() / "tuning-models"))
    prompt = [5, 17, 42, 9]
    cont = greedy_continuation(model, prompt, 12)
    assert len(cont) == 12
    flags = match_flags(model, prompt, cont)
    assert flags == [True] * 12
    assert simulate([flags], 4).alpha == 1.0


def test_prompt_files(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in read_prompts(text)] == ["first prompt", "second prompt"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a\nb", "domain": "support"}) + "\n" + json.dumps("plain") + "\n")
    prompts = read_prompts(jsonl)
    assert [(p.text, p.label) for p in prompts] == [("a\nb", "support"), ("plain", None)]
    train, held = split_holdout(read_prompts(text) * 5, 0.2, seed=0)
    assert (len(train), len(held)) == (8, 2)


@pytest.mark.parametrize("content, suffix, needle", [
    ("", ".txt", "has no prompts"),
    ("\n\n", ".txt", "has no prompts"),
    ("{not json\n", ".jsonl", "p.jsonl:1: not valid JSON"),
    ('{"text": "x"}\n', ".jsonl", 'expected a string or {"prompt"'),
    ('{"prompt": "x", "domain": 3}\n', ".jsonl", "'domain' must be a string"),
])
def test_bad_prompt_files(tmp_path, content, suffix, needle):
    path = tmp_path / f"p{suffix}"
    path.write_text(content)
    with pytest.raises(TuningError, match="--prompts") as info:
        read_prompts(path)
    assert needle in str(info.value)
    with pytest.raises(TuningError, match="does not exist"):
        read_prompts(tmp_path / "missing.txt")
