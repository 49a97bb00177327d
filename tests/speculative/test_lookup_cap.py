"""A prompt lookup's ``spec_factor`` cap, measured: each capped draft followed to its end
(:class:`.lookup.Shadow`), and the controller lifting the cap per batch bucket where the whole
continuation predicts the higher speedup (:meth:`.DomainController.capped`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.speculative.controller import DomainController
from accel_plugin.speculative.domain_stats import DomainState
from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative.entries import Choice, lift_cap
from accel_plugin.speculative.lookup import Shadow, follow_shadows

from .test_lookup import REPEAT, _served, _verifier, brute_force, brute_force_match


@st.composite
def shadowed(draw):
    """A context, and shadows of drafts proposed when it was shorter (``at + avail <= start``)."""
    tokens = draw(st.lists(st.integers(0, 2), min_size=2, max_size=60))
    shadows = []
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.integers(1, len(tokens)))
        at = draw(st.integers(0, start - 1))
        avail = draw(st.integers(1, start - at))
        shadows.append(Shadow("r/lookup", at, start, avail, draw(st.integers(1, 5))))
    return tokens, shadows


@settings(max_examples=300, deadline=None)
@given(case=shadowed())
def test_a_shadow_settles_at_its_first_difference_or_once_every_token_is_known(case):
    """The definition: the continuation's tokens are compared with the target's from ``start``; a shadow
    settles at the first that differs (that many accepted) or when all ``avail`` matched; else it waits."""
    tokens, shadows = case
    done, still = follow_shadows(np.asarray(tokens, dtype=np.int64), shadows)
    want_done, want_open = [], []
    for s in shadows:
        known = tokens[s.start: s.start + s.avail]
        same = next((j for j, (a, b) in enumerate(zip(tokens[s.at: s.at + s.avail], known)) if a != b), None)
        if same is not None:
            want_done.append((s, same))
        elif len(known) == s.avail:
            want_done.append((s, s.avail))
        else:
            want_open.append(s)
    assert done == want_done and still == want_open


def _lookup_controller(adaptive: bool = True) -> DomainController:
    cfg = ControllerConfig(adaptive=adaptive, min_samples=4, window=64, hysteresis=0.0, switch_after=1,
                           calibration_interval=0, warmup_k=5, step_gate=False)
    return DomainController(cfg, {"r/lookup": "lookup"}, {"r/lookup": 5}, capped={"r/lookup"})


def _costs(ctl: DomainController, rows: int, u: float, times: int = 6) -> None:
    """Plain and verifying steps in turn at ``rows`` rows (5 drafts a row): v = u per draft a row; the
    lookup's c next to nothing (its host time)."""
    for _ in range(times):
        ctl.record_step(0.010, rows, 0)
        ctl.record_draft("lookup", rows, 1e-6)
        ctl.record_step(0.010 * (1 + 5 * u), rows, 5 * rows)


def _shadows(ctl: DomainController, times: int = 40) -> None:
    """Matches whose cap allows 1 draft; past it, the whole continuation (5) is right 3 times in 10."""
    for i in range(times):
        ctl.observe_lookup("r/lookup", 5, 5 if i % 10 < 3 else 1, 1)


def test_the_cap_is_lifted_where_verifying_is_cheap_and_kept_where_it_costs():
    """Per bucket: at batch 1 a verified draft costs 0.2% of a step, and the continuation past the cap
    pays; at batch 8 it costs 50%, and one draft (the cap's) is the most that pays."""
    ctl = _lookup_controller()
    _costs(ctl, 1, 0.002)
    _costs(ctl, 8, 0.5)
    _shadows(ctl)
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert not ctl.capped("r/lookup") and ctl.k_for("r/lookup") == 5
    ctl.step(8, {"r/lookup"}, ["r/lookup"] * 8)
    assert ctl.capped("r/lookup")
    by_bucket = ctl.stats()["r/lookup"].costs_by_bucket
    assert by_bucket[1]["cap_lifted"] and not by_bucket[8]["cap_lifted"]
    assert "cap_lifted_at_batch=1;" in ctl.summary()
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert not ctl.capped("r/lookup")  # each bucket keeps its own


