"""DomainProposer driven the way vLLM drives it, by the greedy verifier of verifier.py.

Every test that serves requests checks the outputs (plain greedy decoding: the
verifier's doing) and, with :func:`check_proposer`, what the proposer is
responsible for: its drafts against the draft model's own greedy continuation of
each row's tokens, its per-domain counters against what the verifier did, and one
state per decoding row while rows move, arrive, prefill in chunks and leave. The
tests after the first ones break the proposer on purpose (drafts one token behind,
the target's own token counted as accepted, states kept by row index, a state's
context not moved on) and check that :func:`check_proposer` fails on each.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from accel_plugin.speculative import DomainProposer, DomainState


def _load_verifier():
    spec = importlib.util.spec_from_file_location("accel_tests_verifier", Path(__file__).with_name("verifier.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_verifier = _load_verifier()
MAX_LEN = _verifier.MAX_LEN
Request, Trace, serve = _verifier.Request, _verifier.Trace, _verifier.serve
check_proposer, assert_lossless, plain_greedy = _verifier.check_proposer, _verifier.assert_lossless, _verifier.plain_greedy


@pytest.fixture
def proposer_for(make_config, tokenizer):
    def make(yaml_text: str, cls: type[DomainProposer] = DomainProposer, **kw) -> DomainProposer:
        config = make_config(yaml_text)
        return cls(config, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), max_len=MAX_LEN, **kw)

    return make


def prompts(tokenizer, texts):
    return [tokenizer(t).input_ids for t in texts]


TEXTS = ["Customer: my refund ticket #123 is late", "def foo(a, b):", "The model is", "order delivery status please"]
DOMAINS = ["support", "code", "default", "support"]  # of TEXTS, by the config of two_domains


def two_domains(proposer_for, target_dir, draft_dir, cls=DomainProposer) -> DomainProposer:
    """support: the target as its draft (identical); code: a random draft; default: none; fixed k = 4."""
    return proposer_for(f"""
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
    """, cls)


def serve_mixed(proposer, target, tokenizer) -> tuple[list[Request], Trace]:
    """TEXTS twice, 24 tokens each, rows shuffled every step."""
    reqs = [Request(p, 24, d) for p, d in zip(prompts(tokenizer, TEXTS * 2), DOMAINS * 2)]
    return reqs, serve(proposer, target, reqs, shuffle=1)


TWO_DOMAINS_K = {"support": 4, "code": 4, "default": 0}


def test_lossless_counters_and_routing(proposer_for, target, target_dir, draft_dir, tokenizer):
    proposer = two_domains(proposer_for, target_dir, draft_dir)
    reqs, trace = serve_mixed(proposer, target, tokenizer)
    assert_lossless(target, reqs)
    check_proposer(proposer, trace, fixed_k=TWO_DOMAINS_K)
    stats = proposer.stats()
    assert stats["support"].drafted > 0 and stats["code"].drafted > 0 and stats["default"].drafted == 0
    assert stats["support"].alpha == 1.0  # the identical draft is always accepted
    assert stats["code"].alpha < 0.5
    assert stats["default"].state == DomainState.NO_DRAFT
    # the drafts proposed in each request's last step are never verified; nothing else is missed
    assert all(v.seen for v in trace.verifications)
    # finished requests are freed at the next step (here: an empty one)
    assert proposer.num_states == trace.states[-1][1] > 0
    proposer.propose([], np.zeros(16, dtype=np.int32), np.zeros((16, MAX_LEN), dtype=np.int32))
    assert proposer.num_states == 0


def test_rows_moving_arriving_prefilling_and_away(proposer_for, target, target_dir, tokenizer):
    proposer = proposer_for(f"num_speculative_tokens: 3\ndefault: {{draft: {target_dir}}}\n")
    first = [Request(p, 8 + 4 * i) for i, p in enumerate(prompts(tokenizer, TEXTS))]
    later = [Request(p, 10, prefill_steps=n)
             for n, p in zip((2, 3), prompts(tokenizer, ["The model is", "a b c d e f g h i j k l m n o p q r"]))]
    trace = serve(proposer, target, first, shuffle=3, arrivals={3: later},
                  away={2: [first[1]], 4: [first[0], later[0]], 5: [first[3]]})
    assert_lossless(target, first + later)
    check_proposer(proposer, trace)
    # a request left out of a step is new to the proposer when it is back: the drafts
    # it had are verified then, and not counted (their state was freed)
    assert any(not v.seen for v in trace.verifications)
    s = proposer.stats()["default"]
    assert s.accepted == s.drafted > 0  # the identical draft


def test_identical_prompts_are_served_independently(proposer_for, target, target_dir, tokenizer):
    proposer = proposer_for(f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\n")
    (p,) = prompts(tokenizer, ["The model is"])
    reqs = [Request(list(p), 6), Request(list(p), 12), Request(list(p), 9)]
    trace = serve(proposer, target, reqs, shuffle=5)
    assert_lossless(target, reqs)
    check_proposer(proposer, trace)


def test_poor_draft_is_cut_back_while_fixed_k_keeps_drafting(proposer_for, target, tiny_models, tokenizer):
    poor = tiny_models("draft-d32", seed=7)
    results = {}
    for adaptive in (True, False):
        # the controller's tuning keys only with adaptive: true (refused where they do nothing)
        controller = "{adaptive: true, min_samples: 8, draft_cost: 0.2, probe_interval: 8}" if adaptive else "{adaptive: false}"
        proposer = proposer_for(f"""
            num_speculative_tokens: 4
            default: {{draft: {poor}}}
            controller: {controller}
        """)
        reqs = [Request(p, 40) for p in prompts(tokenizer, TEXTS * 2)]
        trace = serve(proposer, target, reqs)
        assert_lossless(target, reqs)
        check_proposer(proposer, trace, fixed_k=None if adaptive else {"default": 4})
        results[adaptive] = (proposer.stats()["default"], trace)
    adaptive_stats, adaptive_trace = results[True]
    fixed_stats, fixed_trace = results[False]
    assert adaptive_stats.state == DomainState.OFF and adaptive_stats.k == 0
    assert fixed_stats.state == DomainState.FIXED and fixed_stats.k == 4
    assert fixed_stats.drafted == 4 * fixed_stats.steps  # full k every step
    assert adaptive_trace.drafted < fixed_trace.drafted / 3


# ------------------------------------------------------------------ broken proposers


def _drafts_one_token_behind(proposer, monkeypatch):
    """Drafts for the context without its last token: off by one position."""
    real = proposer.engine.draft
    monkeypatch.setattr(proposer.engine, "draft", lambda draft, jobs: real(
        draft, [dataclasses.replace(job, context=job.context[:-1]) for job in jobs]))


def _counts_the_target_token(proposer, monkeypatch):
    """Counts the token the target adds after a rejection as an accepted draft."""
    real = proposer.controller.observe
    monkeypatch.setattr(proposer.controller, "observe", lambda domain, k, n, *offer: real(domain, k, min(k, n + 1), *offer))


class _RowIndexProposer(DomainProposer):
    """Keeps a request's state with its row index, ignoring that rows move."""

    def _match(self, row, key, token_ids, claimed):
        state = self._states.by_row.get(row)
        if state is not None and state not in claimed:
            return state
        return super()._match(row, key, token_ids, claimed)


