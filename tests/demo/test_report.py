"""accel_plugin.demo.report: the side-by-side table, paired ratios and verdicts, from fake numbers."""

from __future__ import annotations

import json

import pytest

from accel_plugin.demo.report import (
    build_report,
    paired_ratio,
    per_round_ratios,
    render,
    summarise,
    verdicts,
)


def _stats(steps, drafted, accepted, state="on", k=5, c=0.05, predicted=2.0, draft="d"):
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "state": state, "k": k, "k_max": 5,
            "alpha": accepted / drafted if drafted else None, "cost_ratio": c, "propose_ms_per_step": 3.0,
            "draft": draft, "verify_overhead": 0.1,
            "costs_by_bucket": {str(b): {"state": state, "k": k, "c": c, "v": 0.1, "expected_speedup": predicted}
                                for b in (1, 8)}}


def _result(tokens_per_s: dict, stats_per_run: list | None, rounds: int = 1):
    """A fake run_side_by_side result for one configuration: one timed run per
    (label, batch); ``stats_per_run`` are the proposer's cumulative counters after
    each run, from which each run's delta is taken (as the worker does)."""
    runs, previous = [], {"support": _stats(0, 0, 0)}
    for i, ((label, batch), tps) in enumerate(tokens_per_s.items()):
        generated = 64 * batch
        stats = stats_per_run[i] if stats_per_run else None
        delta = {d: {key: s[key] - previous.get(d, {}).get(key, 0) for key in ("steps", "drafted", "accepted")}
                 for d, s in (stats or {}).items()}
        previous = stats or previous
        runs.append({"name": f"{label}|{batch}|0", "seconds": generated / tps, "seconds_all": [generated / tps] * rounds,
                     "generated": generated, "token_ids": [[1, 2, 3]] * batch, "stats": stats, "delta": delta,
                     "repeats_identical": True,
                     "propose_steps": 10 if stats else 0, "propose_seconds": 0.03 if stats else 0.0})
    return {"startup_s": 3.0, "warmup_s": 5.0, "runs": runs, "attention_backends": ["CPU_ATTN"],
            "parameters": 134_515_008, "after_warmup": {"support": _stats(0, 0, 0)} if stats_per_run else None,
            "final": stats_per_run[-1] if stats_per_run else None, "spec": {}}


SETTINGS = {"target_name": "t", "max_tokens": 64, "batch1_prompts": 1, "repeats": 1, "attention": "default",
            "dtype": "float32", "num_speculative_tokens": 5, "ignore_eos": False}


