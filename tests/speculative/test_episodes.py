"""Whole batches (accel_plugin/speculative/episodes.py): the tail factor of a batch whose
rows finish unevenly, when an episode counts, and what the step gate does with it."""

from __future__ import annotations


import pytest

from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative.episodes import MIN_SELF, Episodes, tail_factor
from accel_plugin.speculative.step_gate import MAX_BACKOFF, StepGate, probe_interval


def test_tail_factor_is_one_when_rows_keep_pace_and_below_one_with_a_tail():
    plain = {2: 0.1, 1: 0.08}
    # both rows get 2 tokens a cycle: plain needs 4 steps of 2 rows, the cycles are credited the same
    assert tail_factor([4, 4], [(2, 4, 2), (2, 4, 2)], plain) == pytest.approx(1.0)
    # row a gets 4 tokens in the first cycle and is done; b gets 1 a cycle for 3 cycles:
    # P = 3 p(2) + 1 p(1) = 0.38; C = p(2) 5/2 + p(1) + p(1) = 0.41
    assert tail_factor([4, 3], [(2, 5, 2), (1, 1, 1), (1, 1, 1)], plain) == pytest.approx(0.38 / 0.41)


def test_plain_time_at_a_row_count_never_measured_is_interpolated_or_its_neighbours():
    plain = {1: 0.04, 8: 0.1}
    one_row_of_four = tail_factor([1], [(4, 4, 4)], plain)  # P = p(1), C = p(4) * 4 / 4
    assert one_row_of_four == pytest.approx(0.04 / (0.04 + 3 / 7 * 0.06))
    assert tail_factor([2, 2], [(2, 4, 2)], {1: 0.04}) == pytest.approx(1.0)  # p(2) read as p(1)
    assert tail_factor([1, 1], [(2, 2, 0)], {4: 0.1}) == pytest.approx(1.0)  # p(2) read as p(4)
    assert tail_factor([1], [(1, 1, 0)], {}) is None  # no plain cycle measured yet


def feed(episodes: Episodes, rows: dict, joined: int, cycle=(0.1, 2, 2, 0), key=(2, frozenset({"d"}))):
    """One proposer call: the cycle that ended, this call's rows, the step's key."""
    episodes.record_cycle(*cycle)
    done = episodes.record_rows(rows, joined)
    episodes.set_key(key)
    return done


def test_an_episode_ends_when_the_next_batch_starts_and_reports_its_key_and_factor():
    ep = Episodes()
    key = (2, frozenset({"d"}))
    ep.record_cycle(0.08, 1, 1, 0)  # plain cycles measured before: p(1) = 0.08, p(2) = 0.1
    ep.record_cycle(0.1, 2, 2, 0)
    looked_up = (2, frozenset({"d", "d/lookup"}))  # a prompt lookup match in the second step
    assert feed(ep, {"a": 1, "b": 1}, joined=2, cycle=(None, 0, 0, 0), key=key) is None  # starts
    assert feed(ep, {"a": 4, "b": 1}, 0, cycle=(0.2, 2, 5, 2), key=looked_up) is None
    assert feed(ep, {"b": 1}, 0, cycle=(0.1, 1, 1, 1), key=(1, frozenset({"d"}))) is None
    assert feed(ep, {"b": 1}, 0, cycle=(0.1, 1, 1, 1), key=(1, frozenset({"d"}))) is None
    done = feed(ep, {"x": 1, "y": 1}, joined=2, cycle=(None, 0, 0, 0), key=(2, frozenset({"e"})))
    # the factor goes to every mix of the first step's bucket, not to the tail's buckets
    assert done is not None and set(done[0]) == {key, looked_up} and done[1] == pytest.approx(0.38 / 0.41)


