"""The step gate and the step model (accel_plugin/speculative/step_gate.py), driven in
the order DomainProposer drives the controller, on a simulated clock whose target
step time depends on the batch and the drafts it verifies; and, with the real
proposer and verifier, that the gate only changes k (greedy outputs stay exact)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from accel_plugin.speculative import DomainProposer
from accel_plugin.speculative.controller import DomainController
from accel_plugin.speculative.domain_stats import DomainState
from accel_plugin.speculative.draft_config.schema import ControllerConfig
from accel_plugin.speculative.costs import measured_speedup
from accel_plugin.speculative.step_gate import MAX_BACKOFF, SETTLED, GateState, StepGate, probe_interval
from accel_plugin.speculative.step_model import plan_step, step_speedup


@dataclass
class Target:
    """True costs (seconds): plain step, extra per draft token per row, draft forward per draft."""

    plain_s: float = 0.1
    verify_per_token: float = 0.02  #: fraction of a plain step per draft token per row
    draft_s: dict[str, float] = field(default_factory=dict)  #: draft -> one forward (any sub-batch)
    host_s: float = 0.002  #: propose() host work per call
    jitter: float = 0.03


def drive(ctl: DomainController, target: Target, rows: list[str], alphas: dict[str, float], steps: int,
          drafts: dict[str, str], seed: int = 0, log: list | None = None) -> list[dict[str, int]]:
    """``steps`` proposer calls on a fixed batch; returns the k per domain of every call."""
    rng = random.Random(seed)
    t, last_start, prev, verified, out, propose_end = 0.0, None, None, 0, [], 0.0

    def noisy(s: float) -> float:
        return s * math.exp(rng.gauss(0.0, target.jitter))

    for _ in range(steps):
        start = t
        tokens = 0
        if prev is not None:
            for domain, k in zip(rows, prev):
                accepted = 0
                while accepted < k and rng.random() < alphas[domain]:
                    accepted += 1
                ctl.observe(domain, k, accepted)
                tokens += accepted + 1
            ctl.record_step(start - propose_end, len(rows), verified)
            ctl.record_cycle(start - last_start, len(rows), tokens, verified)
        ctl.step(len(rows), set(rows), rows)
        ks = [ctl.k_for(d) for d in rows]
        ctl.end_step(set(rows))
        t += noisy(target.host_s)
        by_draft: dict[str, int] = {}
        for domain, k in zip(rows, ks):
            if k:
                by_draft[drafts[domain]] = max(by_draft.get(drafts[domain], 0), k)
        draft_seconds = 0.0
        for draft, k in by_draft.items():
            per_forward = noisy(target.draft_s[draft])
            draft_seconds += per_forward * k
            ctl.record_draft(draft, sum(1 for d, kk in zip(rows, ks) if kk and drafts[d] == draft), per_forward)
        t += draft_seconds
        verified = sum(ks)
        ctl.record_call(len(rows), t - start, draft_seconds, verified)
        last_start, prev, propose_end = start, ks, t
        t += noisy(target.plain_s * (1 + target.verify_per_token * verified / len(rows)))
        out.append(dict(zip(rows, ks)))
    return out


def controller(drafts: dict[str, str], **kw) -> DomainController:
    return DomainController(ControllerConfig(**kw), drafts, {d: 4 for d in drafts})


def drafting_share(ks: list[dict[str, int]], domain: str) -> float:
    return sum(1 for k in ks if k.get(domain)) / len(ks)


ONE = {"good": "/d/good"}


def test_gate_switches_a_bucket_off_when_drafting_cycles_are_slower_though_the_formula_says_on():
    # the true c is 0.6, but the size band (c_size 0.01) clamps it to 0.04: the per-domain
    # formula (and the step model) predict ~1.4x; the measured cycles say ~0.9x
    ctl = controller(ONE)
    ctl.set_target_bytes(100)
    ctl.set_draft_bytes("/d/good", 1)
    ks = drive(ctl, Target(draft_s={"/d/good": 0.06}), ["good"] * 8, {"good": 0.5}, 400, ONE)
    stats = ctl.step_stats()[8]
    assert ctl.state("good")[0] == DomainState.ON  # the per-domain formula says on ...
    assert stats["predicted_speedup"] > 1.2
    assert stats["gate"] == "off" and stats["measured_speedup"] < 1.0  # ... the step says off
    late = ks[200:]
    # off: plain steps but the probes (2 steps in gate_probe_interval = 16)
    assert drafting_share(late, "good") <= 2 / 16 + 0.02
    assert drafting_share(late, "good") > 0  # probes re-measure


def test_gate_stays_on_where_drafting_pays_and_prediction_meets_measurement():
    ctl = controller(ONE)
    ks = drive(ctl, Target(draft_s={"/d/good": 0.005}), ["good"] * 8, {"good": 0.8}, 300, ONE)
    stats = ctl.step_stats()[8]
    assert stats["gate"] == "on" and stats["measured_speedup"] > 1.3
    assert stats["predicted_speedup"] == pytest.approx(stats["measured_speedup"], rel=0.25)
    assert drafting_share(ks[100:], "good") > 0.9  # calibration steps are rare by then
    assert set(stats) == {"gate", "predicted_speedup", "measured_speedup", "samples", "plain_step_ms",
                          "cycle_ms", "draft_ms", "host_ms", "steps", "mixes"}
    assert set(stats["mixes"]) == {"good"} and stats["mixes"]["good"]["gate"] == "on"
    assert stats["plain_step_ms"] > 0 and stats["cycle_ms"] > stats["plain_step_ms"] and stats["steps"] == 300


def test_mixed_batch_drops_the_draft_that_serves_one_row_of_eight():
    drafts = {"good": "/d/good", "mid": "/d/mid"}
    ctl = controller(drafts)
    ks = drive(ctl, Target(draft_s={"/d/good": 0.005, "/d/mid": 0.02}), ["good"] * 7 + ["mid"],
               {"good": 0.8, "mid": 0.6}, 300, drafts)
    assert ctl.state("mid")[0] == DomainState.ON  # alone, at c = 0.2, mid would pay (1.3x) ...
    late = ks[150:]
    assert drafting_share(late, "mid") < 0.05  # ... for one row of eight it does not
    assert drafting_share(late, "good") > 0.9
    assert ctl.step_stats()[8]["gate"] == "on"


def test_one_verdict_per_domain_mix_at_the_same_bucket():
    # batch 8 of "good" pays (cheap draft, high acceptance); batch 8 of "poor" loses by the
    # measured cycles though its formula says on (c clamped by the size band). Alternating
    # sets of 8, as a server's traffic or the demo's prompt sets do: the pooled median of
    # the bucket would be one verdict for both; the gate keeps one per mix.
    drafts = {"good": "/d/good", "poor": "/d/poor"}
    ctl = controller(drafts)
    ctl.set_target_bytes(100)
    ctl.set_draft_bytes("/d/poor", 1)
    target = Target(draft_s={"/d/good": 0.004, "/d/poor": 0.06})
    alphas = {"good": 0.85, "poor": 0.5}
    late_good, late_poor = [], []
    for rnd in range(8):
        late_good += drive(ctl, target, ["good"] * 8, alphas, 60, drafts, seed=2 * rnd)[20:]
        late_poor += drive(ctl, target, ["poor"] * 8, alphas, 60, drafts, seed=2 * rnd + 1)[20:]
    mixes = ctl.step_stats()[8]["mixes"]
    assert mixes["good"]["gate"] == "on" and mixes["good"]["measured_speedup"] > 1.3
    assert mixes["poor"]["gate"] == "off" and mixes["poor"]["measured_speedup"] < 1.0
    assert ctl.step_stats()[8]["gate"] == "per-mix"
    assert drafting_share(late_good[-100:], "good") > 0.9
    assert drafting_share(late_poor[-100:], "poor") <= 2 / 16 + 0.05  # probes only


def test_plan_step_keeps_the_subset_that_pays():
    counts, alphas = {"a": 7, "b": 1}, {"a": 0.8, "b": 0.6}
    draft_of, ks, k_max = {"a": "A", "b": "B"}, {"a": 2, "b": 2}, {"a": 4, "b": 4}
    costs = {"a": 0.05, "b": 0.2}
    plan, s = plan_step(8, ks, counts, alphas, costs, draft_of, lambda per_row: 0.02 * per_row, 0.0, k_max)
    assert plan["b"] == 0 and plan["a"] >= 1
    both = step_speedup(8, {"a": plan["a"], "b": 1}, counts, alphas, costs, draft_of,
                        lambda per_row: 0.02 * per_row, 0.0)
    assert s > both > 1.0
    # a large host cost makes every plan lose: the caller then drafts nothing
    _, s = plan_step(8, ks, counts, alphas, costs, draft_of, lambda per_row: 0.02 * per_row, 5.0, k_max)
    assert s < 1.0
    # two domains sharing one draft pay its forwards once
    shared = step_speedup(8, {"a": 2, "b": 2}, counts, alphas, costs, {"a": "A", "b": "A"}, lambda _: 0.0, 0.0)
    apart = step_speedup(8, {"a": 2, "b": 2}, counts, alphas, costs, draft_of, lambda _: 0.0, 0.0)
    assert shared > apart


def test_probes_reopen_a_bucket_when_drafting_gets_cheap():
    ctl = controller(ONE, gate_probe_interval=4)  # probes after 4 x 8 = 32 steps, doubling up to 256
    ctl.set_target_bytes(100)
    ctl.set_draft_bytes("/d/good", 1)
    target = Target(draft_s={"/d/good": 0.06})
    drive(ctl, target, ["good"] * 8, {"good": 0.5}, 300, ONE)
    assert ctl.step_stats()[8]["gate"] == "off"
    target.draft_s["/d/good"] = 0.002
    ks = drive(ctl, target, ["good"] * 8, {"good": 0.5}, 1000, ONE, seed=1)
    assert ctl.step_stats()[8]["gate"] == "on"
    assert drafting_share(ks[800:], "good") > 0.8


def test_early_calibration_stops_where_the_gate_is_settled():
    """Early calibration steps (plain, to pair with drafting ones: one in 8 until a key has
    gate_window samples) stop where the key is on well above break-even: a request of a
    domain that doubles the speed should not run one step in 8 without drafts to confirm it."""
    ctl = controller(ONE)
    ks = drive(ctl, Target(draft_s={"/d/good": 0.005}), ["good"], {"good": 0.8}, 64, ONE)
    assert ctl.gate.settled(1, {"good"}) and ctl.gate.samples(1, {"good"}) < ctl.cfg.gate_window
    assert [i for i, k in enumerate(ks) if not k["good"]] == [1, 3]  # the first samples only
    # a key near break-even is not settled: its calibration goes on
    ctl = controller(ONE)
    ks = drive(ctl, Target(draft_s={"/d/good": 0.02}), ["good"], {"good": 0.5}, 200, ONE)
    assert ctl.step_stats()[1]["gate"] == "on" and not ctl.gate.settled(1, {"good"})
    assert ctl.step_stats()[1]["measured_speedup"] < ctl.cfg.min_speedup * SETTLED


def test_gate_pairs_only_cycles_of_the_same_rows_and_breaks_on_untimed():
    gate = StepGate(ControllerConfig())
    gate.record_cycle(1.0, 8, 8, 8, 0)  # plain, 8 tokens/s
    gate.record_cycle(1.0, 7, 8, 14, 7)  # drafting, other rows: no pair
    assert gate.samples(8) == 0
    gate.record_cycle(1.0, 8, 8, 16, 8)  # drafting, same rows: 2x
    gate.record_cycle(None, 8, 8, 8, 0)  # a prefill: breaks the pairing
    gate.record_cycle(1.0, 8, 8, 8, 8)
    assert gate.samples(8) == 1 and gate.stats()[8]["measured_speedup"] == 2.0


def test_the_measured_speedup_is_the_mean_token_gain_not_the_median_step():
    """At batch 1 a drafting cycle emits accepted + 1 tokens: where most steps accept nothing
    and the others accept every draft, drafting pays though the median step loses."""
    gate = StepGate(ControllerConfig(gate_min_samples=4, gate_window=16))
    for tokens in (1, 3, 1, 3, 1, 1, 3, 1):  # 5 of 8 steps accept nothing: 1.75 tokens a step
        gate.record_cycle(1.0, 1, 1, 1, 0)  # plain: 1 token/s
        gate.record_cycle(1.25, 1, 1, tokens, 2)  # drafting k = 2: 25% slower
        gate.record_cycle(None, 1, 1, 1, 0)  # untimed: one sample per pair
    assert gate.samples(1) == 8
    assert gate.stats()[1]["measured_speedup"] == pytest.approx(1.75 / 1.25)  # median step: 1 / 1.25
    assert gate.state(1) == GateState.ON
    assert measured_speedup([]) is None
    assert measured_speedup([(1.0, 0.5), (2.0, 0.9), (3.0, 0.7)]) == pytest.approx(2.0 * 0.7)


def test_config_refuses_a_gate_that_cannot_decide():
    with pytest.raises(ValueError, match="gate_min_samples"):
        ControllerConfig(gate_min_samples=20, gate_window=16)


# ---------------------------------------------------------- the real proposer

def test_gate_only_changes_k_greedy_outputs_stay_exact(make_config, tokenizer, target, target_dir, verifier,
                                                        monkeypatch):
    now = [0.0]
    config = make_config(f"num_speculative_tokens: 2\ndefault: {{draft: {target_dir}}}\n"
                         "controller: {min_samples: 2, gate_min_samples: 2, gate_probe_interval: 4}\n")
    proposer = DomainProposer(config, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                              max_len=verifier.MAX_LEN, clock=lambda: now[0])
    # every draft call costs 10 s of the fake clock, a target step 1 s: drafting cycles lose
    draft = proposer.engine.draft
    monkeypatch.setattr(proposer.engine, "draft", lambda *a: (now.__setitem__(0, now[0] + 10.0), draft(*a))[1])
    propose = proposer.propose
    monkeypatch.setattr(proposer, "propose",
                        lambda *a, **kw: (now.__setitem__(0, now[0] + 1.0), propose(*a, **kw))[1])
    texts = ["Customer: my refund ticket #123 is late", "The model is"]
    reqs = [verifier.Request(tokenizer(t).input_ids, 40) for t in texts]
    trace = verifier.serve(proposer, target, reqs)
    assert [r.output for r in reqs] == [verifier.plain_greedy(target, r.prompt, 40) for r in reqs]
    stats = proposer.step_stats()
    assert stats[2]["gate"] == "off" and stats[2]["measured_speedup"] < 1.0
    late = [p for p in trace.proposals if p.call > 6]  # the gate's verdict comes within a few calls
    assert late and sum(1 for p in late if p.drafts) < len(late) / 2


def test_a_domains_prompt_lookup_counts_as_the_domain_in_the_step_mix_of_several_rows():
    # lookup matches come and go from step to step: one batch of support rows is one key
    drafts = {"support": "/d/support", "support/lookup": "lookup", "repeat": None, "repeat/lookup": "lookup"}
    ctl = DomainController(ControllerConfig(), drafts, dict.fromkeys(drafts, 4))
    for rows in (["support"] * 8, ["support"] * 6 + ["support/lookup"] * 2, ["support/lookup"] * 8):
        ctl.step(len(rows), set(rows), rows)
        ctl.end_step(set(rows))
    ctl.step(2, {"repeat", "repeat/lookup"}, ["repeat", "repeat/lookup"])  # a lookup-only domain: its entry
    assert set(ctl.step_stats()[8]["mixes"]) == {"support"} and ctl.step_stats()[8]["steps"] == 3
    assert set(ctl.step_stats()[2]["mixes"]) == {"repeat"}
    # but a one-row step is one entry: its draft and its lookup get a verdict each
    for rows in (["support"], ["support/lookup"], ["support"]):
        ctl.step(1, set(rows), rows)
        ctl.end_step(set(rows))
    assert set(ctl.step_stats()[1]["mixes"]) == {"support", "support/lookup"}


def test_a_larger_batch_starts_off_where_a_smaller_one_of_the_same_mix_lost():
    # drafting loses at batch 4 by the measured cycles (the formula says on: c clamped by the
    # size band); batch 8 of the same domain starts from that verdict, without a warm-up of
    # drafting steps, and its own samples (from probes) decide once it has gate_min_samples
    # probes after 4 x 8 = 32 steps at batch 8, backed off twice at once: 128 steps
    ctl = controller(ONE, gate_probe_interval=4)
    ctl.set_target_bytes(100)
    ctl.set_draft_bytes("/d/good", 1)
    target = Target(draft_s={"/d/good": 0.06})
    drive(ctl, target, ["good"] * 4, {"good": 0.5}, 200, ONE)
    assert ctl.step_stats()[4]["gate"] == "off"
    ks = drive(ctl, target, ["good"] * 8, {"good": 0.5}, 127, ONE, seed=1)
    assert drafting_share(ks, "good") == 0  # no warm-up at batch 8: off until its first probe
    mix = ctl.step_stats()[8]["mixes"]["good"]
    assert mix["gate"] == "off" and mix["inherited"] == 4
    # drafting gets cheap: the probes' own samples switch batch 8 on (its own first verdict)
    target.draft_s["/d/good"] = 0.002
    ks = drive(ctl, target, ["good"] * 8, {"good": 0.5}, 900, ONE, seed=2)
    assert ctl.step_stats()[8]["gate"] == "on"
    assert drafting_share(ks[-100:], "good") > 0.8


def paired_cycles(g: StepGate, key, speedup: float, pairs: int = 3) -> None:
    """``pairs`` plain and drafting cycles of 8 rows at ``key``, drafting at ``speedup`` x plain."""
    for seconds, drafted in [(0.1, 0), (0.1 / speedup, 8)] * pairs:
        g.begin(*key)
        g.record_cycle(seconds, 8, 8, 8, drafted)


def test_a_new_mix_starts_off_where_each_of_its_domains_alone_is_off_at_its_bucket():
    g = StepGate(ControllerConfig(gate_min_samples=2, gate_window=4))

    def measured(key, speedup: float) -> None:
        paired_cycles(g, key, speedup)

    code, support, general = (frozenset({n}) for n in ("code", "support", "general"))
    measured((8, code), 0.8)
    measured((8, support), 0.8)
    measured((8, general), 1.3)
    assert [g.state(8, m) for m in (code, support, general)] == ["off", "off", "on"]
    assert g.begin(8, code | support) == "off"  # no warm-up of drafting steps: both lost alone
    mix = g.stats()[8]["mixes"]["code+support"]
    assert mix["gate"] == "off" and mix["inherited"] == 8
    assert g.begin(8, code | general) == "warmup"  # general pays alone
    assert g.begin(8, code | frozenset({"repeat"})) == "warmup"  # repeat never seen alone here
    assert g.begin(1, code | support) == "warmup"  # another bucket: nothing known alone there
    measured((8, code | support), 1.3)  # its own probes' samples decide (here: on)
    assert g.state(8, code | support) == "on"


def test_an_inherited_off_switches_on_only_past_the_hysteresis_as_any_off_key():
    # a mix that starts off (each of its domains lost alone) and whose probes read 1.02x: a
    # warm-up's verdict (at min_speedup) would switch it on; an off key needs 1.05x, twice in a row
    g = StepGate(ControllerConfig(gate_min_samples=2, gate_window=4))

    def measured(key, speedup: float, pairs: int = 3) -> None:
        paired_cycles(g, key, speedup, pairs)

    code, support = frozenset({"code"}), frozenset({"support"})
    measured((8, code), 0.8)
    measured((8, support), 0.8)
    assert g.begin(8, code | support) == "off"
    # its probes start backed off, as a key that starts from a smaller bucket's off: every 512 steps at batch 8
    interval = probe_interval(16, 8, MAX_BACKOFF)
    later = [g.begin(8, code | support) for _ in range(interval - 1)]
    assert later == ["off"] * (interval - 2) + ["probe"] and interval == 512
    measured((8, code | support), 1.02, pairs=4)
    assert g.state(8, code | support) == "off"
    measured((8, code | support), 1.2)
    assert g.state(8, code | support) == "on"


def test_a_larger_batch_warms_up_where_the_smaller_one_pays():
    ctl = controller(ONE)
    target = Target(draft_s={"/d/good": 0.005})
    drive(ctl, target, ["good"] * 4, {"good": 0.8}, 200, ONE)
    assert ctl.step_stats()[4]["gate"] == "on"
    ks = drive(ctl, target, ["good"] * 8, {"good": 0.8}, 100, ONE, seed=1)
    assert ctl.step_stats()[8]["mixes"]["good"]["inherited"] is None
    assert drafting_share(ks, "good") > 0.8