def test_table_and_verdicts_from_fake_numbers():
    keys = [("support", 1), ("support", 8), ("code", 1)]
    plain = _result(dict(zip(keys, (100.0, 400.0, 100.0))), None)
    tuned = _result(dict(zip(keys, (250.0, 480.0, 110.0))), [
        {"support": _stats(10, 50, 45, predicted=2.8), "code": _stats(0, 0, 0, draft="g")},
        {"support": _stats(20, 100, 90, predicted=1.6), "code": _stats(0, 0, 0, draft="g")},
        {"support": _stats(20, 100, 90, predicted=1.6), "code": _stats(10, 50, 20, k=3, c=0.06, draft="g"),
         "repeat/lookup": _stats(5, 20, 15, c=0.0004, draft="lookup")},
    ])
    untuned = _result(dict(zip(keys[:2], (97.0, 360.0))), [
        {"support": _stats(10, 10, 1, "off", 0, draft="u"), "code": _stats(0, 0, 0, draft="g")},
        {"support": _stats(12, 12, 1, "off", 0, draft="u"), "code": _stats(0, 0, 0, c=0.2, draft="g"),
         "repeat/lookup": _stats(5, 20, 15, c=0.0012, draft="lookup")},
    ])
    routes = {name: {"support": {"routed": ["support"], "draft": d}, "code": {"routed": ["code"], "draft": "g"}}
              for name, d in (("tuned", "draft-support"), ("untuned", "draft-untuned"))}
    tuned["compilation"] = "DYNAMO_TRACE_ONCE"  # read back by the worker (accel demo --compile)
    report = build_report({"plain": plain, "tuned": tuned, "untuned": untuned}, routes, SETTINGS, "support")
    rows = {(r["domain"], r["batch"]): r for r in report["configs"]["tuned"]["rows"]}
    assert rows[("support", 1)]["ratio"] == pytest.approx(2.5)
    assert (rows[("support", 8)]["accepted"], rows[("support", 8)]["drafted"]) == (45, 50)  # the run's delta
    assert rows[("code", 1)]["proposer"]["code"]["k"] == 3
    goals = {g["goal"].split(":")[0]: g for g in report["goals"]}
    met = [g["met"] for g in report["goals"]]
    assert met == [True, True, False, True, True, False]
    assert report["goals"][1]["measured"] == pytest.approx(1.2)  # 480 / 400: exactly the goal, met
    assert report["goals"][2]["measured"] == pytest.approx(0.9)  # the worse batch of the poor-draft domain
    assert report["goals"][4]["measured"] == pytest.approx(2.5 / 2.8)
    assert report["goals"][5]["measured"] == pytest.approx(1.2 / 1.6)
    assert goals  # every goal has a name
    agree = {e["draft"]: e["agree"] for e in report["cost_ratios"]}
    assert agree["g"] is False  # 0.06 vs 0.2: the same draft measured 3x apart is flagged
    assert agree["lookup"] is None  # host time of microseconds: no verdict
    text = render(report, {"tuned": "TUNED", "untuned": "UNTUNED"})
    assert "2.50x" in text and "[MET   ]" in text and "[MISSED]" in text and "134.5M parameters" in text
    assert "plain CPU_ATTN" in text and "DISAGREE" in text
    assert "tuned CPU_ATTN (compilation DYNAMO_TRACE_ONCE)" in text and "eager engines" in text
    assert "machine:" not in text  # a report without the CPU (older JSON) prints none
    json.dumps(report)  # --json writes exactly this
    report["settings"]["machine"] = {"cpu": {"model": "AMD EPYC 7B13", "arch": "x86_64", "cpus": 2, "isa": ["AVX2"]}}
    assert "\nmachine: AMD EPYC 7B13, 2 CPUs, x86_64 with AVX2\n" in render(report, {"tuned": "TUNED"})


def test_a_speed_goal_is_missed_when_outputs_differ():
    keys = [("support", 1)]
    plain = _result({keys[0]: 100.0}, None)
    tuned = _result({keys[0]: 300.0}, [{"support": _stats(10, 50, 45)}])
    tuned["runs"][0]["token_ids"] = [[9, 9, 9]]
    routes = {"tuned": {"support": {"routed": ["support"], "draft": "d"}}}
    report = build_report({"plain": plain, "tuned": tuned}, routes, SETTINGS, "support")
    first = report["goals"][0]
    assert first["measured"] == pytest.approx(3.0) and first["met"] is False and "NOT lossless" in first["detail"]


def test_verdicts_without_untuned_are_not_measured():
    goals = verdicts({"tuned": {"rows": []}}, "support")
    assert all(g["met"] is None for g in goals)
    assert "no untuned configuration" in goals[2]["detail"]


def test_ratio_is_the_median_of_paired_rounds():
    """A fast spell of the machine that only the plain engine caught (round 1) does
    not decide the verdict; the rounds where both ran alike do."""
    def config(seconds_all):
        return {"runs": [{"name": "support|8|0", "seconds": min(seconds_all), "seconds_all": seconds_all,
                          "generated": 512, "token_ids": [[1]] * 8}]}

    plain = summarise(config([1.0, 1.5, 1.5]))[("support", 8)]
    spec = summarise(config([1.05, 1.5, 1.5]))[("support", 8)]
    assert plain["rounds"] == [1.0, 1.5, 1.5] and plain["seconds"] == 1.5
    assert per_round_ratios(plain, spec) == pytest.approx([1 / 1.05, 1.0, 1.0])
    assert paired_ratio(plain, spec) == pytest.approx(1.0)
    # the fastest runs alone would have said 0.95x
    assert min(spec["rounds"]) / min(plain["rounds"]) == pytest.approx(1.05)


