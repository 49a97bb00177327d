"""DomainProposer driven the way vLLM drives it, by a small greedy verifier.

The verifier plays vLLM's part: a persistent batch whose rows move when requests
finish or arrive, ``token_ids`` as a reused buffer, greedy verification of the
drafts by the target, ``[]`` for rows that did not decode. Outputs must equal plain
greedy decoding, and the proposer's counters must equal what the verifier saw.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from accel_plugin.speculative import DomainProposer, DomainState

MAX_LEN = 256


@pytest.fixture(scope="module")
def target(target_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(target_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)


def target_greedy(target, tokens: list[int]) -> list[int]:
    """Greedy next token after every prefix ``tokens[:j]``, j = 1..len (one forward)."""
    with torch.no_grad():
        return target(torch.tensor([tokens])).logits[0].argmax(-1).tolist()


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens


@dataclass
class Tally:
    drafted: int = 0
    accepted: int = 0
    max_draft_len: int = 0


def serve(proposer, target, requests: list[Request], *, shuffle: int | None = None,
          arrivals: dict[int, list[Request]] | None = None, skip_every: int = 0) -> Tally:
    """Decode ``requests`` to completion with speculation; returns what was drafted/accepted."""
    rng = np.random.default_rng(shuffle)
    batch = list(requests)
    token_ids = np.full((16, MAX_LEN), -7, dtype=np.int32)  # garbage outside the rows
    tally = Tally()
    step = 0
    while batch:
        step += 1
        for r in batch:  # the target verifies the drafts (first step: prefill)
            if r.done:
                continue
            greedy = target_greedy(target, r.tokens + r.drafts)[len(r.tokens) - 1 :]
            accepted = 0
            while accepted < len(r.drafts) and r.drafts[accepted] == greedy[accepted]:
                accepted += 1
            new = (r.drafts[:accepted] + [greedy[accepted]])[: r.max_tokens - len(r.output)]
            tally.drafted += len(r.drafts)
            tally.accepted += min(accepted, len(new) - 1 + (len(new) == accepted))
            r.output += new
            r.sampled = new
        batch = [r for r in batch if not r.done]
        batch += (arrivals or {}).get(step, [])
        if shuffle is not None:
            rng.shuffle(batch)
        token_ids[:] = -7
        sampled, num_tokens = [], np.zeros(16, dtype=np.int32)
        for i, r in enumerate(batch):
            toks = r.tokens
            token_ids[i, : len(toks)] = toks
            num_tokens[i] = len(toks)
            skip = skip_every and step % skip_every == 0 and i == 0
            sampled.append([] if skip or not r.output else list(r.sampled))
        if not batch:
            break
        drafts = proposer.propose(sampled, num_tokens, token_ids)
        assert len(drafts) == len(batch)
        for r, d, s in zip(batch, drafts, sampled):
            assert len(d) <= proposer.config.num_speculative_tokens
            r.drafts = list(d) if s else []
            tally.max_draft_len = max(tally.max_draft_len, len(d))
        assert proposer.num_states <= len(batch)
    return tally


_plain: dict = {}


def plain_greedy(target, prompt: list[int], n: int) -> list[int]:
    key = (id(target), tuple(prompt), n)
    if key not in _plain:
        _plain[key] = _plain_greedy(target, prompt, n)
    return _plain[key]


def _plain_greedy(target, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(target_greedy(target, tokens)[-1])
    return tokens[len(prompt):]


@pytest.fixture
def proposer_for(make_config, tokenizer):
    def make(yaml_text: str, **kw) -> DomainProposer:
        config = make_config(yaml_text)
        return DomainProposer(config, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), max_len=MAX_LEN, **kw)

    return make


def prompts(tokenizer, texts):
    return [tokenizer(t).input_ids for t in texts]


TEXTS = ["Customer: my refund ticket #123 is late", "def foo(a, b):", "The model is", "order delivery status please"]


def test_lossless_counters_and_routing(proposer_for, target, target_dir, draft_dir, tokenizer):
    proposer = proposer_for(f"""
        num_speculative_tokens: 4
        domains:
          support:
            draft: {target_dir}
            match: {{keywords: [refund, delivery]}}
          code:
            draft: {draft_dir}
            match: {{regex: ['^def ']}}
        default:
          draft: null
        controller: {{adaptive: false}}
    """)
    reqs = [Request(p, 24) for p in prompts(tokenizer, TEXTS)]
    tally = serve(proposer, target, reqs, shuffle=1)
    for r in reqs:
        assert r.output == plain_greedy(target, r.prompt, 24)
    stats = proposer.stats()
    assert stats["support"].drafted > 0 and stats["code"].drafted > 0 and stats["default"].drafted == 0
    # the identical draft is always accepted (until max_tokens cuts the verification)
    assert stats["support"].alpha == 1.0
    assert stats["code"].alpha < 0.5
    assert stats["default"].state == DomainState.NO_DRAFT
    total_drafted = sum(s.drafted for s in stats.values())
    total_accepted = sum(s.accepted for s in stats.values())
    # the proposer learns about a row's drafts at its next step; the last step's drafts
    # of each request are never verified (the request has finished)
    assert total_drafted <= tally.drafted and total_accepted <= tally.accepted
    assert tally.max_draft_len == 4
    # finished requests are freed at the next step (here: an empty one)
    assert proposer.num_states == 2
    proposer.propose([], np.zeros(16, dtype=np.int32), np.zeros((16, MAX_LEN), dtype=np.int32))
    assert proposer.num_states == 0


def test_rows_moving_arriving_and_skipping(proposer_for, target, target_dir, tokenizer):
    proposer = proposer_for(f"num_speculative_tokens: 3\ndefault: {{draft: {target_dir}}}\n")
    first = [Request(p, 8 + 4 * i) for i, p in enumerate(prompts(tokenizer, TEXTS))]
    later = [Request(p, 10) for p in prompts(tokenizer, ["The model is", "a b c d e f g h i j k l m n o p q r"])]
    serve(proposer, target, first, shuffle=3, arrivals={3: later}, skip_every=4)
    for r in first + later:
        assert r.output == plain_greedy(target, r.prompt, r.max_tokens)
    s = proposer.stats()["default"]
    assert s.accepted / s.drafted > 0.9  # identical draft (some drafts cut by max_tokens)


def test_identical_prompts_are_served_independently(proposer_for, target, target_dir, tokenizer):
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\n")
    (p,) = prompts(tokenizer, ["The model is"])
    reqs = [Request(list(p), 6), Request(list(p), 12), Request(list(p), 9)]
    serve(proposer, target, reqs, shuffle=5)
    ref = plain_greedy(target, p, 12)
    for r in reqs:
        assert r.output == ref[: r.max_tokens]


def test_poor_draft_is_cut_back_while_fixed_k_keeps_drafting(proposer_for, target, tiny_models, tokenizer):
    poor = tiny_models("draft-d32", seed=7)
    texts = TEXTS * 2
    results = {}
    for adaptive in (True, False):
        proposer = proposer_for(f"""
            num_speculative_tokens: 4
            default: {{draft: {poor}}}
            controller: {{adaptive: {str(adaptive).lower()}, min_samples: 8, draft_cost: 0.2, probe_interval: 8}}
        """)
        reqs = [Request(p, 40) for p in prompts(tokenizer, texts)]
        tally = serve(proposer, target, reqs)
        for r in reqs:
            assert r.output == plain_greedy(target, r.prompt, 40)
        results[adaptive] = (proposer.stats()["default"], tally)
    adaptive_stats, adaptive_tally = results[True]
    fixed_stats, fixed_tally = results[False]
    assert adaptive_stats.state == DomainState.OFF and adaptive_stats.k == 0
    assert fixed_stats.state == DomainState.FIXED and fixed_stats.k == 4
    assert fixed_stats.drafted == 4 * fixed_stats.steps  # full k every step
    assert adaptive_tally.drafted < fixed_tally.drafted / 3


@pytest.mark.parametrize("error", [RuntimeError("kernel exploded"), torch.OutOfMemoryError("CPU out of memory")],
                         ids=["exception", "out-of-memory"])
def test_fault_in_one_draft_switches_its_domain_off(proposer_for, target, target_dir, draft_dir, tokenizer,
                                                    monkeypatch, caplog, error):
    proposer = proposer_for(f"""
        num_speculative_tokens: 3
        domains:
          support:
            draft: {draft_dir}
            match: {{keywords: [refund, delivery]}}
        default: {{draft: {target_dir}}}
    """)
    real_draft = proposer.engine.draft
    calls = {"n": 0}

    def faulty(draft, jobs):
        if draft == str(draft_dir):
            calls["n"] += 1
            if calls["n"] == 3:
                raise error
        return real_draft(draft, jobs)

    monkeypatch.setattr(proposer.engine, "draft", faulty)
    reqs = [Request(p, 20) for p in prompts(tokenizer, TEXTS)]
    with caplog.at_level(logging.ERROR, logger="accel_plugin.speculative"):
        serve(proposer, target, reqs, shuffle=2)
    for r in reqs:
        assert r.output == plain_greedy(target, r.prompt, 20)
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and "support" in errors[0].getMessage() and type(error).__name__ in errors[0].getMessage()
    stats = proposer.stats()
    assert stats["support"].state == DomainState.FAILED and type(error).__name__ in stats["support"].error
    assert stats["default"].state != DomainState.FAILED and stats["default"].accepted > 0
    assert calls["n"] == 3  # never called again
    assert str(draft_dir) not in proposer.engine.models


def test_fault_while_loading_a_draft_at_first_use(proposer_for, target, draft_dir, tokenizer, monkeypatch, caplog):
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {draft_dir}}}\n")

    def no_memory(draft):
        raise torch.OutOfMemoryError("cannot allocate")

    monkeypatch.setattr(proposer.engine, "new_cache", no_memory)
    reqs = [Request(p, 6) for p in prompts(tokenizer, TEXTS[:2])]
    with caplog.at_level(logging.ERROR, logger="accel_plugin.speculative"):
        serve(proposer, target, reqs)
    assert [r.output for r in reqs] == [plain_greedy(target, r.prompt, 6) for r in reqs]
    assert proposer.stats()["default"].state == DomainState.FAILED
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_counters_are_logged_periodically(proposer_for, target, target_dir, tokenizer, caplog):
    ticks = iter(range(10**6))
    proposer = proposer_for(
        f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\ncontroller: {{log_interval_s: 5}}\n",
        clock=lambda: float(next(ticks)),
    )
    with caplog.at_level(logging.INFO, logger="accel_plugin.speculative"):
        serve(proposer, target, [Request(p, 12) for p in prompts(tokenizer, TEXTS[:1])])
    lines = [r.getMessage() for r in caplog.records if "speculation:" in r.getMessage()]
    assert lines and "default: state=" in lines[-1] and "drafted=" in lines[-1]


def test_next_chat_turn_is_routed_on_its_own_prompt(proposer_for, target, target_dir, tokenizer):
    # Request B's prompt extends finished request A's tokens (the next turn of a chat).
    # B must get a state of its own, routed on its own prompt, not inherit A's.
    proposer = proposer_for(f"""
        num_speculative_tokens: 3
        domains:
          support:
            draft: {target_dir}
            match: {{regex: ['refund$']}}
        default:
          draft: null
        controller: {{adaptive: false}}
    """)
    (a_prompt,) = prompts(tokenizer, ["Customer: my refund"])
    a = Request(a_prompt, 8)
    serve(proposer, target, [a])
    drafted_for_a = proposer.stats()["support"].drafted
    assert drafted_for_a > 0
    b = Request(a.tokens + prompts(tokenizer, [" The model is"])[0], 8)
    serve(proposer, target, [b])
    assert b.output == plain_greedy(target, b.prompt, 8)
    assert proposer.stats()["support"].drafted == drafted_for_a  # nothing drafted for B


def recording(proposer, monkeypatch):
    """Lists of the controller's record_step / record_draft calls and propose's outputs."""
    calls = {"step": [], "draft": [], "out": []}
    ctl = proposer.controller
    for name, key in (("record_step", "step"), ("record_draft", "draft")):
        real = getattr(ctl, name)
        monkeypatch.setattr(ctl, name, lambda *a, real=real, key=key: (calls[key].append(a), real(*a))[1])
    propose = proposer.propose
    monkeypatch.setattr(proposer, "propose", lambda *a: (calls["out"].append(propose(*a)), calls["out"][-1])[1])
    return calls


def test_target_steps_are_reported_with_batch_and_drafts(proposer_for, target, target_dir, tokenizer, monkeypatch):
    """Each target step is reported with the requests it decoded and the draft tokens
    it verified (those proposed at the call before); each draft call with its time per
    forward, which the controller pairs with the next step."""
    seen = {}
    for name, draft in (("drafting", target_dir), ("plain", "null")):
        proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {draft}}}\n"
                                "controller: {adaptive: false}\n")
        calls = recording(proposer, monkeypatch)
        serve(proposer, target, [Request(p, 6) for p in prompts(tokenizer, TEXTS[:2])])
        seen[name] = calls
    drafting = seen["drafting"]
    # one report per call after the first; drafted = the drafts the previous call returned
    assert len(drafting["step"]) == len(drafting["out"]) - 1
    for (seconds, rows, drafted), before in zip(drafting["step"], drafting["out"]):
        assert drafted == sum(map(len, before)) and seconds is not None and seconds > 0
    assert drafting["step"][0][1:] == (2, 4)  # both requests decoded, 2 drafts each verified
    assert [d for d, _, _ in drafting["draft"]] == [str(target_dir)] * len(drafting["draft"])
    assert drafting["draft"][0][1] == 2 and all(spf > 0 for _, _, spf in drafting["draft"])
    assert seen["plain"]["step"] and all(d == 0 for _, _, d in seen["plain"]["step"])
    assert not seen["plain"]["draft"]


def test_a_step_that_prefilled_a_new_request_is_not_timed(proposer_for, target, target_dir, tokenizer, monkeypatch):
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\n")
    calls = recording(proposer, monkeypatch)
    later = [Request(p, 6) for p in prompts(tokenizer, ["The model is"])]
    serve(proposer, target, [Request(p, 8) for p in prompts(tokenizer, TEXTS[:2])], arrivals={3: later})
    untimed = [i + 2 for i, (seconds, _, _) in enumerate(calls["step"]) if seconds is None]
    # call 3: the new request's row has no sampled token yet (as a prompt being prefilled
    # in chunks has); call 4: its first token, i.e. its prefill ran in the step
    assert untimed == [3, 4]


def test_calibration_steps_draft_nothing_and_stay_lossless(proposer_for, target, target_dir, tokenizer,
                                                          monkeypatch):
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\n"
                            "controller: {calibration_interval: 4, min_samples: 2, switch_after: 2}\n")
    calls = recording(proposer, monkeypatch)
    flags = []
    step = proposer.controller.step
    monkeypatch.setattr(proposer.controller, "step",
                        lambda *a: (step(*a), flags.append(proposer.controller.calibrating))[0])
    reqs = [Request(p, 24) for p in prompts(tokenizer, TEXTS[:3])]
    serve(proposer, target, reqs)
    for r in reqs:
        assert r.output == plain_greedy(target, r.prompt, 24)
    assert sum(flags) >= 3
    for flag, out in zip(flags, calls["out"]):
        if flag:
            assert all(d == [] for d in out)
    # the plain steps they made were timed and paired with their verifying neighbours
    assert any(drafted == 0 for _, _, drafted in calls["step"])
    assert proposer.controller.costs.overhead_samples(4) >= 3
    assert proposer.stats()["default"].state == DomainState.ON  # an identical draft


def test_weight_sizes_reach_the_controller(proposer_for, target, target_dir, draft_dir, tokenizer):
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {draft_dir}}}\n", target_bytes=10**6)
    serve(proposer, target, [Request(p, 4) for p in prompts(tokenizer, TEXTS[:1])])
    model = proposer.engine.models[str(draft_dir)]
    layer_bytes = sum(t.nbytes for layer in model.layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down,
                                                                  layer.ln_in, layer.ln_post))
    expected = layer_bytes + model.norm.nbytes + model.lm_head.nbytes  # the embedding table is not read whole
    assert proposer.stats()["default"].cost_ratio_size == pytest.approx(expected / 10**6)
    # a model that states its own forward_bytes is taken at its word
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {draft_dir}}}\n", target_bytes=10**6)
    proposer.load()
    proposer.engine.models[str(draft_dir)].forward_bytes = 5000
    serve(proposer, target, [Request(p, 4) for p in prompts(tokenizer, TEXTS[:1])])
    assert proposer.stats()["default"].cost_ratio_size == pytest.approx(0.005)
