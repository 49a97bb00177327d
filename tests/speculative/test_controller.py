"""The acceptance controller against the speedup formula; probing; failure."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.config import ControllerConfig
from accel_plugin.speculative.controller import (
    AcceptanceWindow,
    DomainController,
    DomainState,
    best_k,
    expected_speedup,
    expected_tokens,
)


def reference_speedup(alpha, k, c):
    """The formula as written in the issue, summed term by term."""
    return sum(alpha**i for i in range(k + 1)) / (k * c + 1)


@given(st.floats(0, 1), st.integers(0, 12), st.floats(0, 2))
def test_expected_speedup_matches_formula(alpha, k, c):
    assert expected_speedup(alpha, k, c) == pytest.approx(reference_speedup(alpha, k, c), rel=1e-9, abs=1e-12)
    if alpha < 1:
        closed = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
        assert expected_speedup(alpha, k, c) == pytest.approx(closed, rel=1e-9)


def test_known_values():
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.0, 4) == 1
    assert expected_speedup(0.8, 3, 0.1) == pytest.approx((1 - 0.8**4) / (0.2 * 1.3))
    assert expected_speedup(0.5, 0, 0.3) == 1.0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.5, 2)
    with pytest.raises(ValueError, match="k must be"):
        expected_tokens(0.5, -1)
    with pytest.raises(ValueError, match="c must be"):
        expected_speedup(0.5, 1, -0.1)


@given(st.floats(0, 1), st.floats(0.001, 2), st.integers(1, 10))
def test_best_k_is_the_argmax(alpha, c, k_max):
    k, s = best_k(alpha, c, k_max)
    values = {j: reference_speedup(alpha, j, c) for j in range(1, k_max + 1)}
    if k == 0:
        assert all(v <= 1.0 + 1e-9 for v in values.values())
        assert s == 1.0
    else:
        assert s == pytest.approx(max(values.values()), rel=1e-9)
        assert s > 1.0


def test_break_even():
    # alpha = c: S(k=1) = (1 + c) / (1 + c) = 1 -> not worth it
    assert best_k(0.3, 0.3, 5) == (0, 1.0)
    assert best_k(0.31, 0.3, 5)[0] >= 1
    assert best_k(0.9, 0.05, 8)[0] == 8
    assert best_k(0.6, 0.5, 5, min_speedup=1.2) == (0, 1.0)


def test_window_alpha_is_accepted_over_tested_positions():
    w = AcceptanceWindow(size=10, k_max=4)
    w.add(4, 4)  # 4 tested, 4 accepted
    w.add(4, 1)  # positions 1, 2 tested; 1 accepted
    w.add(2, 0)  # position 1 tested
    assert w.tested == 4 + 2 + 1 and w.accepted == 5
    assert w.alpha == pytest.approx(5 / 7)
    assert w.per_position() == [pytest.approx(2 / 3), 1 / 2, 1.0, 1.0]
    with pytest.raises(ValueError):
        w.add(2, 3)


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5)), max_size=60), st.integers(1, 20))
def test_window_sums_equal_recomputation(observations, size):
    w = AcceptanceWindow(size=size, k_max=5)
    kept = []
    for k, n in observations:
        n = min(n, k)
        w.add(k, n)
        kept = (kept + [(k, n)])[-size:]
    assert len(w) == len(kept)
    assert w.accepted == sum(n for _, n in kept)
    assert w.tested == sum(min(n + 1, k) for k, n in kept)
    assert w.drafted == sum(k for k, _ in kept)


@settings(max_examples=20, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(1, 6))
def test_window_estimate_recovers_alpha(alpha, k):
    """Feeding the expected geometric counts gives back alpha exactly."""
    w = AcceptanceWindow(size=10**6, k_max=k)
    # P(n accepted) = alpha^n (1 - alpha) for n < k, alpha^k for n = k; scaled to 10^6 draws
    for n in range(k + 1):
        p = alpha**n * (1 - alpha) if n < k else alpha**k
        for _ in range(round(p * 2000)):
            w.add(k, n)
    assert w.alpha == pytest.approx(alpha, abs=0.01)


def controller(adaptive=True, k_max=4, **kw):
    cfg = ControllerConfig(adaptive=adaptive, min_samples=4, window=64, probe_interval=5, **kw)
    return DomainController(cfg, {"a": "/draft", "none": None}, {"a": k_max, "none": k_max})


def feed(ctl, domain, k, n, times=10):
    for _ in range(times):
        ctl.observe(domain, k, n)


def test_warmup_then_choice_follows_formula():
    ctl = controller()
    ctl.step()
    assert ctl.k_for("a") == 4 and ctl.stats()["a"].state == DomainState.WARMUP
    ctl.record_draft_time("/draft", 0.001)
    ctl.record_target_time(0.010)  # c = 0.1
    feed(ctl, "a", 4, 2)  # tested 3, accepted 2 -> alpha = 2/3
    ctl.step()
    alpha = 2 / 3
    expect_k, _ = best_k(alpha, 0.1, 4)
    assert ctl.k_for("a") == expect_k
    s = ctl.stats()["a"]
    assert s.state == DomainState.ON and s.alpha == pytest.approx(alpha) and s.cost_ratio == pytest.approx(0.1)
    assert s.drafted == 40 and s.accepted == 20 and s.steps == 10


def test_domain_without_draft_never_drafts():
    ctl = controller()
    ctl.step()
    assert ctl.k_for("none") == 0 and ctl.stats()["none"].state == DomainState.NO_DRAFT


def test_poor_draft_is_switched_off_and_probed():
    ctl = controller()
    ctl.record_draft_time("/draft", 0.002)
    ctl.record_target_time(0.010)  # c = 0.2
    feed(ctl, "a", 4, 0)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.OFF
    ks = []
    for _ in range(10):
        ks.append(ctl.k_for("a"))
        ctl.end_step({"a"})
        ctl.step()
    assert ks == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1]  # one probe every probe_interval=5 steps


def test_off_domain_recovers_when_acceptance_improves():
    ctl = controller()
    ctl.record_draft_time("/draft", 0.001)
    ctl.record_target_time(0.010)
    feed(ctl, "a", 4, 0, times=8)
    ctl.step()
    assert ctl.k_for("a") == 0
    feed(ctl, "a", 1, 1, times=64)  # probes all accepted; the window forgets the bad past
    ctl.step()
    assert ctl.k_for("a") == 4 and ctl.stats()["a"].state == DomainState.ON


def test_steps_of_other_domains_do_not_count_towards_probes():
    ctl = controller()
    ctl.record_draft_time("/draft", 0.002)
    ctl.record_target_time(0.010)
    feed(ctl, "a", 4, 0)
    ctl.step()
    for _ in range(20):
        ctl.end_step({"none"})
    assert ctl.k_for("a") == 0


def test_min_acceptance_overrides_formula():
    ctl = controller(min_acceptance=0.8)
    ctl.record_draft_time("/draft", 0.0001)
    ctl.record_target_time(0.010)
    feed(ctl, "a", 4, 2)  # alpha 2/3 would pay at c = 0.01
    ctl.step()
    assert ctl.k_for("a") == 0


def test_fixed_k_when_not_adaptive():
    ctl = controller(adaptive=False)
    ctl.record_draft_time("/draft", 0.005)
    ctl.record_target_time(0.010)
    feed(ctl, "a", 4, 0, times=50)
    ctl.step()
    assert ctl.k_for("a") == 4 and ctl.stats()["a"].state == DomainState.FIXED


def test_configured_draft_cost_replaces_measurement():
    ctl = controller(draft_cost=0.05)
    assert ctl.cost_ratio("a") == 0.05
    feed(ctl, "a", 4, 3)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.ON


def test_target_time_is_a_median_robust_to_idle_gaps():
    ctl = controller()
    ctl.record_draft_time("/draft", 0.001)
    for t in [0.01] * 10 + [5.0]:
        ctl.record_target_time(t)
    assert ctl.cost_ratio("a") == pytest.approx(0.1)


def test_failure_switches_domain_off_for_good():
    ctl = controller()
    assert ctl.fail("/draft", "RuntimeError: boom") == ["a"]
    feed(ctl, "a", 1, 1, times=100)
    ctl.step()
    s = ctl.stats()["a"]
    assert ctl.k_for("a") == 0 and s.state == DomainState.FAILED and "boom" in s.error
    assert ctl.fail("/draft", "again") == []


def test_summary_mentions_each_domain():
    ctl = controller()
    text = ctl.summary()
    assert "a: state=warmup k=4/4" in text and "none: state=no-draft" in text


def test_stats_rates():
    ctl = controller()
    feed(ctl, "a", 4, 2, times=3)
    s = ctl.stats()["a"]
    assert s.acceptance_rate == 0.5 and s.mean_acceptance_length == 3.0
    assert not math.isnan(s.alpha)


@given(st.floats(0, 1), st.integers(1, 12), st.floats(0, 2), st.floats(0, 2))
def test_verify_overhead_adds_to_the_denominator(alpha, k, c, v):
    assert expected_speedup(alpha, k, c, v) == pytest.approx(
        sum(alpha**i for i in range(k + 1)) / (k * c + 1 + v), rel=1e-9, abs=1e-12)
    assert expected_speedup(alpha, 0, c, v) == 1.0  # k = 0 verifies nothing
    with pytest.raises(ValueError, match="overhead"):
        expected_speedup(alpha, k, c, -0.1)


def test_break_even_moves_up_by_the_verify_overhead():
    # k = 1: S = (1 + a) / (1 + c + v) -> break-even at a = c + v
    assert best_k(0.1, 0.05, 5)[0] == 1
    assert best_k(0.1, 0.05, 5, overhead=0.1) == (0, 1.0)
    assert best_k(0.2, 0.05, 5, overhead=0.1)[0] >= 1


def test_verify_overhead_is_measured_at_equal_batch_sizes():
    ctl = controller()
    assert ctl.verify_overhead() == 0.0  # nothing measured yet
    for _ in range(5):
        ctl.record_target_time(0.010, k=0, rows=1)
        ctl.record_target_time(0.030, k=0, rows=8)
        ctl.record_target_time(0.013, k=1, rows=1)
    assert ctl.verify_overhead() == pytest.approx(0.3)
    # verifying steps only at a batch size with no plain steps: nothing to compare with
    ctl = controller()
    for _ in range(5):
        ctl.record_target_time(0.010, k=0, rows=1)
        ctl.record_target_time(0.030, k=1, rows=8)
    assert ctl.verify_overhead() == 0.0
    # c uses plain steps: a verifying step is not the unit of the formula
    ctl.record_draft_time("/draft", 0.001)
    assert ctl.cost_ratio("a") == pytest.approx(0.1)


def test_measured_verify_overhead_keeps_a_marginal_draft_off():
    ctl = controller()
    ctl.record_draft_time("/draft", 0.0005)  # c = 0.05
    for _ in range(5):
        ctl.record_target_time(0.010, k=0, rows=1)
    feed(ctl, "a", 1, 0, times=9)
    feed(ctl, "a", 1, 1, times=1)  # alpha 0.1 > c: worth it if verifying were free
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.ON and ctl.k_for("a") == 1
    for _ in range(5):
        ctl.record_target_time(0.012, k=1, rows=1)  # v = 0.2
    ctl.step()
    s = ctl.stats()["a"]
    assert s.state == DomainState.OFF and s.verify_overhead == pytest.approx(0.2)
    assert s.verify_step_ms == pytest.approx(12.0) and s.target_step_ms == pytest.approx(10.0)


def test_configured_verify_overhead_replaces_measurement():
    ctl = controller(verify_overhead=0.5)
    for _ in range(5):
        ctl.record_target_time(0.010, k=0, rows=1)
        ctl.record_target_time(0.010, k=1, rows=1)
    assert ctl.verify_overhead() == 0.5


def test_an_off_domain_probes_with_one_request_per_step():
    ctl = controller()
    ctl.record_draft_time("/draft", 0.002)
    ctl.record_target_time(0.010)
    feed(ctl, "a", 4, 0)
    ctl.step()
    per_step = []
    for _ in range(5):  # probe_interval = 5
        per_step.append([ctl.k_for("a") for _ in range(3)])  # three requests of "a" in the batch
        ctl.end_step({"a"})
        ctl.step()
    assert per_step == [[0, 0, 0]] * 4 + [[1, 0, 0]]


def test_verify_overhead_is_kept_per_k():
    """Verifying more drafts costs more on some hardware: v(k) comes from steps that
    verified k drafts, or the nearest k that was measured."""
    ctl = controller()
    for _ in range(5):
        ctl.record_target_time(0.010, k=0, rows=1)
        ctl.record_target_time(0.011, k=1, rows=1)
        ctl.record_target_time(0.015, k=4, rows=1)
    assert ctl.verify_overhead(1) == pytest.approx(0.1)
    assert ctl.verify_overhead(4) == pytest.approx(0.5)
    assert ctl.verify_overhead(2) == pytest.approx(0.1)  # nearest measured k (ties: the smaller)
    assert ctl.verify_overhead(3) == pytest.approx(0.5)
    # best_k takes v per k: cheap verification up to k = 2 makes 2 the best here,
    # where one v for every k (the k = 4 figure) would have chosen k = 4
    assert best_k(0.5, 0.01, 4, overhead=ctl.verify_overhead)[0] == 2
    assert best_k(0.5, 0.01, 4, overhead=0.5)[0] == 4