def _peer_results(ours: dict, ngram: dict, plain: dict, control: dict | None = None):
    plain_r = _result(plain, None)
    stats = [{"support": _stats(10 * (i + 1), 50 * (i + 1), 40 * (i + 1)), "repeat": _stats(0, 0, 0)}
             for i in range(len(ours))]
    tuned = _result(ours, stats)
    tuned["runs"][-1]["step_stats"] = {"1": {"gate": "on", "predicted_speedup": 1.9, "measured_speedup": 1.8,
                                             "samples": 40, "plain_step_ms": 10.0, "cycle_ms": 20.0,
                                             "draft_ms": 3.0, "host_ms": 0.4, "steps": 30},
                                       "8": {"gate": "off", "predicted_speedup": 0.97, "measured_speedup": 0.96,
                                             "samples": 12, "plain_step_ms": 12.0, "cycle_ms": 30.0,
                                             "draft_ms": 5.0, "host_ms": 0.6, "steps": 5}}
    ngram_r = _result(ngram, None)
    ngram_r["method"] = "ngram"
    routes = {"tuned": {label: {"routed": ["support"], "draft": "d"} for label, _ in ours}}
    settings = {**SETTINGS, "skipped_peers": {"suffix": "arctic_inference is not importable"}}
    results = {"plain": plain_r, "tuned": tuned, "ngram": ngram_r}
    if control is not None:
        results["plain-again"] = _result(control, None)
    return build_report(results, routes, settings, "support", peers=["ngram"])


def test_peer_verdicts_and_issue23_goals_from_fake_numbers():
    keys = [("support", 1), ("support", 8), ("repeat", 1), ("repeat", 8)]
    report = _peer_results(ours=dict(zip(keys, (190.0, 500.0, 150.0, 380.0))),
                           ngram=dict(zip(keys, (110.0, 400.0, 170.0, 386.0))),
                           plain=dict(zip(keys, (100.0, 400.0, 100.0, 400.0))))
    rows = {(r["domain"], r["batch"]): r for r in report["comparison"]}
    assert rows[("support", 1)]["ours_ratio"] == pytest.approx(1.9)
    assert rows[("support", 1)]["peers"]["ngram"]["ratio"] == pytest.approx(1.1)
    assert rows[("support", 1)]["ahead_of_peers"] and rows[("support", 1)]["never_slower"]
    assert not rows[("repeat", 1)]["ahead_of_peers"]  # 1.5 vs n-gram's 1.7
    assert rows[("repeat", 8)]["ahead_of_peers"]  # 0.95 vs 0.965: within the 0.02 margin
    assert not rows[("repeat", 8)]["never_slower"]  # 0.95x plain
    goals = {g["goal"].split(":")[0]: g for g in report["goals23"]}
    assert [g["met"] for g in report["goals23"]] == [False, False, True, True, False, None, True]
    assert report["goals23"][0]["measured"] == pytest.approx(0.95) and len(goals) == 6
    assert report["goals23"][1]["measured"] == pytest.approx(1.5 - 1.7)
    assert report["goals23"][3]["measured"] == pytest.approx(1.25)  # 500 / 400 >= 1.2
    assert report["goals23"][4]["measured"] == pytest.approx(min(1.5 - 1.7, 0.95 - 0.965))
    assert "suffix not run" in report["goals23"][1]["detail"]
    assert report["goals23"][5]["detail"] == "not measured"  # no support-free set in this run
    text = render(report, {"tuned": "TUNED"})
    assert "ours (tuned drafts) beside vLLM's own speculators" in text
    assert "behind ngram" in text and "ahead of every peer" in text and "SLOWER than plain" in text
    # a row below plain says whether it drafted at all (none: plain's work, so the machine's noise)
    assert rows[("repeat", 8)]["drafted"] == 50 and "(drafted no token)" not in text
    assert report["goals23"][0]["detail"] == "3/4 rows"
    from accel_plugin.demo.compare import goals23, render_comparison

    rows[("repeat", 8)]["drafted"] = 0
    assert goals23(report["comparison"], "support")[0]["detail"] == (
        "3/4 rows; 1 of the rows below drafted no token (plain's work)")
    assert "SLOWER than plain (drafted no token)" in "\n".join(render_comparison(report["comparison"], ["ngram"], {}))
    assert "suffix: not run (arctic_inference is not importable)" in text
    assert "batch 8: predicted 0.97x, measured 0.96x, gate off" in text and "host 0.60 ms" in text
    assert "(method ngram)" in text and "Goals of issue 23" in text
    assert "\nngram\n" not in text  # a peer has no proposer table of its own
    json.dumps(report)


