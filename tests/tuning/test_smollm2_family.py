"""The SmolLM2 demo family: held-out prompts are new text, drafts are small and fit their target."""

from __future__ import annotations

import json
import re
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


# ------------------------------------------------------ the sets with no tuning part

EXTRA = {"support-freestyle.jsonl": "support", "repeat-heldout.jsonl": "repeat"}
#: signs of a message typed by a customer rather than written from a template: a typed
#: order reference (ord 88-1234, #A77812, ORD-4471, order nr ..., 12-3456), a common typo or
#: chat shorthand, two questions run together, or a message that starts in lower case
_ORDER_REF = re.compile(r"(?i)\b(ord(er)?\s*(no\.|nr)\s*\d|ord[- ]\d)|#[A-Z]\d{4,}|\b\d{2}-\d{4}\b")
_SHORTHAND = re.compile(r"(?i)\b(teh|plz|pls|thx|ty|u|cant|wont|whats|recieved|adress|acount|asap|btw|w/)\b")
#: a second need run on after the first
_SECOND_NEED = re.compile(r"(?i)[.?] (also|btw|oh and) |\band also\b| - also ")


def _labels(name: str) -> set[str]:
    return {json.loads(line)["domain"] for line in (FAMILY / "prompts" / name).read_text().splitlines() if line}


def _customer_style(text: str) -> bool:
    return bool(_ORDER_REF.search(text) or _SHORTHAND.search(text) or text[:1].islower()
                or bool(_SECOND_NEED.search(text)))


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_extra_sets_share_no_8_token_sequence_with_any_tuning_prompt(tokenizer, name):
    tune = [t for d in DOMAINS for t in _prompts(f"{d}-tune.jsonl")]
    held = _prompts(name)
    assert len(held) == 24 and len(set(held)) == 24 and _labels(name) == {EXTRA[name]}
    shared = _shared(tokenizer, held, tune)
    assert not shared, f"{name}: prompts sharing an {NGRAM}-token sequence with tuning prompts: {shared[:3]}"


def test_committed_prompt_files_are_what_make_prompts_writes(tokenizer):
    """The seeded generators still produce the committed files (run make_prompts.py after editing them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_prompts", FAMILY / "make_prompts.py")
    make_prompts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_prompts)
    sets = make_prompts.build(tokenizer)
    for domain in DOMAINS:
        assert sets[domain]["bench"] == _prompts(f"{domain}-heldout.jsonl")
    extra = make_prompts.build_extra(tokenizer, sets)
    for name in EXTRA:
        assert extra[name.removesuffix(".jsonl")] == _prompts(name)
    first = {domain: list(sets[domain]["tune"]) for domain in DOMAINS}
    make_prompts.add_more_tuning(tokenizer, sets, extra)
    for domain in DOMAINS:
        # the added tuning prompts come after the first ones, which (and the held-out sets) did not change
        assert sets[domain]["tune"] == _prompts(f"{domain}-tune.jsonl")
        assert len(sets[domain]["tune"]) == len(first[domain]) + make_prompts.EXTRA_TUNE.get(domain, 0)
        assert sets[domain]["tune"][:len(first[domain])] == first[domain]


def test_free_style_support_set_is_written_in_another_style_than_the_templates():
    free, templated = _prompts("support-freestyle.jsonl"), _prompts("support-heldout.jsonl")
    styled = sum(map(_customer_style, free)) / len(free)
    assert styled >= 0.9, f"only {styled:.0%} of the free-style prompts look typed by a customer"
    assert sum(map(_customer_style, templated)) / len(templated) <= 0.2
    assert sum(bool(_ORDER_REF.search(t)) for t in free) >= 6  # typed order references, in several forms
    assert sum(bool(_SECOND_NEED.search(t)) for t in free) >= 6  # two needs in one message


def test_the_style_check_can_fail():
    assert not _customer_style("Where do I send the backpack back if it does not fit?")
    assert _customer_style("Hi, ord 88-1234 never came")
    assert _customer_style("Where is #A77812?")
    assert _customer_style("where is it")
    assert _customer_style("My order is late. Also, can I get an invoice?") is False  # a written "Also,"
    assert _customer_style("It is late. also can i get an invoice")


def test_free_style_support_prompts_mostly_route_to_support():
    from accel_plugin.speculative.draft_config import load_draft_config
    from accel_plugin.speculative.router import DomainRouter

    router = DomainRouter.from_config(load_draft_config(FAMILY / "drafts.yaml"))
    routed = [router.route(t) for t in _prompts("support-freestyle.jsonl")]
    assert routed.count("support") >= 0.75 * len(routed), routed


def test_repeat_prompts_start_with_their_task_verb_and_carry_the_text():
    """The `repeat` domain's router matches the verb; the text to repeat follows a colon."""
    verbs = ("rewrite", "rephrase", "fix", "correct", "copy", "reformat", "repeat")
    for text in _prompts("repeat-heldout.jsonl"):
        head, _, body = text.partition(": ")
        assert head.split(" ")[0].lower() in verbs, text
        assert len(body.split()) >= 8, text
    assert {t.split(" ")[0].lower() for t in _prompts("repeat-heldout.jsonl")} == set(verbs)


def test_support_tune_report_has_both_held_out_sets():
    report = json.loads((FAMILY / "drafts" / "support" / "tune_report.json").read_text())
    sets = report["held_out_sets"]
    assert set(sets) == {"templated", "free-style"}
    for label, s in sets.items():
        assert (FAMILY.parents[1] / s["prompts"]).is_file() and s["n"] == 24, label
        assert 0.0 <= s["alpha"] <= 1.0 and 1.0 <= s["mean_acceptance_length"] <= s["k"] + 1, label
    card = (FAMILY / "drafts" / "support" / "MODEL_CARD.md").read_text()
    for label, s in sets.items():
        assert f"{label} ({s['prompts']}" in card and f"alpha {s['alpha']:.3f}" in card
