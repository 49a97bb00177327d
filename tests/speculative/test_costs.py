"""Paired timings: c from a draft call and the step after it, v from neighbouring
plain and verifying steps, per batch bucket, within the weight-size band."""

from __future__ import annotations

import copy
import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.speculative import costs as costs_module
from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative.costs import StepCosts, batch_bucket, lower_quartile

DRAFT = "/draft"


def costs(**kw) -> StepCosts:
    return StepCosts(ControllerConfig(**kw))


def paired(m, draft_s, step_s, *, rows=1, drafted=None, times=5):
    """``times`` calls that draft (``draft_s`` per forward), each followed by the target
    step that verifies the drafts (``step_s``)."""
    for _ in range(times):
        m.record_draft(DRAFT, rows, draft_s)
        m.record_step(step_s, rows, rows if drafted is None else drafted)


def steps(m, rows, *timed):
    """Record target steps ``(seconds, drafted)`` of ``rows`` requests, in order."""
    for seconds, drafted in timed:
        m.record_step(seconds, rows, drafted)


def test_batch_buckets():
    rows = [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 33]
    assert [batch_bucket(r) for r in rows] == [1, 1, 2, 4, 4, 8, 8, 16, 16, 32, 64]


def test_cost_ratio_pairs_each_draft_with_the_step_after_it():
    m = costs()
    assert m.cost_ratio(DRAFT, 1) is None
    # a machine 10x slower on some calls: both sides at once, the ratio holds
    for speed in [1, 10, 1, 10, 1, 1, 10]:
        paired(m, 0.001 * speed, 0.010 * speed, times=1)
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.1)
    # a spell on one side only, for fewer pairs than half the window: the median holds
    paired(m, 0.010, 0.010, times=3)
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.1)
    # not paired: a plain step (nothing was drafted), a step that prefilled (None),
    # a plain step after a draft whose step went untimed
    m.record_step(5.0, 1, 0)
    m.record_draft(DRAFT, 1, 9.0)
    m.record_step(None, 1, 1)
    m.record_draft(DRAFT, 1, 9.0)
    m.record_step(0.010, 1, 0)
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.1)
    assert m.cost_samples(DRAFT, 1) == 10
    # another bucket without pairs of its own reads this one
    assert m.cost_ratio(DRAFT, 8) == pytest.approx(0.1)


def test_cost_ratio_counts_in_plain_steps():
    """r = draft / verifying step; a verifying step lasts (1 + v) plain ones, so
    c = r (1 + v) with v of the drafts per request that step verified."""
    m = costs()
    steps(m, 1, *[(0.012, 2), (0.010, 0)] * 3, (0.012, 2))  # u = 0.1 per draft token per request
    assert m.verify_overhead(2, 1) == pytest.approx(0.2)
    paired(m, 0.0012, 0.012, drafted=2)  # r = 0.1 against the verifying step
    assert m.measured_cost_ratio(DRAFT, 1) == pytest.approx(0.1 * 1.2)


def test_verify_overhead_pairs_neighbouring_steps_of_one_bucket():
    m = costs()
    assert m.verify_overhead(1, 1) == 0.0  # nothing measured yet
    steps(m, 1, (0.013, 1), (0.010, 0), (0.013, 1), (0.010, 0))  # three samples of u = 0.3
    assert m.verify_overhead(1, 1) == pytest.approx(0.3) and m.verify_overhead(3, 1) == pytest.approx(0.9)
    # neighbours of different buckets (1 and 8) pair with nothing
    m.record_step(0.030, 8, 8)
    m.record_step(0.010, 1, 0)
    m.record_step(0.033, 8, 8)
    assert m.overhead_samples(8) == 0
    # per draft token per request: 4 requests, 2 drafts in all -> 0.5 each; 10% longer -> u = 0.2
    steps(m, 4, *[(0.022, 2), (0.020, 0)] * 2)
    assert m.verify_overhead(1, 4) == pytest.approx(0.2)
    assert m.verify_overhead(1, 2) == pytest.approx(0.3)  # nearest bucket with data (ties: the smaller)
    assert m.verify_overhead(1, 16) == pytest.approx(0.2)


def test_verify_overhead_weighs_samples_by_drafts_per_request():
    m = costs()
    # two noisy samples from probe-like steps (1 draft among 8 requests), one from a full step
    steps(m, 8, (0.105, 1), (0.100, 0), (0.1005, 1), (0.100, 0), (0.110, 8))
    assert m.verify_overhead(1, 8) == pytest.approx(0.1)  # an unweighted median: 0.4


def test_verify_overhead_is_read_per_range_of_drafts_per_request():
    """u of 4 drafts or more per request from such samples once there are 3, else from all (as shorter
    drafts' always): an engine whose step costs 3% a draft up to 3 drafts and 6% from 4 (eager vLLM's
    CPU step at batch 1 here)."""
    m = costs()
    steps(m, 1, *[(0.0103, 1), (0.010, 0)] * 3)  # 1 draft: u 0.03, 5 samples (each step pairs with the last)
    steps(m, 1, *[(0.0106, 2), (0.010, 0)] * 10)  # 2 drafts: u 0.03, 20 samples
    assert m.verify_overhead(1, 1) == pytest.approx(0.03) and m.verify_overhead(5, 1) == pytest.approx(0.15)
    steps(m, 1, (0.0130, 5), (0.010, 0))  # 5 drafts: u 0.06, 2 samples: not enough yet
    assert m.verify_overhead(5, 1) == pytest.approx(0.15)  # all samples' weighted median (by drafts)
    steps(m, 1, (0.0124, 4))  # a third, 4 drafts
    assert m.verify_overhead(4, 1) == pytest.approx(0.24) and m.verify_overhead(5, 1) == pytest.approx(0.30)
    assert m.verify_overhead(3, 1) == pytest.approx(0.09) and m.verify_overhead(1, 1) == pytest.approx(0.03)
    steps(m, 1, *[(0.010, 0), (0.0124, 4)] * 10)  # long drafts the most weight: the short ones' u follows
    assert m.verify_overhead(1, 1) == pytest.approx(0.06)
    paired(m, 0.001, 0.013, drafted=5, times=3)  # c of a five-draft step: in plain steps, with its own v
    assert m.measured_cost_ratio(DRAFT, 1) == pytest.approx(0.001 / 0.013 * 1.30)