def test_a_drafting_episode_reports_its_whole_speedup_with_everything_a_cycle_leaves_out():
    ep = Episodes()
    ep.record_cycle(0.1, 2, 2, 0)  # p(2) = 0.1
    feed(ep, {"a": 1, "b": 1}, joined=2, cycle=(None, 0, 0, 0))
    feed(ep, {"a": 4, "b": 4}, 0, cycle=(0.3, 2, 8, 4))  # the draft's prefill of both prompts: slow
    feed(ep, {"a": 4, "b": 4}, 0, cycle=(0.15, 2, 8, 4))  # 8 tokens in 0.15 s: 2.7x as a cycle
    keys, factor, speedup = feed(ep, {"x": 1, "y": 1}, joined=2, cycle=(None, 0, 0, 0))
    # plain: 8 tokens a row at 0.1 s a step = 0.8 s; the batch took 0.45 s
    assert factor == pytest.approx(1.0) and speedup == pytest.approx(0.8 / 0.45)
    feed(ep, {"x": 1, "y": 1}, 0, cycle=(0.1, 2, 2, 0))  # half of its cycles plain
    feed(ep, {"x": 3, "y": 1}, 0, cycle=(0.1, 2, 4, 2))
    done = feed(ep, {"z": 1}, joined=1, cycle=(None, 0, 0, 0))
    assert done is not None and done[2] == pytest.approx(0.4 / 0.2)  # 1 of 2 drafted
    feed(ep, {"z": 1}, 0, cycle=(0.1, 1, 1, 0))
    feed(ep, {"z": 1}, 0, cycle=(0.1, 1, 1, 0))
    feed(ep, {"z": 2}, 0, cycle=(0.12, 1, 2, 1))
    done = feed(ep, {"w": 1}, joined=1, cycle=(None, 0, 0, 0))
    # 1 of 3 drafted: it still counts, its whole speedup too (a batch whose plain cycles cost what plain
    # does loses only by drafting): 4 tokens, plain 0.4 s, the batch 0.32 s
    assert done is not None and done[2] == pytest.approx(0.4 / 0.32)
    for _ in range(4):
        feed(ep, {"w": 1}, 0, cycle=(0.1, 1, 1, 0))
    feed(ep, {"w": 2}, 0, cycle=(0.1, 1, 2, 1))
    assert feed(ep, {"v": 1}, joined=1, cycle=(None, 0, 0, 0)) is None  # 1 of 5 drafted: below MIN_DRAFTING


def test_a_whole_batch_that_lost_switches_an_on_key_off_at_once():
    g = gate()
    key = (8, frozenset({"support"}))
    on_at(g, key, 1.19)
    g.record_episode(key, 0.95, 1.02)  # cycles 1.19 x tail 0.95 = 1.13, and the batch gained: on
    assert g.state(*key) == "on"
    g.record_episode(key, 0.95, 0.93)  # the batch lost though its cycles say 1.13x
    assert g.state(*key) == "off" and g.stats()[8]["mixes"]["support"]["whole_speedup"] == pytest.approx(1.02)
    verdicts = [g.begin(*key) for _ in range(probe_interval(16, 8, MAX_BACKOFF) - 1)]
    assert "probe" not in verdicts and g.begin(*key) == "probe"  # probes at the longest interval
    off = (8, frozenset({"code"}))
    on_at(g, off, 0.5)
    g.record_episode(off, 1.0, 1.5)  # a whole speedup never switches a key on: probes and cycles do
    assert g.state(*off) == "off"


def test_one_noisy_whole_batch_after_good_ones_leaves_a_key_on_and_a_second_does_not():
    """TGI at batch 1 (a request per batch): support's requests read 1.68, 1.90, 1.33, 1.99 and
    1.20x whole, then one 0.98x switched the key off for the rest of the run (180 of 359 steps
    plain); the lower median of the last 4 decides, so one noisy request does not, two do."""
    g = gate()
    key = (1, frozenset({"support"}))
    on_at(g, key, 1.62)
    for whole in (1.68, 1.90, 1.33, 1.99, 1.20, 0.98):  # last 4: 1.33 1.99 1.20 0.98, lower median 1.20
        g.record_episode(key, 1.0, whole)
        assert g.state(*key) == "on", whole
    g.record_episode(key, 1.0, 0.90)  # last 4: 1.99 1.20 0.98 0.90, lower median 0.98
    assert g.state(*key) == "off"


def test_whole_batches_that_paid_hold_an_on_key_against_cycles_that_read_low():
    """TGI at batch 1 after the native few-row product: support's requests read 1.86, 2.18,
    1.51, 2.42, 1.36x whole while its few paired cycles (a drafting one beside a calibration
    step) read 0.93x and switched it off; 4 whole batches whose lower median is at least
    min_speedup * (1 + hysteresis) hold it on. Whole batches at 1.02x (paying, but within the
    hysteresis) do not, nor do fewer than 4."""
    for wholes, stays in [((1.86, 2.18, 1.51, 1.36), True), ((1.02, 1.03, 1.02, 1.04), False),
                          ((1.9, 2.0, 1.8), False)]:
        g = gate()
        key = (1, frozenset({"support"}))
        on_at(g, key, 1.5)
        for whole in wholes:
            g.record_episode(key, 1.0, whole)
        assert g.state(*key) == "on"
        on_at(g, key, 0.8)  # the cycles now read 0.8x: gate_switch_after samples ask for off
        assert g.state(*key) == ("on" if stays else "off"), wholes