def test_the_control_engine_is_printed_beside_every_row_and_changes_no_verdict():
    keys = [("support", 1), ("support", 8)]
    plain = dict(zip(keys, (100.0, 400.0)))
    args = {"ours": dict(zip(keys, (190.0, 380.0))), "ngram": dict(zip(keys, (110.0, 370.0))), "plain": plain}
    without = _peer_results(**args)
    report = _peer_results(**args, control=dict(zip(keys, (104.0, 376.0))))
    rows = {(r["domain"], r["batch"]): r for r in report["comparison"]}
    assert rows[("support", 1)]["control_ratio"] == pytest.approx(1.04)
    assert rows[("support", 8)]["control_ratio"] == pytest.approx(0.94)
    assert [g["met"] for g in report["goals23"]] == [g["met"] for g in without["goals23"]]
    assert report["goals23"][0]["detail"] == "1/2 rows; a second plain engine read 0.94-1.04x plain on the same rows"
    assert without["goals23"][0]["detail"] == "1/2 rows"
    assert all(r["control_ratio"] is None for r in without["comparison"])
    text = render(report, {"tuned": "TUNED"})
    assert "control = a second plain engine, same settings, started first of all, against plain: 0.94-1.04x" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("support") and " 8 " in x and "ahead" in x)
    assert "0.95x   0.94x" in line  # ours, then the control
    assert "\nplain-again\n" not in text and "control =" not in render(without, {"tuned": "TUNED"})


def test_issue23_goals_without_peers_or_sets_are_not_measured():
    from accel_plugin.demo.compare import goals23

    goals = goals23([], "support", skipped={"ngram": "asked not to"})
    assert all(g["met"] is None for g in goals)
    assert "ngram not run (asked not to)" in goals[1]["detail"]
    from accel_plugin.demo.compare import step_lines

    assert "batch 4: predicted -, measured -, gate warmup" in step_lines({"4": {"gate": "warmup"}})[0]
    assert "not reported" in step_lines(None)[0]
    mixes = {"support": {"gate": "off", "measured_speedup": 1.05, "samples": 9, "steps": 40, "tail_factor": 0.87,
                         "whole_speedup": 0.93},
             "-": {"gate": "warmup", "steps": 3}, "code": {"gate": "on", "steps": 0},
             "general": {"gate": "off", "inherited": 4, "steps": 12},
             "general+support": {"gate": "off", "inherited": 8, "steps": 2}}
    lines = step_lines({"8": {"gate": "off", "mixes": mixes}})
    assert lines[1:] == ["    mix support: gate off, measured 1.05x, whole batches x0.87 tail, 0.93x drafting "
                         "(40 steps, 9 samples)",
                         "    mix general: gate off (from batch 4), measured -, whole batches x- tail, - drafting "
                         "(12 steps, 0 samples)",
                         "    mix general+support: gate off (each of its domains off alone), measured -, whole "
                         "batches x- tail, - drafting (2 steps, 0 samples)"]


def test_differing_peer_outputs_miss_the_lossless_goal():
    keys = [("support", 1)]
    report = _peer_results(ours={keys[0]: 190.0}, ngram={keys[0]: 110.0}, plain={keys[0]: 100.0})
    assert report["goals23"][-1]["met"] is True
    from accel_plugin.demo.compare import goals23

    report["comparison"][0]["peers"]["ngram"]["lossless"] = False
    last = goals23(report["comparison"], "support")[-1]
    assert last["met"] is False and last["measured"] == pytest.approx(0.5)