def test_negative_samples_are_kept_and_the_median_clamped():
    m = costs()
    steps(m, 1, (0.009, 1), (0.010, 0), (0.009, 1))
    assert m.verify_overhead(1, 1) == 0.0


def test_configured_values_replace_measurements():
    m = costs(verify_overhead=0.5)
    steps(m, 1, *[(0.010, 1), (0.010, 0)] * 3)
    assert m.verify_overhead(1, 1) == 0.5 and m.verify_overhead(3, 1) == 0.5  # one v for every k
    paired(m, 0.001, 0.010)
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.15)
    m = costs(draft_cost=0.05)
    paired(m, 0.001, 0.010)
    assert m.cost_ratio(DRAFT, 1) == 0.05 and m.measured_cost_ratio(DRAFT, 1) == pytest.approx(0.1)


def test_measured_cost_outside_the_size_band_is_clamped_with_one_warning(caplog):
    m = costs(verify_overhead=0.0)
    m.target_bytes, m.draft_bytes[DRAFT] = 1000, 10  # c_size = 0.01: plausible 0.0025 .. 0.04
    paired(m, 0.001, 0.010)  # measured 0.1
    with caplog.at_level(logging.WARNING, logger="accel_plugin.speculative"):
        assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.04)
        assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.04)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and DRAFT in warnings[0] and "controller.draft_cost" in warnings[0]
    assert m.size_cost_ratio(DRAFT) == pytest.approx(0.01)
    paired(m, 0.00001, 0.010, times=20)  # measured 0.001: below the band
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.0025)
    # without sizes, or inside the band: the measurement as it is
    m = costs(verify_overhead=0.0)
    paired(m, 0.001, 0.010)
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.1) and m.size_cost_ratio(DRAFT) is None
    m.target_bytes, m.draft_bytes[DRAFT] = 1000, 50
    assert m.cost_ratio(DRAFT, 1) == pytest.approx(0.1)


def test_counters_for_reading():
    m = costs()
    steps(m, 1, (0.010, 0), (0.012, 0), (0.011, 0))
    m.record_step(0.030, 8, 8)
    m.record_draft(DRAFT, 8, 0.002)
    assert m.target_step_s(1) == pytest.approx(0.011) and m.target_step_s(8) is None
    assert m.verify_step_s(8) == pytest.approx(0.030) and m.draft_forward_s(DRAFT) == pytest.approx(0.002)
    assert m.steps_since_plain(8) == 1 and m.steps_since_plain(1) == 0


def test_read_medians_follow_every_new_time():
    """The medians for reading are kept between measurements (read per domain and step)
    and never outlive one: a draft time recorded mid-step, a step recorded next."""
    m = costs()
    m.record_draft(DRAFT, 1, 0.002)
    assert m.draft_forward_s(DRAFT) == pytest.approx(0.002)
    m.record_draft(DRAFT, 1, 0.004)
    m.record_draft(DRAFT, 1, 0.005)
    assert m.draft_forward_s(DRAFT) == pytest.approx(0.004)
    steps(m, 1, (0.010, 0))
    assert m.target_step_s(1) == pytest.approx(0.010)
    steps(m, 1, (0.020, 0), (0.030, 0))
    assert m.target_step_s(1) == pytest.approx(0.020)


def test_lower_quartile_is_the_smallest_of_few_values_and_the_quarter_mark_of_many():
    assert lower_quartile([]) is None
    assert lower_quartile([0.3, 0.1, 0.2, 0.4]) == 0.1
    assert lower_quartile([5, 1, 4, 2, 3]) == 2
    assert lower_quartile(range(100, 0, -1)) == 25


@pytest.fixture(scope="module")
def short_max_age():
    """Samples of c age out within a short run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(costs_module, "_MAX_AGE", 16)
        yield


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_kept_medians_equal_medians_read_afresh(short_max_age, seed):
    """Every value read from the kept medians is what a read with nothing kept gives, whatever
    arrives in between: plain steps, drafts, untimed steps, samples that age out. (Random runs of
    150 steps with distinct times: hypothesis's own floats repeat, and equal samples hide a stale median.)"""
    m, rng = costs(), random.Random(seed)
    for _ in range(150):
        draft, rows = rng.choice(["/a", "/b", None]), rng.choice([1, 2, 3, 8, 9])
        seconds = rng.uniform(0.01, 0.05)
        if draft is not None:
            m.record_draft(draft, rows, seconds * rng.uniform(0.05, 0.2))
        m.record_step(seconds if rng.random() < 0.8 else None, rows, rng.randint(0, 5) * rows)
        afresh = copy.copy(m)  # the same samples, nothing kept
        afresh._memo = {}
        for bucket in (1, 2, 4, 8, 16):
            assert read(m, bucket) == read(afresh, bucket)


def read(m, bucket):
    return ([(m.measured_cost_ratio(d, bucket), m.cost_ratio(d, bucket)) for d in ("/a", "/b")]
            + [m.verify_overhead(k, bucket) for k in (1, 2, 5)]
            + [m.target_step_s(bucket), m.verify_step_s(bucket), m.draft_forward_s("/a")])