@pytest.mark.parametrize("bucket", [8, 1])
def test_above_batch_1_recent_whole_batches_that_lost_hold_an_off_key_off_against_its_cycles(bucket):
    """Demo of 2026-12-07 at 7f11dc1, support-free at batch 8: its key off, a whole batch read 1.00x,
    then its probes' cycles read 1.17x and switched it on, and its next whole batch read 0.87x. Whole
    batches that did not pay (below min_speedup x (1 + hysteresis)) hold an off key off for gate_window
    samples; at batch 1 (whole requests read low beside rows that pay) they do not."""
    g = gate()
    key = (bucket, frozenset({"support"}))
    on_at(g, key, 0.8)
    assert g.state(*key) == "off"
    g.record_episode(key, 1.0, 1.00)
    on_at(g, key, 1.6, samples=2)  # 4 samples (each cycle pairs with the one before), 3 of them at 1.6x
    assert g.state(*key) == ("off" if bucket > 1 else "on")
    on_at(g, key, 1.6, samples=1)  # the whole batch is gate_window samples old: the cycles decide again
    assert g.state(*key) == "on"
    g = gate()
    on_at(g, key, 0.8)
    g.record_episode(key, 1.0, 1.10)  # a whole batch that paid holds nothing off
    on_at(g, key, 1.6, samples=2)
    assert g.state(*key) == "on"


def test_an_episodes_plain_time_is_its_own_mixs_where_measured_else_every_mixs():
    """A plain step's time depends on its rows' contexts: a support batch's plain time is
    read from support's plain cycles, not from the median over every mix the engine ran."""
    ep = Episodes()
    support, code = frozenset({"support"}), frozenset({"code"})
    for seconds, mix in [(0.08, support)] * 3 + [(0.12, code)] * 13:  # pooled lower quartile: 0.12
        ep.record_cycle(seconds, 2, 2, 0, mix)
    ep.record_cycle(0.09, 1, 1, 0, support)  # one cycle of its own at 1 row: too few, pooled
    ep.record_cycle(0.05, 1, 1, 0, code)
    ep.record_cycle(0.05, 1, 1, 0, code)
    assert ep.plain_times() == {2: pytest.approx(0.12), 1: pytest.approx(0.05)}
    assert ep.plain_times(support) == {2: pytest.approx(0.08), 1: pytest.approx(0.05)}
    key = (2, support)
    feed(ep, {"a": 1, "b": 1}, joined=2, cycle=(None, 0, 0, 0), key=key)
    feed(ep, {"a": 4, "b": 4}, 0, cycle=(0.2, 2, 8, 4), key=key)
    _, factor, speedup = feed(ep, {"x": 1}, joined=1, cycle=(None, 0, 0, 0), key=key)
    # plain: 4 steps of 2 support rows at 0.08 s = 0.32 s (pooled would say 0.48 s); it took 0.2 s
    assert factor == pytest.approx(1.0) and speedup == pytest.approx(0.32 / 0.2)
    g = gate()  # the gate files each plain cycle under its step's mix
    on_at(g, (2, support), 1.25, samples=3)
    on_at(g, (2, code), 1.25, samples=3)
    g.record_cycle(0.3, 2, 2, 2, 0)  # a step that did not begin: no mix
    assert g.episodes.plain_times(support) == g.episodes.plain_times(code) == {2: pytest.approx(0.1)}
    assert g.episodes.plain_times(frozenset()) == {2: pytest.approx(0.1)}  # one of its own: too few