def test_a_rows_prompt_lookup_counts_as_drafting_apart_from_its_draft():
    from accel_plugin.demo.compare import comparison

    stats = {"repeat": _stats(4, 0, 0, state="no-draft"), "repeat/lookup": _stats(4, 12, 9)}
    run = {"name": "repeat|8|0", "seconds": 1.0, "seconds_all": [1.0], "generated": 64, "token_ids": [[1]] * 8,
           "stats": stats, "delta": {"repeat": {"steps": 4, "drafted": 0, "accepted": 0},
                                     "repeat/lookup": {"steps": 4, "drafted": 12, "accepted": 9}}}
    entry = summarise({"runs": [run]}, {"repeat": ["repeat"]})[("repeat", 8)]
    assert (entry["drafted"], entry["lookup_drafted"]) == (0, 12)  # the draft's acceptance stays the draft's
    row = {"domain": "repeat", "batch": 8, "plain_tokens_per_s": 64.0, "spec_tokens_per_s": 60.0, "ratio": 0.94,
           "identical_outputs": 8, "outputs": 8, "acceptance": None, "drafted": 0, "lookup_drafted": 12}
    assert comparison({"tuned": {"rows": [row]}}, [])[0]["drafted"] == 12  # it drafted: no "(drafted no token)"
    row["lookup_drafted"] = 0
    assert comparison({"tuned": {"rows": [row]}}, [])[0]["drafted"] == 0


def test_a_rows_prompt_lookup_is_in_the_table_with_its_state_k_cap_and_prediction():
    # a lookup-only domain (repeat) read "repeat->none ... 0/0 ... no-draft" in the table while its
    # lookup drafted every row: the table names the lookup, its tokens, state, k and cap at the row's
    # batch, and predicts by the lookup where no draft model drafted
    def lookup(steps, drafted, accepted, lifted, pinned=False):
        s = _stats(steps, drafted, accepted, k=4, c=0.001, predicted=1.7, draft="lookup")
        s["costs_by_bucket"]["8"].update(k=5, expected_speedup=1.4, cap_lifted=lifted, cap_pinned=pinned)
        s["costs_by_bucket"]["1"].update(cap_lifted=lifted, cap_pinned=pinned)
        return s

    keys = [("repeat", 1), ("repeat", 8), ("support", 8)]
    plain = _result(dict(zip(keys, (100.0, 400.0, 400.0))), None)
    no_draft = _stats(0, 0, 0, state="no-draft", k=0, predicted=None, draft=None)
    support = _stats(10, 40, 30, predicted=1.25)
    tuned = _result(dict(zip(keys, (160.0, 430.0, 420.0))), [
        {"repeat": no_draft, "repeat/lookup": lookup(10, 30, 20, True), "support": _stats(0, 0, 0)},
        {"repeat": no_draft, "repeat/lookup": lookup(20, 50, 30, False, True), "support": _stats(0, 0, 0)},
        {"repeat": no_draft, "repeat/lookup": lookup(20, 50, 30, False, True), "support": support,
         "support/lookup": lookup(4, 6, 3, False)},
    ])
    routes = {"tuned": {"repeat": {"routed": ["repeat"], "draft": None},
                        "support": {"routed": ["support"], "draft": "support"}}}
    report = build_report({"plain": plain, "tuned": tuned}, routes, SETTINGS, "support")
    rows = {(r["domain"], r["batch"]): r for r in report["configs"]["tuned"]["rows"]}
    one, eight, both = rows[("repeat", 1)], rows[("repeat", 8)], rows[("support", 8)]
    assert (one["drafted"], one["lookup_drafted"], one["lookup_accepted"]) == (0, 30, 20)
    assert one["lookups"]["repeat"]["cap"] == "lifted" and eight["lookups"]["repeat"]["cap"] == "pinned"
    assert (eight["lookup_drafted"], eight["lookup_accepted"], eight["lookups"]["repeat"]["k"]) == (20, 10, 5)
    assert eight["predicted_speedup"] == pytest.approx(1.4)  # the lookup's S at batch 8, not at batch 1
    assert both["predicted_speedup"] == pytest.approx(1.25)  # a draft model drafted: the draft's
    assert both["lookups"]["support"]["cap"] == "capped"
    table = render(report, {"tuned": "TUNED"})
    line = next(x for x in table.splitlines() if x.startswith("  repeat ") and " 8 " in x)
    assert "repeat->lookup" in line and line.endswith("no-draft; lookup 10/20 on k=5 capped (taken back)")
    line = next(x for x in table.splitlines() if x.startswith("  support ") and " 8 " in x)
    assert "support->support " in line and line.endswith("on; lookup 3/6 on k=5 capped")


