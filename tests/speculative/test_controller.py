"""The speedup model (:mod:`.speedup`), the acceptance window, and the controller's
decisions: warm-up, per batch bucket, hysteresis, calibration steps, probing,
failure. Paired timings: test_costs.py; whole traces with slow and fast spells:
test_controller_traces.py."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative import controller as controller_module
from accel_plugin.speculative.acceptance import AcceptanceWindow
from accel_plugin.speculative.controller import DomainController
from accel_plugin.speculative.domain_stats import DomainState
from accel_plugin.speculative.speedup import best_k, expected_speedup, expected_tokens, speedup_curve


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


@given(st.floats(0, 1), st.integers(0, 8), st.integers(1, 6))
def test_per_position_acceptance_equal_everywhere_is_the_closed_form(alpha, k, length):
    assert expected_tokens([alpha] * length, k) == pytest.approx(expected_tokens(alpha, k), rel=1e-9)


def test_per_position_acceptance_values_long_drafts_that_copy():
    # the first position half the time, every later one given it: all accepted
    assert expected_tokens([0.5, 1.0], 4) == pytest.approx(1 + 0.5 * 4)
    assert expected_tokens([0.5, 0.8, 0.2], 3) == pytest.approx(1 + 0.5 + 0.4 + 0.08)
    # one pooled alpha (accepted / tested = 2 / 3 for such a draft at k = 4) undervalues it
    assert expected_tokens(2 / 3, 4) < expected_tokens([0.5, 1.0], 4)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens([0.5, 1.2], 2)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens([], 2)


def test_window_positions_shrink_towards_the_position_before():
    w = AcceptanceWindow(size=100, k_max=3)
    assert w.positions() is None
    for _ in range(16):
        w.add(2, 2)  # positions 1 and 2 always accepted; 3 never drafted
    assert w.alpha == 1.0 and w.positions() == [1.0, 1.0, 1.0]
    for _ in range(16):
        w.add(2, 0)  # now position 1 half the time
    a = w.alpha
    a1 = (16 + 16 * a) / (32 + 16)
    a2 = (16 + 16 * a1) / (16 + 16)
    assert w.positions() == pytest.approx([a1, a2, a2])  # untested: like the one before
    assert w.positions(weight=1e12) == pytest.approx([a] * 3)  # infinite weight: the pooled alpha


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


@given(st.lists(st.floats(0, 1), min_size=1, max_size=6), st.integers(0, 8), st.floats(0, 2), st.floats(0, 0.5))
def test_the_one_pass_curve_is_expected_speedup_at_every_k(rates, k_max, c, u):
    curve = speedup_curve(rates, k_max, c, lambda k: u * k)
    assert len(curve) == k_max + 1
    for k, s in enumerate(curve):
        assert s == pytest.approx(expected_speedup(rates, k, c, u * k), rel=1e-9, abs=1e-12)
    assert speedup_curve(rates[0], k_max, c, u) == pytest.approx(
        [expected_speedup(rates[0], k, c, u if k else 0.0) for k in range(k_max + 1)], rel=1e-9)


def test_the_curve_rejects_what_expected_speedup_rejects():
    for args, match in (((1.5, 2, 0.1), "alpha"), (([], 2, 0.1), "alpha"), ((0.5, 2, -0.1), "c must be"),
                        ((0.5, -1, 0.1), "k_max must be")):
        with pytest.raises(ValueError, match=match):
            speedup_curve(*args)
    with pytest.raises(ValueError, match="overhead must be"):
        speedup_curve(0.5, 2, 0.1, -0.2)


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


def test_the_controller_module_still_exports_the_math():
    assert controller_module.best_k is best_k
    assert controller_module.expected_speedup is expected_speedup
    assert controller_module.expected_tokens is expected_tokens


# ------------------------------------------------------------------ the controller

def controller(adaptive=True, k_max=4, target_bytes=None, **kw):
    """Decisions without hysteresis or calibration unless a test asks for them."""
    kw = {"hysteresis": 0.0, "switch_after": 1, "calibration_interval": 0, "warmup_k": k_max, **kw}
    cfg = ControllerConfig(adaptive=adaptive, min_samples=4, window=64, probe_interval=5, **kw)
    return DomainController(cfg, {"a": "/draft", "none": None}, {"a": k_max, "none": k_max},
                            target_bytes=target_bytes)


def test_warmup_drafts_warmup_k_by_default():
    """A domain not yet measured drafts controller.warmup_k (2), at most its k_max."""
    cfg = ControllerConfig(min_samples=4, window=64)
    ctl = DomainController(cfg, {"a": "/draft", "b": "/draft"}, {"a": 5, "b": 1})
    ctl.step()
    assert (ctl.k_for("a"), ctl.k_for("b")) == (2, 1)
    assert ctl.stats()["a"].state == DomainState.WARMUP


def feed(ctl, domain, k, n, times=10):
    for _ in range(times):
        ctl.observe(domain, k, n)


def paired(ctl, draft_s, step_s, *, times=5):
    """``times`` calls that draft (``draft_s`` per forward), each followed by the target
    step that verifies the drafts (``step_s``): c = draft_s / step_s while v is unknown."""
    for _ in range(times):
        ctl.record_draft("/draft", 1, draft_s)
        ctl.record_step(step_s, 1, 1)


def test_warmup_then_choice_follows_formula():
    ctl = controller()
    ctl.step()
    assert ctl.k_for("a") == 4 and ctl.stats()["a"].state == DomainState.WARMUP
    paired(ctl, 0.001, 0.010)  # c = 0.1 (nothing known of v: 0)
    feed(ctl, "a", 4, 2)  # tested 3, accepted 2 -> alpha = 2/3
    ctl.step()
    alpha = 2 / 3
    # per position: 1, 1, 0 and untested, each shrunk towards the one before (the first towards alpha)
    a1 = (10 + 16 * alpha) / 26
    a2 = (10 + 16 * a1) / 26
    a3 = (0 + 16 * a2) / 26
    expect_k, _ = best_k([a1, a2, a3, a3], 0.1, 4)
    assert expect_k == 3 and best_k(alpha, 0.1, 4)[0] == 4  # where one pooled alpha would draft 4
    assert ctl.k_for("a") == expect_k
    s = ctl.stats()["a"]
    assert s.state == DomainState.ON and s.alpha == pytest.approx(alpha) and s.cost_ratio == pytest.approx(0.1)
    assert s.drafted == 40 and s.accepted == 20 and s.steps == 10
    assert s.draft_forward_ms == pytest.approx(1.0) and s.verify_step_ms == pytest.approx(10.0)
    assert s.bucket == 1 and s.by_bucket == {1: (DomainState.ON, expect_k)}


def test_a_step_decides_only_the_entries_it_is_given():
    """Per step only the domains of its requests are re-decided (host work per step does not
    grow with the domains configured); an entry named in ``domains`` (a matched row's lookup
    entry) is decided even where no row counts under it."""
    cfg = ControllerConfig(min_samples=4, window=64, hysteresis=0.0, switch_after=1, calibration_interval=0)
    ctl = DomainController(cfg, {"a": "/draft", "b": "/draft"}, {"a": 4, "b": 4})
    paired(ctl, 0.001, 0.010)
    feed(ctl, "a", 4, 4)
    feed(ctl, "b", 4, 4)
    ctl.step(1, {"a"}, ["a"])
    assert ctl.stats()["a"].state == DomainState.ON and ctl.stats()["b"].state == DomainState.WARMUP
    ctl.step(1, {"a", "b"}, ["a"])  # b seen (its lookup matched, say) though its row counts under a
    assert ctl.stats()["b"].state == DomainState.ON
    ctl.step()  # no domains given: all
    assert ctl.stats()["b"].by_bucket == {1: (DomainState.ON, 4)}


def test_domain_without_draft_never_drafts():
    ctl = controller()
    ctl.step()
    assert ctl.k_for("none") == 0 and ctl.stats()["none"].state == DomainState.NO_DRAFT


def test_warmup_waits_for_a_measured_cost():
    ctl = controller()
    feed(ctl, "a", 4, 0)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.WARMUP  # acceptance known, c not
    paired(ctl, 0.002, 0.010, times=2)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.WARMUP  # fewer pairs than a median needs
    paired(ctl, 0.002, 0.010, times=1)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.OFF


def test_poor_draft_is_switched_off_and_probed():
    ctl = controller()
    paired(ctl, 0.002, 0.010)  # c = 0.2
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
    paired(ctl, 0.001, 0.010)
    feed(ctl, "a", 4, 0, times=8)
    ctl.step()
    assert ctl.k_for("a") == 0
    feed(ctl, "a", 1, 1, times=64)  # probes all accepted; the window forgets the bad past
    ctl.step()
    assert ctl.k_for("a") == 4 and ctl.stats()["a"].state == DomainState.ON
    assert ctl.stats()["a"].switches == 1


def test_steps_of_other_domains_do_not_count_towards_probes():
    ctl = controller()
    paired(ctl, 0.002, 0.010)
    feed(ctl, "a", 4, 0)
    ctl.step()
    for _ in range(20):
        ctl.end_step({"none"})
    assert ctl.k_for("a") == 0


def test_min_acceptance_overrides_formula():
    ctl = controller(min_acceptance=0.8)
    paired(ctl, 0.0001, 0.010)
    feed(ctl, "a", 4, 2)  # alpha 2/3 would pay at c = 0.01
    ctl.step()
    assert ctl.k_for("a") == 0


def test_fixed_k_when_not_adaptive():
    ctl = controller(adaptive=False, calibration_interval=4)
    paired(ctl, 0.005, 0.010)
    feed(ctl, "a", 4, 0, times=50)
    for _ in range(10):
        ctl.step()
        assert ctl.k_for("a") == 4 and not ctl.calibrating  # a fixed k is never interrupted
    assert ctl.stats()["a"].state == DomainState.FIXED


def test_configured_draft_cost_replaces_measurement():
    ctl = controller(draft_cost=0.05)
    assert ctl.cost_ratio("a") == 0.05
    feed(ctl, "a", 4, 3)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.ON


def test_no_calibration_with_a_configured_verify_overhead():
    ctl = controller(verify_overhead=0.5, calibration_interval=4)
    paired(ctl, 0.001, 0.010)
    assert ctl.verify_overhead(3) == 0.5 and ctl.cost_ratio("a") == pytest.approx(0.15)
    for _ in range(10):
        ctl.step()
        assert not ctl.calibrating


def run_steps(ctl, n, *, rows=1, domains=("a",), draft_s=0.001):
    """Drive ``ctl`` as the proposer does for ``n`` steps; returns the calibration flags."""
    flags = []
    for _ in range(n):
        ctl.step(rows, set(domains))
        ks = [ctl.k_for(d) for d in domains for _ in range(rows // len(domains))]
        flags.append(ctl.calibrating)
        ctl.end_step(set(domains))
        if sum(ks):
            ctl.record_draft("/draft", rows, draft_s)
        ctl.record_step(0.010 * (1 + 0.05 * sum(ks) / rows), rows, sum(ks))
        feed(ctl, "a", max(ks, default=0), 0, times=1) if max(ks, default=0) else None
    return flags


def test_calibration_steps_draft_nothing_now_and_then():
    ctl = controller(calibration_interval=8, draft_cost=0.01)
    feed(ctl, "a", 4, 4, times=64)  # a good draft: always on
    flags = run_steps(ctl, 40)
    # every other step until three samples of v, then one step in 8
    assert [i for i, f in enumerate(flags) if f] == [1, 3, 11, 19, 27, 35]
    assert ctl.verify_overhead(1) == pytest.approx(0.05)
    assert ctl.stats()["a"].state == DomainState.ON
    # warm-up waits for v (two calibrations), then none while the domain is off: its
    # plain steps happen by themselves
    ctl = controller(calibration_interval=8, draft_cost=0.01)
    feed(ctl, "a", 4, 0, times=64)
    assert [i for i, f in enumerate(run_steps(ctl, 40)) if f] == [1, 3]
    assert ctl.stats()["a"].state == DomainState.OFF
    # 0: never
    ctl = controller(calibration_interval=0, draft_cost=0.01)
    feed(ctl, "a", 4, 4, times=64)
    assert not any(run_steps(ctl, 40))


def test_a_calibration_step_delays_a_probe():
    ctl = controller(calibration_interval=4, draft_cost=0.2)
    for seconds, drafted in [(0.011, 1), (0.010, 0)] * 2:  # v known: warm-up need not wait
        ctl.record_step(seconds, 1, drafted)
    feed(ctl, "a", 4, 0)
    ctl.step()
    assert ctl.stats()["a"].state == DomainState.OFF
    ctl.calibrating = True  # as if a drafting domain shared the batch
    for _ in range(10):
        assert ctl.k_for("a") == 0
        ctl.end_step({"a"})
    ctl.calibrating = False
    ks = []
    for _ in range(5):
        ks.append(ctl.k_for("a"))
        ctl.end_step({"a"})
    assert ks == [0, 0, 0, 0, 1]  # calibration steps did not count towards the probe


def test_stats_report_the_measured_and_the_size_based_cost_ratio():
    ctl = controller(verify_overhead=0.0, target_bytes=1000)
    ctl.set_draft_bytes("/draft", 10)  # c_size = 0.01: plausible 0.0025 .. 0.04
    paired(ctl, 0.001, 0.010)  # measured 0.1
    s = ctl.stats()["a"]
    assert s.cost_ratio == pytest.approx(0.04) and s.cost_ratio_measured == pytest.approx(0.1)
    assert s.cost_ratio_size == pytest.approx(0.01)
    ctl.set_target_bytes(None)
    assert ctl.stats()["a"].cost_ratio == pytest.approx(0.1) and ctl.stats()["a"].cost_ratio_size is None


def set_alpha(ctl, accepted_of_64):
    """Fill the 64-observation window with k = 1 observations: alpha = accepted / 64."""
    for i in range(64):
        ctl.observe("a", 1, int(i < accepted_of_64))


def hysteresis_controller(**kw):
    # k_max 1, c = 0.1, v = 0: S = (1 + alpha) / 1.1; break-even at alpha = 0.1, 1.05 at 0.155
    return controller(k_max=1, draft_cost=0.1, verify_overhead=0.0, **kw)


def test_hysteresis_band_between_off_and_on():
    ctl = hysteresis_controller(hysteresis=0.05)
    set_alpha(ctl, 8)  # alpha 0.125: S = 1.023, inside the band
    ctl.step()
    assert ctl.state("a") == (DomainState.OFF, 0)  # leaving warm-up needs S >= 1.05 to go on
    set_alpha(ctl, 13)  # S = 1.094
    ctl.step()
    assert ctl.state("a") == (DomainState.ON, 1)
    set_alpha(ctl, 8)  # back inside the band: stays on
    ctl.step()
    assert ctl.state("a") == (DomainState.ON, 1)
    set_alpha(ctl, 5)  # S = 0.98
    ctl.step()
    assert ctl.state("a") == (DomainState.OFF, 0)
    set_alpha(ctl, 8)
    ctl.step()
    assert ctl.state("a") == (DomainState.OFF, 0)
    assert ctl.stats()["a"].switches == 2


def test_a_switch_needs_consecutive_decisions():
    ctl = hysteresis_controller(switch_after=3)
    set_alpha(ctl, 13)
    for _ in range(3):  # leaving warm-up for on takes 3 decisions (drafting k_max meanwhile)
        assert ctl.state("a") == (DomainState.WARMUP, 1)
        ctl.step()
    assert ctl.state("a") == (DomainState.ON, 1)
    for alpha in [5, 5, 13, 5, 5, 13]:  # two odd decisions in a row are not enough
        set_alpha(ctl, alpha)
        ctl.step()
        assert ctl.state("a") == (DomainState.ON, 1)
    for _ in range(3):
        set_alpha(ctl, 5)
        ctl.step()
    assert ctl.state("a") == (DomainState.OFF, 0)
    # leaving warm-up for off is immediate: drafting k_max for a poor draft is the costly mistake
    ctl = hysteresis_controller(switch_after=3)
    set_alpha(ctl, 0)
    ctl.step()
    assert ctl.state("a") == (DomainState.OFF, 0)


def test_k_changes_only_for_a_clearly_better_speedup():
    ctl = controller(draft_cost=0.1, verify_overhead=0.0)  # k_max 4
    set_alpha(ctl, 32)  # 0.5: k = 2 is best
    ctl.step()
    assert ctl.state("a") == (DomainState.ON, 2)
    set_alpha(ctl, 35)  # 0.547: k = 3 predicts 0.5% more than k = 2
    ctl.step()
    assert best_k(35 / 64, 0.1, 4)[0] == 3 and ctl.state("a") == (DomainState.ON, 2)
    set_alpha(ctl, 39)  # 0.609: k = 3 predicts 2.5% more
    ctl.step()
    assert ctl.state("a") == (DomainState.ON, 3)


def test_each_batch_bucket_has_its_own_state():
    ctl = controller(draft_cost=0.05)
    # u = 0.02 per draft token at batch 1, 0.3 at batch 8
    for rows, t_plain, u in [(1, 0.010, 0.02), (8, 0.030, 0.3)]:
        for drafted in [rows, 0, rows, 0]:
            ctl.record_step(t_plain * (1 + u * drafted / rows), rows, drafted)
    set_alpha(ctl, 19)  # 0.3: pays at batch 1 only ((1.3) / (1.05 + 0.3) < 1 at batch 8)
    ctl.step(1, {"a"})
    assert ctl.state("a") == (DomainState.ON, best_k(19 / 64, 0.05, 4, overhead=lambda k: 0.02 * k)[0])
    assert ctl.state("a", rows=8) == ctl.state("a")  # not decided there yet: the nearest bucket's
    ctl.step(6, {"a"})
    assert ctl.state("a") == (DomainState.OFF, 0) and ctl.stats()["a"].bucket == 8
    assert ctl.state("a", rows=1)[0] == DomainState.ON
    assert ctl.state("a", rows=2)[0] == DomainState.ON and ctl.state("a", rows=4)[0] == DomainState.OFF
    assert set(ctl.stats()["a"].by_bucket) == {1, 8}
    assert "batch<=8" in ctl.summary() and "k_by_batch=1:" in ctl.summary()


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
    assert "a: state=warmup k=4/4 batch<=1" in text and "none: state=no-draft" in text


def test_stats_rates():
    ctl = controller()
    feed(ctl, "a", 4, 2, times=3)
    s = ctl.stats()["a"]
    assert s.acceptance_rate == 0.5 and s.mean_acceptance_length == 3.0
    assert not math.isnan(s.alpha)


def test_an_off_domain_probes_with_one_request_per_step():
    ctl = controller()
    paired(ctl, 0.002, 0.010)
    feed(ctl, "a", 4, 0)
    ctl.step()
    per_step = []
    for _ in range(5):  # probe_interval = 5
        per_step.append([ctl.k_for("a") for _ in range(3)])  # three requests of "a" in the batch
        ctl.end_step({"a"})
        ctl.step()
    assert per_step == [[0, 0, 0]] * 4 + [[1, 0, 0]]


def test_step_times_are_read_at_the_current_bucket():
    ctl = controller()
    for rows, seconds in [(1, 0.010), (8, 0.030), (1, 0.012)]:
        ctl.record_step(seconds, rows, 0)
    ctl.step(7)
    assert ctl.stats()["a"].target_step_ms == pytest.approx(30.0)
    ctl.step(1)
    assert ctl.stats()["a"].target_step_ms == pytest.approx(12.0)  # the median (upper middle)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 5, 8, 40]), st.integers(0, 4), st.integers(0, 4),
                          st.floats(0.001, 0.02)), min_size=1, max_size=60))
def test_counters_are_what_stats_holds_that_changes_every_step(steps):
    """The live metrics' per-step read (``counters``) agrees with the full read at every step."""
    ctl = controller(switch_after=2)
    for rows, k, accepted, seconds in steps:
        ctl.record_step(seconds, rows, k * rows)
        ctl.observe("a", k, accepted)
        ctl.step(rows)
        ctl.record_draft("/draft", rows, seconds / 10)
        ctl.end_step({"a", "none"})
        full = {name: (s.drafted, s.accepted, s.steps, s.state, s.k) for name, s in ctl.stats(by_bucket=False).items()}
        counters = ctl.counters()
        assert {name: tuple(c) for name, c in counters.items()} == full
        assert all(c.acceptance_rate == ctl.stats()[n].acceptance_rate
                   and c.mean_acceptance_length == ctl.stats()[n].mean_acceptance_length for n, c in counters.items())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4), st.none() | st.integers(1, 4)), max_size=40),
       st.integers(1, 10))
def test_window_profile_kept_until_the_next_observation(observations, size):
    """The profile read at every step is kept between observations, and is always the one computed afresh."""
    window = AcceptanceWindow(size, 4)
    for k, n, offer in observations:
        window.add(k, min(n, k), offer)
        first = window.profile()
        assert window.profile() is first  # kept ...
        assert first == window._profile_now(16.0) and window.profile(8.0) == window._profile_now(8.0)  # ... and right
        assert window.profile() == first