def test_an_episode_with_enough_plain_cycles_of_its_own_is_priced_by_their_mean():
    """A lone lookup request whose steps without a match are plain: its plain time is its own plain
    cycles' mean (they are in its measured time), not the lower quartile of recent ones, which read
    such requests' whole speedups a few percent low, under the 5-10% they gain."""
    ep = Episodes()
    for _ in range(8):
        ep.record_cycle(0.09, 1, 1, 0)  # recent plain cycles: lower quartile 0.09
    feed(ep, {"a": 1}, joined=1, cycle=(None, 0, 0, 0), key=(1, frozenset()))
    for i in range(MIN_SELF):  # its own plain cycles: mean 0.1
        feed(ep, {"a": 1}, 0, cycle=(0.095 if i % 2 else 0.105, 1, 1, 0), key=(1, frozenset()))
    for _ in range(4):
        feed(ep, {"a": 2}, 0, cycle=(0.11, 1, 2, 2), key=(1, frozenset()))
    _, factor, speedup = feed(ep, {"b": 1}, joined=1, cycle=(None, 0, 0, 0), key=(1, frozenset()))
    # 16 tokens: plain 1.6 s at its own 0.1 s a step (1.44 s at the quartile); it took 0.8 + 0.44 s
    assert factor == pytest.approx(1.0) and speedup == pytest.approx(1.6 / 1.24)
    for i in range(MIN_SELF - 1):  # one plain cycle fewer: the recent ones' lower quartile
        feed(ep, {"b": 1}, 0, cycle=(0.1, 1, 1, 0), key=(1, frozenset()))
    for _ in range(3):
        feed(ep, {"b": 2}, 0, cycle=(0.11, 1, 2, 1), key=(1, frozenset()))
    _, _, speedup = feed(ep, {"c": 1}, joined=1, cycle=(None, 0, 0, 0), key=(1, frozenset()))
    assert speedup == pytest.approx(13 * ep.plain_times()[1] / (0.7 + 0.33))


@pytest.mark.parametrize("spoil", ["joined", "untimed"])
def test_a_row_that_joins_or_a_step_not_timed_spoils_the_episode(spoil):
    ep = Episodes()
    ep.record_cycle(0.1, 2, 2, 0)
    feed(ep, {"a": 1, "b": 1}, joined=2, cycle=(None, 0, 0, 0))
    feed(ep, {"a": 3, "b": 1}, 0, cycle=(0.2, 2, 4, 2))
    if spoil == "joined":  # a server admitting a row as another finishes: no tail to measure
        feed(ep, {"b": 1, "c": 1}, joined=1, cycle=(0.1, 1, 1, 1))
    else:
        feed(ep, {"b": 1}, 0, cycle=(None, 1, 1, 1))
    feed(ep, {"b": 1}, 0, cycle=(0.1, 1, 1, 1))
    assert feed(ep, {"x": 1}, joined=1, cycle=(None, 0, 0, 0)) is None


def test_an_episode_that_mostly_did_not_draft_says_nothing():
    ep = Episodes()
    feed(ep, {"a": 1, "b": 1}, joined=2, cycle=(None, 0, 0, 0))
    for _ in range(4):
        feed(ep, {"a": 1, "b": 1}, 0, cycle=(0.1, 2, 2, 0))
    feed(ep, {"a": 2, "b": 1}, 0, cycle=(0.12, 2, 3, 2))  # 1 drafting cycle of 5
    assert feed(ep, {"x": 1}, joined=1, cycle=(None, 0, 0, 0)) is None


def gate(**kw) -> StepGate:
    return StepGate(ControllerConfig(**{"gate_min_samples": 2, "gate_window": 4, **kw}))


def on_at(g: StepGate, key, speedup: float, samples: int = 4) -> None:
    """``samples`` paired cycles at ``key``, drafting ``speedup`` times faster than plain."""
    bucket, mix = key
    for _ in range(samples):
        g.begin(bucket, mix)
        g.record_cycle(0.1, bucket, bucket, bucket, 0)
        g.begin(bucket, mix)
        g.record_cycle(0.1 / speedup, bucket, bucket, bucket, bucket)


def test_a_tail_factor_switches_an_on_key_off_at_once_and_reads_in_its_verdict():
    g = gate()
    key = (8, frozenset({"support"}))
    on_at(g, key, 1.05)
    assert g.state(*key) == "on"
    g.record_episode(key, 0.87)  # whole batches at 1.05 * 0.87 = 0.91x
    assert g.state(*key) == "off" and g.factor(key) == pytest.approx(0.87)
    verdicts = [g.begin(*key) for _ in range(probe_interval(16, 8, MAX_BACKOFF) + 1)]  # the longest interval at once
    assert verdicts.count("probe") == 2 and verdicts[-2:] == ["probe", "probe"]
    other = (16, frozenset({"code"}))  # another bucket: nothing borrowed from bucket 8
    on_at(g, other, 1.05)
    g.record_episode(other, 1.3)  # a factor above 1 is read as 1: whole batches never promote
    assert g.state(*other) == "on" and g.factor(other) == 1.0
    dipped = (1, frozenset({"code"}))
    on_at(g, dipped, 1.2, samples=2)
    for seconds, drafted in [(0.2, 1), (0.1, 0), (0.2, 1)]:  # slow drafting cycles: 3 samples of 0.5x
        g.begin(*dipped)
        g.record_cycle(seconds, 1, 1, 1, drafted)
    assert g.stats()[1]["mixes"]["code"]["measured_speedup"] < 1 and g.state(*dipped) == "on"  # 1 of 2 to switch
    g.record_episode(dipped, 1.0)  # a whole batch at factor 1 does not turn the cycles' dip into a switch
    assert g.state(*dipped) == "on"
    readings = g.stats()[8]["mixes"]
    assert readings["support"]["tail_factor"] == pytest.approx(0.87) and readings["support"]["gate"] == "off"