def test_the_reported_v_and_speedup_are_those_of_the_drafts_capped_rows_make():
    """Half the matches allow 1 draft (and keep it), half 5 (all kept): at k 5 a capped row drafts 3 on
    average, and the stats read v for 3 drafts (0.3), not 5, as the controller's decision does."""
    ctl = _lookup_controller()
    _costs(ctl, 1, 0.1)
    for i in range(40):
        ctl.observe_lookup("r/lookup", 5, 5 if i % 2 else 1, 5 if i % 2 else 1)
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    stats = ctl.stats()["r/lookup"]
    assert ctl.capped("r/lookup") and stats.k == 5  # the whole continuation: 4 tokens for v(5) = 0.5
    assert stats.verify_overhead == pytest.approx(0.3) and stats.costs_by_bucket[1]["v"] == pytest.approx(0.3)
    assert stats.expected_speedup == pytest.approx(4 / 1.3, rel=1e-3)


def test_a_step_gate_off_verdict_takes_a_lifted_cap_back_for_good_before_drafting_stops():
    """The model lifted the cap at batch 1; the gate then measures that bucket's drafting steps losing:
    the cap comes back there for good, and the gate measures the capped drafts afresh (warm-up) instead
    of switching drafting off. A second off verdict, with the cap back, switches drafting off."""
    from accel_plugin.speculative.step_gate import GateState

    ctl = _lookup_controller()
    ctl.cfg = ctl.cfg.model_copy(update={"step_gate": True})
    ctl.gate.cfg = ctl.cfg
    _costs(ctl, 1, 0.002)
    _shadows(ctl)
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert not ctl.capped("r/lookup") and not ctl.gated
    key = ctl.gate._at((1, frozenset({"r/lookup"})))
    key.state, key.samples = GateState.OFF, type(key.samples)([(1.0, 0.5)] * 4, maxlen=key.samples.maxlen)
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert ctl.capped("r/lookup") and not ctl.gated and ctl.k_for("r/lookup") > 0
    assert ctl.gate.state(1, {"r/lookup"}) == GateState.WARMUP
    assert len(key.samples) == 0 and ctl.stats()["r/lookup"].costs_by_bucket[1]["cap_pinned"]
    _shadows(ctl)
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert ctl.capped("r/lookup")  # pinned: the model does not lift it again here
    key.state = GateState.OFF
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert ctl.gated and ctl.k_for("r/lookup") == 0


def test_the_cap_holds_until_measured_and_under_a_fixed_controller():
    ctl = _lookup_controller()
    ctl.step(1, {"r/lookup"}, ["r/lookup"])
    assert ctl.capped("r/lookup") and ctl.stats()["r/lookup"].state == DomainState.WARMUP
    fixed = _lookup_controller(adaptive=False)
    _costs(fixed, 1, 0.0)
    _shadows(fixed)  # ignored: the fixed controller's window learns from what was drafted
    fixed.observe("r/lookup", 1, 1, 1)
    fixed.step(1, {"r/lookup"}, ["r/lookup"])
    d = fixed._domains["r/lookup"]
    assert fixed.capped("r/lookup") and d.free is None and len(d.window) == 1


def test_both_windows_learn_one_followed_draft():
    """The capped window reads what the cap drafts (and accepts) of a continuation, the free one all of it
    (at most k_max), unless the uncapped policy would not have drafted there; the live observation then
    counts only towards the counters."""
    ctl = _lookup_controller()
    ctl.observe_lookup("r/lookup", 7, 4, 2)  # 7 tokens after the match (k_max 5), 4 right, the cap 2
    ctl.observe_lookup("r/lookup", 3, 1, 2, free=False)  # a step inside the last one's kept tokens
    ctl.observe("r/lookup", 2, 2, 2)
    d = ctl._domains["r/lookup"]
    assert list(d.window._obs) == [(2, 2, 2), (2, 1, 2)] and list(d.free._obs) == [(5, 4, 5)]
    assert (d.drafted, d.accepted, d.steps) == (2, 2, 1)