class _StaleContextProposer(DomainProposer):
    """Learns from a row's new tokens but does not move its state's context on."""

    def _learn(self, state, new, num_sampled):
        length = state.length
        super()._learn(state, new, num_sampled)
        state.length = length


@pytest.mark.parametrize("breakage, failure", [
    (_drafts_one_token_behind, "not the draft's greedy continuation"),
    (_counts_the_target_token, "counters"),
    (_RowIndexProposer, "drafts, expected k = 0"),
    (_StaleContextProposer, "not the draft.s greedy continuation"),
], ids=["drafts-one-token-behind", "counts-target-token-as-accepted", "state-by-row-index", "context-not-advanced"])
def test_check_proposer_fails_on_a_broken_proposer(proposer_for, target, target_dir, draft_dir, tokenizer,
                                                   monkeypatch, breakage, failure):
    if isinstance(breakage, type):
        proposer = two_domains(proposer_for, target_dir, draft_dir, cls=breakage)
    else:
        proposer = two_domains(proposer_for, target_dir, draft_dir)
        breakage(proposer, monkeypatch)
    reqs, trace = serve_mixed(proposer, target, tokenizer)
    assert_lossless(target, reqs)  # the verifier keeps outputs right whatever the proposer does
    with pytest.raises(AssertionError, match=failure):
        check_proposer(proposer, trace, fixed_k=TWO_DOMAINS_K)


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
    reqs = [Request(p, 20, d) for p, d in zip(prompts(tokenizer, TEXTS), ["support", "default", "default", "support"])]
    with caplog.at_level(logging.ERROR, logger="accel_plugin.speculative"):
        trace = serve(proposer, target, reqs, shuffle=2)
    assert_lossless(target, reqs)
    check_proposer(proposer, trace)
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
    b = Request(a.prompt + a.output + prompts(tokenizer, [" The model is"])[0], 8)
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
    later = [Request(p, 6, prefill_steps=2) for p in prompts(tokenizer, ["The model is"])]
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
