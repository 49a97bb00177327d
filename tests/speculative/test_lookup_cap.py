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
    (at most k_max); the live observation then counts only towards the counters."""
    ctl = _lookup_controller()
    ctl.observe_lookup("r/lookup", 7, 4, 2)  # 7 tokens after the match (k_max 5), 4 right, the cap 2
    ctl.observe("r/lookup", 2, 2, 2)
    d = ctl._domains["r/lookup"]
    assert list(d.window._obs) == [(2, 2, 2)] and list(d.free._obs) == [(5, 4, 5)]
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


def test_followed_drafts_tell_the_controller_what_the_target_produced(make_config, tokenizer, target):
    """Served in the proposer: the free window holds, for every capped lookup draft whose continuation
    the request's tokens (as the proposer last saw them) settle, its length (k_max at most) and how many
    of its tokens the target produced; outputs stay the target's."""
    proposer, requests, trace = _served(make_config, tokenizer, target, YAML % "", REPEAT, ["repeat"] * 2,
                                        max_tokens=40)
    v = _verifier()
    last = {id(p.request): p.context for p in trace.proposals}
    want = []
    for p in trace.proposals:
        if p.drafts:
            at = brute_force_match(p.context, 1, 4, "latest")[0]
            avail = min(len(p.context) - at, v.MAX_LEN - len(p.context), 5)
            shadow = Shadow("repeat/lookup", at, len(p.context), avail, 1)
            done, _ = follow_shadows(np.asarray(last[id(p.request)], dtype=np.int64), [shadow])
            want += [(avail, done[0][1], avail)] if done else []
    free = proposer.controller._domains["repeat/lookup"].free
    assert 8 <= len(want) <= 64 and len({n for _, n, _ in want}) > 1, want  # within the window; varied
    assert sorted(free._obs) == sorted(want)


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