@pytest.mark.parametrize("free_now, capped, free, want", [
    (False, [1, 2.0], [1, 2.01], False),  # within the margin: stays capped
    (False, [1, 2.0], [1, 1.5, 2.05], True),
    (True, [1, 2.01], [1, 2.0], True),  # within the margin: stays lifted
    (True, [1, 2.05], [1, 2.0], False),
])
def test_lift_cap_switches_only_beyond_the_margin(free_now, capped, free, want):
    assert lift_cap(free_now, capped, free, 0.01) is want


YAML = """
    num_speculative_tokens: 5
    domains:
      repeat:
        lookup: {min: 1, max: 4, occurrence: latest, spec_factor: 1}
        match: {keywords: [rewrite]}
    controller: {step_gate: false%s}
"""


def _windows_by_definition(drafts: list[tuple[np.ndarray, int, int, int]], last: np.ndarray):
    """What a capped lookup's windows read from one request's followed drafts, ``(context at the draft,
    match position, avail, cap)`` in order, its tokens last seen being ``last``: ``(capped, free)``
    observations. The capped window reads each draft that settles; the free one those of the steps the
    uncapped policy would have made: the first, then the first at or after the last such one's start +
    its kept tokens + 1, once that one has settled (at the time of the draft)."""
    capped, free, free_from, pending = [], [], 0, None
    for context, at, avail, cap in drafts:
        if pending is not None and (done := follow_shadows(context, [pending])[0]):
            free_from, pending = pending.start + done[0][1] + 1, None
        shadow = Shadow("r", at, len(context), avail, cap)
        is_free = pending is None and len(context) >= free_from
        pending = shadow if is_free else pending
        done, _ = follow_shadows(last, [shadow])
        if done:
            capped.append((min(cap, avail), min(done[0][1], cap, avail), min(cap, avail)))
            free += [(avail, done[0][1], avail)] if is_free else []
    return capped, free


PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


@st.composite
def copying_answers(draw):
    """An answer made of runs copied from ``PROMPT`` and of tokens it does not hold."""
    answer, fresh = [], iter(range(30, 100))
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            at = draw(st.integers(0, len(PROMPT) - 1))
            answer += PROMPT[at: at + draw(st.integers(1, len(PROMPT) - at))]
        else:
            answer.append(next(fresh))
    return [next(fresh)] + answer


def _decode_with_lookup(answer: list[int]):
    """``answer`` decoded after ``PROMPT`` as the proposer drafts it with a capped lookup (``match_rows``,
    ``PromptLookup.draft`` at the controller's k, then the kept drafts and one more token, ``follow``):
    the controller, the request's drafts (as :func:`_windows_by_definition` takes them) and its state."""
    from accel_plugin.speculative.draft_config.schema import LookupConfig
    from accel_plugin.speculative.lookup import PromptLookup
    from accel_plugin.speculative.request_states import RequestState

    ctl = _lookup_controller()
    lookup = PromptLookup({"r": LookupConfig(min=1, max=4, occurrence="latest", spec_factor=1)}, {"r": 5})
    state, done, drafts = RequestState.start("r", np.asarray(PROMPT + answer[:1])), 1, []
    while done < len(answer):
        hits = lookup.match_rows([(0, state)])
        made = lookup.draft(state, hits[0], ctl, 1000) if 0 in hits else []
        if made:
            drafts.append((state.context.copy(), hits[0][0], state.shadows[-1].avail, hits[0][1]))
        kept = next((j for j, (a, b) in enumerate(zip(made, answer[done:])) if a != b), len(made))
        kept = min(kept, len(answer) - done - 1)
        state.extend(np.asarray(answer[done: done + kept + 1]))
        done += kept + 1
        lookup.follow(state, ctl.observe_lookup)
    return ctl, drafts, state


