"""Drafts capped per row (prompt lookup's ``spec_factor``): the offer profile of the speedup model,
the acceptance window that measures it, and the controller's k read from it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.speculative.acceptance import AcceptanceWindow
from accel_plugin.speculative.controller import DomainController
from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative.speedup import (
    OfferProfile, best_k, expected_drafts, expected_speedup, expected_tokens, speedup_curve,
)
from accel_plugin.speculative.step_model import step_speedup


def test_an_offer_profile_gains_and_costs_only_in_the_rows_offered_that_far():
    # every row drafts 1; a third is offered 3 and copies them all
    p = OfferProfile(reach=(1.0, 1 / 3, 1 / 3), accept=(0.5, 1.0, 1.0))
    assert [expected_tokens(p, k) for k in range(4)] == pytest.approx([1, 1.5, 1.5 + 1 / 3, 1.5 + 2 / 3])
    assert [expected_drafts(p, k) for k in range(5)] == pytest.approx([0, 1, 4 / 3, 5 / 3, 5 / 3])
    assert expected_drafts([0.5, 0.5], 3) == 3  # uncapped: k drafts
    assert expected_speedup(p, 3, 0.01, 0.2) == pytest.approx((1.5 + 2 / 3) / (5 / 3 * 0.01 + 1.2))
    assert expected_speedup(p, 0, 0.01, 0.2) == 1.0
    curve = speedup_curve(p, 4, 0.01, lambda drafts: 0.1 * drafts)
    assert curve == pytest.approx([1.0] + [expected_speedup(p, k, 0.01, 0.1 * expected_drafts(p, k))
                                           for k in range(1, 5)])
    with pytest.raises(ValueError, match="one value per draft position"):
        OfferProfile(reach=(1.0,), accept=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        OfferProfile(reach=(1.0, 1.2), accept=(0.5, 0.5))
    with pytest.raises(ValueError, match="overhead"):
        speedup_curve(p, 2, 0.01, lambda drafts: -1.0)


observations = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=80)


@given(observations)
def test_with_every_row_offered_k_max_the_profile_is_the_per_position_model(obs):
    capped, plain = AcceptanceWindow(64, 5), AcceptanceWindow(64, 5)
    for k, n, _ in obs:
        plain.add(k, min(n, k))
        capped.add(k, min(n, k), 5)
    rates, profile = plain.positions(), capped.profile()
    assert isinstance(profile, OfferProfile) and profile.reach == (1.0,) * 5
    for k in range(6):
        assert expected_tokens(profile, k) == pytest.approx(expected_tokens(rates, k))
    assert speedup_curve(profile, 5, 0.02, lambda d: 0.1 * d) == pytest.approx(speedup_curve(rates, 5, 0.02,
                                                                                           lambda d: 0.1 * d))


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5)), min_size=1, max_size=80))
def test_the_profile_of_rows_that_drafted_their_whole_offer_is_the_brute_force_mean(rows):
    """Rows that drafted their whole offer ``o`` and had ``n`` accepted: at any k a row would draft
    ``min(k, o)`` and keep ``min(k, n)``; unshrunk (weight 0), the profile gives exactly those means."""
    w = AcceptanceWindow(1000, 5)
    rows = [(o, min(n, o)) for o, n in rows]
    for o, n in rows:
        w.add(o, n, o)
    profile = w.profile(weight=0.0)
    for k in range(6):
        assert expected_tokens(profile, k) == pytest.approx(1 + sum(min(k, n) for _, n in rows) / len(rows))
        assert expected_drafts(profile, k) == pytest.approx(sum(min(k, o) for o, _ in rows) / len(rows))


def test_the_window_forgets_an_observations_offer_with_it():
    w = AcceptanceWindow(2, 5)
    w.add(1, 0, 1)
    w.add(3, 3, 4)
    w.add(2, 1, 2)
    assert w.offered == [0, 1, 0, 1, 0] and w.offer_tested[0] == [0] * 5
    assert w.offer_tested[3] == [1, 1, 1, 0, 0] and w.offer_accepted[3] == [1, 1, 1, 0, 0]
    w.add(1, 1, 9)  # an offer past k_max is k_max; one below k is k
    w.add(2, 0, 1)
    assert w.offered == [0, 1, 0, 0, 1] and len(w) == 2
    assert AcceptanceWindow(4, 3).profile() is None


def test_long_matches_read_by_their_own_acceptance_let_the_controller_draft_them():
    """A lookup whose 1-token matches (most rows) rarely hit and whose long matches copy: pooled,
    every position reads like the first and k stays 1; by offers, the long matches draft 5."""
    def decided(offers: bool) -> int:
        cfg = ControllerConfig(min_samples=4, window=256, hysteresis=0.0, switch_after=1, calibration_interval=0,
                               draft_cost=0.001, step_gate=False)
        ctl = DomainController(cfg, {"a": "lookup"}, {"a": 5})
        for _ in range(3):  # v = 0.15 per draft
            ctl.record_step(0.0115, 1, 1)
            ctl.record_step(0.010, 1, 0)
        for i in range(100):
            long = i % 10 < 3
            ctl.observe("a", 1, 1 if long or i % 10 == 3 else 0, (5 if long else 1) if offers else None)
        ctl.step()
        return ctl.k_for("a")

    assert decided(offers=False) == 1
    assert decided(offers=True) == 5
    # the same by hand: reach 1, .3, .3, .3, .3; the first position 0.4 over all rows, every long one copies
    profile = OfferProfile((1.0, 0.3, 0.3, 0.3, 0.3), (0.4, 0.3 / 0.3, 1.0, 1.0, 1.0))
    assert best_k(profile, 0.001, 5, overhead=lambda d: 0.15 * d)[0] == 5
    assert best_k([0.4] * 5, 0.001, 5, overhead=lambda d: 0.15 * d)[0] == 1


def test_the_step_model_charges_a_capped_entry_its_offered_drafts():
    p = OfferProfile((1.0, 0.25, 0.25), (0.5, 0.25, 0.25))
    args = dict(counts={"a": 4}, costs={"a": 0.0}, draft_of={"a": "lookup"}, verify=lambda d: 0.2 * d, host=0.0)
    assert step_speedup(4, {"a": 3}, alphas={"a": p}, **args) == pytest.approx(
        expected_tokens(p, 3) / (1 + 0.2 * expected_drafts(p, 3)))
    assert step_speedup(4, {"a": 3}, alphas={"a": [0.5, 0.5, 0.5]}, **args) == pytest.approx(
        expected_tokens([0.5] * 3, 3) / (1 + 0.2 * 3))