def test_an_off_key_probes_after_the_interval_times_its_bucket_doubling_while_it_stays_off():
    for bucket in (1, 8, 32):
        g = gate(gate_probe_interval=4)  # one gate per bucket: a key off at a smaller one starts backed off
        key = (bucket, frozenset({"d"}))
        on_at(g, key, 0.5, samples=2)
        assert g.state(*key) == "off"
        starts, step = [], 0
        while step < 400:
            step += 1
            if g.begin(*key) != "probe":
                g.record_cycle(0.1, bucket, bucket, bucket, 0)
                continue
            starts.append(step)
            g.record_cycle(0.2, bucket, bucket, bucket, bucket)  # the catch-up step (not paired)
            assert g.begin(*key) == "probe"
            step += 1
            g.record_cycle(0.2, bucket, bucket, bucket, bucket)  # the measured one: 0.5x, the key stays off
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        base = 4 * min(bucket, 8)  # a probe drafts for every row: rarer at larger batches
        # each probe that leaves the key off doubles the wait, up to MAX_BACKOFF doublings
        expected = [(base << min(i + 1, MAX_BACKOFF)) + 1 for i in range(len(gaps))]
        assert gaps == expected and len(gaps) >= 2, bucket


# ---------------------------------------------------------- the real proposer

@pytest.mark.parametrize("joins", [False, True])
def test_the_proposer_reports_each_whole_batch_to_the_gate(make_config, tokenizer, target, target_dir, verifier,
                                                          joins):
    from accel_plugin.speculative import DomainProposer

    now = [0.0]
    config = make_config(f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\n"
                         "controller: {min_samples: 2, gate_min_samples: 2}\n")
    proposer = DomainProposer(config, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                              max_len=verifier.MAX_LEN, clock=lambda: now[0])
    propose = proposer.propose
    proposer.propose = lambda *a, **kw: (now.__setitem__(0, now[0] + 1.0), propose(*a, **kw))[1]
    prompt = tokenizer("Customer: my refund ticket #123 is late").input_ids
    first = [verifier.Request(list(prompt), 24), verifier.Request(list(prompt[:-1]), 8)]
    late = {3: [verifier.Request(list(prompt[:-2]), 6)]} if joins else None
    verifier.serve(proposer, target, first, arrivals=late)
    verifier.serve(proposer, target, [verifier.Request(list(prompt), 4)])  # its start ends the first batch
    factors = [m["tail_factor"] for m in proposer.step_stats()[2]["mixes"].values() if m["tail_factor"] is not None]
    if joins:  # a row joined the first batch: no whole batch to measure
        assert factors == []
    else:  # every step costs the same here: the short row's early end is no loss
        assert factors == [pytest.approx(1.0)]


def test_a_mix_with_no_whole_batch_of_its_own_borrows_its_buckets_factor():
    """The tail is the batch's: a new mix of a bucket whose whole batches lose is judged by
    their factor from its first verdict on, until whole batches of its own arrive."""
    g = gate()
    support, mixed, single = (8, frozenset({"support"})), (8, frozenset({"default", "support"})), (1, frozenset({"support"}))
    assert g.factor(mixed) == 1.0  # nothing measured anywhere
    for factor in (0.80, 0.90, 0.85):
        g.record_episode(support, factor)
    assert g.factor(mixed) == pytest.approx(0.85) and g.factor(single) == 1.0  # the same bucket only
    on_at(g, mixed, 1.10)  # cycles alone 1.10x: with the borrowed factor 0.94x
    assert g.state(*mixed) == "off"
    on_at(g, single, 1.10)
    assert g.state(*single) == "on"
    g.record_episode(mixed, 1.0)  # its own whole batch now: its own factor
    assert g.factor(mixed) == 1.0