@settings(max_examples=200, deadline=None)
@given(answer=copying_answers())
def test_the_free_window_reads_only_the_steps_the_uncapped_policy_would_make(answer):
    """A request whose answer copies its prompt in runs: the capped window reads every capped draft, the
    whole continuations' window only the steps the uncapped policy would have made, as the definition
    says (a run of right tokens is drafted over several capped steps, and would go in one uncapped)."""
    ctl, drafts, state = _decode_with_lookup(answer)
    d = ctl._domains["r/lookup"]
    capped, free = _windows_by_definition(drafts, state.context)
    assert list(d.window._obs) == capped and list(d.free._obs) == free


def test_a_copied_run_is_one_uncapped_step_and_several_capped_ones():
    ctl, drafts, state = _decode_with_lookup([30, 1, 2, 3, 4, 5, 6, 7, 40, 8, 9, 10, 11, 12, 41, 5, 6, 7, 8, 42])
    d = ctl._domains["r/lookup"]
    assert len(d.free._obs) < len(d.window._obs) and max(n for _, n, _ in d.free._obs) == 5


def test_followed_drafts_tell_the_controller_what_the_target_produced(make_config, tokenizer, target):
    """Served in the proposer (the target's tokens rarely copy here: few skips): the windows hold what
    the definition says, for every capped lookup draft the request's tokens (as the proposer last saw
    them) settle, with its length (k_max at most) and how many of its tokens the target produced;
    outputs stay the target's."""
    proposer, requests, trace = _served(make_config, tokenizer, target, YAML % "", REPEAT, ["repeat"] * 2,
                                        max_tokens=40)
    v = _verifier()
    last = {id(p.request): np.asarray(p.context, dtype=np.int64) for p in trace.proposals}
    drafts: dict[int, list] = {}
    for p in trace.proposals:
        if p.drafts:
            at, n = brute_force_match(p.context, 1, 4, "latest")
            avail = min(len(p.context) - at, v.MAX_LEN - len(p.context), 5)
            drafts.setdefault(id(p.request), []).append((np.asarray(p.context, dtype=np.int64), at, avail, n))
    want_capped, want_free = [], []
    for key, made in drafts.items():
        capped, free = _windows_by_definition(made, last[key])
        want_capped, want_free = want_capped + capped, want_free + free
    d = proposer.controller._domains["repeat/lookup"]
    assert 8 <= len(want_free) <= 64 and len({n for _, n, _ in want_free}) > 1, want_free  # in the window; varied
    assert len(want_capped) <= 64 and sorted(d.free._obs) == sorted(want_free)
    assert sorted(d.window._obs) == sorted(want_capped)


def test_a_lifted_cap_drafts_the_whole_continuation(make_config, tokenizer, target):
    """Where the controller lifted the cap, a row drafts k tokens of its match's continuation, as without
    ``spec_factor``; the outputs stay the target's (checked by ``_served``)."""
    from accel_plugin.speculative import DomainProposer

    v = _verifier()
    config = make_config(YAML % ", min_samples: 1000, window: 1000")  # never decided: the choice below holds
    proposer = DomainProposer(config, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                              max_len=v.MAX_LEN)
    proposer.controller._domains["repeat/lookup"].choices[1] = Choice(DomainState.ON, 5, free=True)
    requests = [v.Request(tokenizer(t).input_ids, 30, "repeat") for t in REPEAT[:1]]
    trace = v.serve(proposer, target, requests)
    v.assert_lossless(target, requests)
    longer = 0
    for p in trace.proposals:
        if p.sampled and p.drafts:
            k = min(5, v.MAX_LEN - len(p.context))
            assert p.drafts == brute_force(p.context, 1, 4, k, "latest"), (p.context, p.drafts)
            longer += len(p.drafts) > len(brute_force(p.context, 1, 4, k, "latest", spec_factor=1))
    assert longer > 0