def test_free_style_acceptance_is_the_goal_domains_draft_pooled_by_draft_tokens():
    # the free-style set's rows route partly to the default domain (another draft): the goal reads
    # the goal domain's draft on both sets, draft tokens pooled over batch 1 and 8 (not a mean of
    # the two batches' rates: a batch whose gate is off drafts a few probe tokens)
    from accel_plugin.demo.compare import goals23

    def row(domain, batch, by_domain, routed):
        return {"domain": domain, "batch": batch, "ours_ratio": 1.0, "never_slower": True, "best_peer": None,
                "ahead_of_peers": True, "lossless": True, "peers": {}, "by_domain": by_domain, "routed": routed}

    rows = [row("support", 1, {"support": (200, 130)}, ["support"]),
            row("support", 8, {"support": (0, 0)}, ["support"]),
            row("support-free", 1, {"support": (150, 90), "default": (100, 30)}, ["default", "support"]),
            row("support-free", 8, {"support": (10, 10), "default": (0, 0)}, ["default", "support"])]
    goal = next(g for g in goals23(rows, "support") if "support-free acceptance" in g["goal"])
    assert goal["measured"] == pytest.approx(100 / 160 - 130 / 200) and goal["met"] is True
    assert goal["detail"] == ("0.62 vs 0.65 (160 and 200 draft tokens; the timed rows, batch 1 and 8); every draft "
                              "0.50 vs 0.65 (support-free routed to default+support)")
    rows[2]["by_domain"]["support"] = (150, 60)
    goal = next(g for g in goals23(rows, "support") if "support-free acceptance" in g["goal"])
    assert goal["measured"] == pytest.approx(70 / 160 - 0.65) and goal["met"] is False


def test_free_style_acceptance_reads_the_untimed_pass_over_both_whole_sets():
    from accel_plugin.demo.compare import goals23
    from accel_plugin.demo.report import acceptance_pass

    def untimed(label, delta, prompts=24):
        return {"name": f"{label}|accept", "token_ids": [[1]] * prompts, "delta": delta}

    tuned = {"untimed": [
        untimed("support", {"support": {"steps": 90, "drafted": 400, "accepted": 240}}),
        untimed("support-free", {"support": {"steps": 80, "drafted": 300, "accepted": 195},
                                 "default": {"steps": 20, "drafted": 40, "accepted": 10},
                                 "support/lookup": {"steps": 5, "drafted": 9, "accepted": 9},  # not a draft model
                                 "code": {"steps": 0, "drafted": 0, "accepted": 0}})]}
    routes = {"support-free": {"routed": ["default", "support"], "draft": "general/support"}}
    passed = acceptance_pass(tuned, routes)
    assert passed["support-free"] == {"prompts": 24, "routed": ["default", "support"],
                                      "by_domain": {"default": (40, 10), "support": (300, 195)}}
    # the timed rows say otherwise (one prompt each): the whole sets decide
    rows = [{"domain": d, "batch": 1, "ours_ratio": 1.0, "never_slower": True, "best_peer": None, "lossless": True,
             "peers": {}, "by_domain": {"support": (100, n)}, "routed": ["support"]} for d, n in
            (("support", 65), ("support-free", 48))]
    goal = next(g for g in goals23(rows, "support", acceptance=passed) if "support-free acceptance" in g["goal"])
    assert goal["measured"] == pytest.approx(0.65 - 0.60) and goal["met"] is True
    assert goal["detail"] == ("0.65 vs 0.60 (300 and 400 draft tokens; every prompt of each set (24 and 24) at batch 1, "
                              "untimed); every draft 0.60 vs 0.60 (support-free routed to default+support)")
    without = next(g for g in goals23(rows, "support") if "support-free acceptance" in g["goal"])
    assert without["measured"] == pytest.approx(0.48 - 0.65) and without["met"] is False
    # a pass over one set only cannot compare: the rows decide
    only = next(g for g in goals23(rows, "support", acceptance={"support": passed["support"]})
                if "support-free acceptance" in g["goal"])
    assert only["measured"] == pytest.approx(0.48 - 0.65)