def test_at_batch_1_a_key_borrows_no_factor():
    """A one-row step has no tail, and each of its keys is another entry's requests: a lookup whose long
    matches read 2.8x by its cycles and 1.3x whole has a factor of 0.46 that says nothing of a general
    lookup's (a compiled demo: `default/lookup` read 1.22x by its cycles, 0.7x borrowed, off; n-gram 1.12x)."""
    g = gate()
    repeat, general = (1, frozenset({"repeat/lookup"})), (1, frozenset({"default/lookup"}))
    on_at(g, repeat, 2.8)
    for _ in range(3):
        g.record_episode(repeat, 1.0, 1.3)
    assert g.factor(repeat) == pytest.approx(1.3 / 2.8)
    assert g.factor(general) == 1.0
    on_at(g, general, 1.22)
    assert g.state(*general) == "on"
    g.record_episode(general, 1.0, 1.1)  # its own requests: its own factor
    assert g.factor(general) == pytest.approx(1.1 / 1.22, rel=0.02) and g.state(*general) == "on"


def test_a_factor_arriving_in_the_bucket_switches_the_borrowing_mixes_off_at_once():
    g = gate()
    code, support = (8, frozenset({"code"})), (8, frozenset({"support"}))
    on_at(g, code, 1.05)
    on_at(g, support, 1.05)
    assert g.state(*code) == g.state(*support) == "on"
    g.record_episode(support, 0.85)
    assert g.state(*support) == "off" and g.state(*code) == "off"  # code had no whole batch of its own


def test_a_plain_price_is_the_lower_quartile_so_a_warm_ups_slow_cycles_do_not_price_later_batches():
    """An on key's plain cycles are few and mostly from the engine's first minute (a shape's
    first runs are slow): a sweep's drafting engine priced 8 rows at 91.5 ms by their median
    where a plain step of the same rows took 64-67 ms beside it."""
    ep = Episodes()
    for seconds in (0.0915, 0.0798, 0.0946):  # warm-up
        ep.record_cycle(seconds, 8, 8, 0)
    ep.record_cycle(0.0689, 8, 8, 0)  # a calibration step of the timed run
    assert ep.plain_times()[8] == pytest.approx(0.0689)
    key = (8, frozenset({"d"}))
    feed(ep, dict.fromkeys("abcdefgh", 1), joined=8, cycle=(None, 0, 0, 0), key=key)
    feed(ep, dict.fromkeys("abcdefgh", 2), 0, cycle=(0.11, 8, 16, 16), key=key)
    _, factor, speedup = feed(ep, {"x": 1}, joined=1, cycle=(None, 0, 0, 0), key=key)
    # plain: 2 steps of 8 rows at 68.9 ms = 0.1378 s against 0.11 s (by the median, 0.183 s: 1.66x)
    assert factor == pytest.approx(1.0) and speedup == pytest.approx(0.1378 / 0.11)
    steady = Episodes()
    for i in range(32):  # many cycles of a steady machine: 0.060 .. 0.0755 s
        steady.record_cycle(0.060 + 0.0005 * i, 2, 2, 0)
    assert steady.plain_times()[2] == pytest.approx(0.060 + 0.0005 * 7)  # the 8th of 32


def test_a_whole_batch_below_its_keys_cycles_sets_the_factor_so_probes_and_new_mixes_read_it():
    """Cycle samples over-read where the calibration steps that pair them are few and old: support
    at batch 8 read 1.24-1.43x by its cycles while its whole batches ran at 0.87-0.91x; by its
    cycles times its tail factor (1.24 x 0.86 = 1.07x) its probes would switch it back on."""
    g = gate()
    key = (8, frozenset({"support"}))
    on_at(g, key, 1.43)
    g.record_episode(key, 0.86, 0.87)
    assert g.state(*key) == "off" and g.factor(key) == pytest.approx(0.87 / 1.43)
    on_at(g, key, 1.24)  # probes: 1.24 x 0.61 = 0.75x, not 1.07x
    assert g.state(*key) == "off"
    mixed = (8, frozenset({"default", "support"}))
    on_at(g, mixed, 1.3)  # a new mix of the bucket borrows the factor
    assert g.state(*mixed) == "off"
    small = (1, frozenset({"support"}))  # a whole batch above its cycles keeps the tail factor
    on_at(g, small, 1.64)
    g.record_episode(small, 1.0, 2.0)
    assert g.state(*small) == "on" and g.factor(small) == 1.0
    early = (2, frozenset({"support"}))  # too few samples to read the cycles: the tail factor alone
    on_at(g, early, 1.2, samples=1)
    g.record_episode(early, 0.95, 0.9)
    assert g.factor(early) == pytest.approx(0.95)
