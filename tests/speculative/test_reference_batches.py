"""Reference batches (accel_plugin/speculative/episodes.py, step_gate.py): a whole batch of a domain
mix run plain after its drafting ones, whose plain steps then price the drafting batches after it."""

from __future__ import annotations

import pytest

from accel_plugin.speculative.controller import DomainController
from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative.episodes import REFERENCE_EVERY, REFERENCE_SETTLED, Episodes
from accel_plugin.speculative.step_gate import GateState, StepGate

MIX = frozenset({"support"})
KEY = (2, MIX)


def batch(ep: Episodes, rows: list[str], steps: list[tuple[float, int, int]], every: int = REFERENCE_EVERY):
    """A whole batch of ``rows`` (their ids) that starts now and runs ``steps`` (seconds, tokens
    per row, drafted per row) at KEY, or, as a reference, as many plain steps; returns (what its start
    ended, whether it ran as a reference)."""
    ep.record_cycle(None, 0, 0, 0)
    done = ep.record_rows(dict.fromkeys(rows, 1), joined=len(rows))
    reference = ep.set_key(KEY, every)
    steps = [(seconds, 1, 0) for seconds, _, _ in steps] if reference else steps
    for seconds, tokens, drafted in steps:
        ep.record_cycle(seconds, len(rows), tokens * len(rows), drafted * len(rows), MIX)
        ep.record_rows(dict.fromkeys(rows, tokens), 0)
        assert ep.set_key(KEY, every) == reference  # every step of a reference batch runs plain
    return done, reference


def test_a_plain_batch_prices_its_mixs_next_drafting_batches_by_its_own_steps():
    """Old plain cycles of the mix (a quiet spell: 0.05 s a step by their lower quartile) price a
    drafting batch at 2.0x; the reference batch, moments before it, ran its steps at 0.1 s: the next
    drafting batch of the same tokens is priced at exactly the reference's measured time (4.0x)."""
    ep = Episodes()
    for _ in range(8):
        ep.record_cycle(0.05, 2, 2, 0, MIX)
    drafting = [(0.1, 4, 3), (0.1, 4, 3)]  # 8 tokens a row in 0.2 s
    _, reference = batch(ep, ["a", "b"], drafting)
    assert not reference  # the mix's first batch drafts
    done, reference = batch(ep, ["x", "y"], [(0.1, 1, 0)] * 8)  # its start ends the first batch
    assert done[2] == pytest.approx(8 * 0.05 / 0.2) and reference  # priced by the old cycles; this one: plain
    done, reference = batch(ep, ["p", "q"], drafting)
    assert done is None and not reference  # a plain batch gives no factor; the next one drafts
    done, _ = batch(ep, ["z"], [])
    assert done[2] == pytest.approx(8 * 0.1 / 0.2)  # the reference's 8 steps of 0.1 s over 0.2 s


@pytest.mark.parametrize("every", [REFERENCE_EVERY, REFERENCE_SETTLED])
def test_a_reference_comes_after_the_first_drafting_batch_then_after_every_nth(every):
    ep = Episodes()
    ep.record_cycle(0.1, 2, 2, 0, MIX)  # p(2) known: drafting batches count
    runs = [batch(ep, [f"{i}a", f"{i}b"], [(0.1, 3, 2)] * 4, every)[1] for i in range(3 + 2 * every)]
    first = runs.index(True)
    assert first == 1 and runs[first + 1:].index(True) == every and runs.count(True) == 2
    ep = Episodes()
    assert not any(batch(ep, [f"{i}a", f"{i}b"], [(0.1, 3, 2)] * 4, 0)[1] for i in range(4))  # every=0: never


def test_the_gate_runs_a_reference_batch_at_keys_above_batch_1_that_are_not_off():
    """Every step of the reference batch is plain, its tail's steps at smaller buckets too; a key of
    batch 1 (no tail) or an off key (its batches are plain but for probes) never asks for one."""
    for bucket, off, expected in [(2, False, True), (1, False, False), (2, True, False)]:
        g = StepGate(ControllerConfig(gate_min_samples=2, gate_window=4))
        key = (bucket, MIX)
        if off:
            g._at(key).state = GateState.OFF
        g.record_cycle(0.1, bucket, bucket, bucket, 0)  # a plain cycle: the batches' plain time is known
        verdicts = []
        for i in range(2):
            rows = {f"{i}{r}": 1 for r in range(bucket)}
            g.record_cycle(None, 0, bucket, 0, 0)
            g.record_rows(rows, joined=bucket)
            verdicts.append(g.begin(*key))
            for _ in range(4):
                drafted = 0 if verdicts[-1] in (GateState.REFERENCE, GateState.OFF) else bucket
                g.record_cycle(0.1, bucket, bucket, bucket + drafted, drafted)
                g.record_rows(dict.fromkeys(rows, 1 + drafted // bucket), 0)
                assert g.begin(*key) == verdicts[-1]
            if verdicts[-1] == GateState.REFERENCE:  # its tail, a row left: still plain
                g.record_cycle(0.1, bucket, bucket, bucket, 0)
                g.record_rows({f"{i}0": 1}, 0)
                assert g.begin(1, MIX) == GateState.REFERENCE
        assert (verdicts[1] == GateState.REFERENCE) == expected, (bucket, off, verdicts)


def test_a_reference_step_drafts_nothing_and_takes_no_lookup_cap_back():
    cfg = ControllerConfig(min_samples=1)
    ctl = DomainController(cfg, {"a": "/draft"}, {"a": 4})
    ctl.gate.begin = lambda bucket, mix=(): GateState.REFERENCE
    restarted = []
    ctl.gate.restart = lambda *a: restarted.append(a) or GateState.WARMUP
    ctl.step(4, {"a"}, ["a"] * 4)
    assert ctl.gated and ctl.k_for("a") == 0 and not restarted

