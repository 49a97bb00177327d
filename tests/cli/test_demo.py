"""`accel demo`: argument validation, workload, table and verdicts from fake numbers,
and one small real run (vLLM CPU build, a few tokens)."""

from __future__ import annotations

import argparse
import json

import pytest

from accel_plugin.cli import build_parser, demo
from accel_plugin.cli.doctor import package_version
from accel_plugin.demo.family import default_models_dir, load_family, load_prompts, route_labels, workload
from accel_plugin.demo.plan import DemoSettings
from accel_plugin.demo.report import build_report, paired_ratio, per_round_ratios, render, summarise, timing_spread, verdicts

TOY = default_models_dir().parent  # demo_models: the toy family


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["demo", *argv])


@pytest.mark.parametrize("flag, value", [
    ("--max-tokens", "0"), ("--max-tokens", "-3"), ("--max-tokens", "lots"), ("--max-tokens", "100000"),
    ("--repeats", "0"), ("--batch1-prompts", "9"),
])
def test_bad_numbers_name_the_valid_range(capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        parse(flag, value)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and ">= 1 and <= " in err and repr(value) in err


@pytest.mark.parametrize("flag, value, valid", [("--attention", "fast", "default"), ("--dtype", "fp8", "float32")])
def test_bad_choices_list_the_valid_values(capsys, flag, value, valid):
    with pytest.raises(SystemExit):
        parse(flag, value)
    err = capsys.readouterr().err
    assert flag in err and valid in err


def test_defaults_are_the_real_model_and_vllms_own_attention():
    args = parse()
    assert (args.max_tokens, args.attention, args.dtype, args.repeats, args.json) == (64, "default", "float32", 3, None)
    family = load_family(args.models)
    assert family.target == {"model_store": "smollm2"} and family.chat and not family.ignore_eos
    assert not family.problems()


def test_settings_defaults_are_the_flags_defaults():
    assert demo.settings_from_args(parse()) == DemoSettings()
    assert demo.settings_from_args(parse("--no-untuned", "--repeats", "1")) == DemoSettings(untuned=False, repeats=1)


@pytest.mark.parametrize("change, needle", [
    ({"max_tokens": 0}, "--max-tokens: must be >= 1 and <= 256; got 0"),
    ({"repeats": 2.0}, "--repeats: expected an integer >= 1 and <= 9; got 2.0"),
    ({"attention": "fast"}, "--attention: must be one of default, flash, paged; got 'fast'"),
])
def test_settings_name_the_flag_and_the_valid_values(change, needle):
    with pytest.raises(ValueError) as exc:
        DemoSettings(**change)
    assert needle in str(exc.value)


def test_missing_family_is_a_clear_error(tmp_path):
    args = parse("--models", str(tmp_path), "--skip-doctor")
    with pytest.raises(SystemExit) as exc:
        demo.run(args)
    assert "family.json" in str(exc.value) and "--models" in str(exc.value)


def test_toy_family_prompts_route_as_configured():
    family = load_family(TOY)
    prompts = load_prompts(family)
    assert set(prompts) == {"support", "code", "prose"}
    routes = route_labels(family.config_path("tuned"), prompts)
    assert routes["support"] == {"routed": ["support"], "draft": "draft-support"}
    assert routes["prose"]["routed"] == ["default"]
    assert route_labels(family.config_path("untuned"), prompts)["support"]["draft"] == "draft-general"


def test_smollm2_held_out_prompts_route_to_their_domain():
    """The router sees the decoded chat-templated prompt; plain text is enough here
    (the template adds no word the YAML matches)."""
    family = load_family(default_models_dir())
    prompts = load_prompts(family)
    assert set(prompts) == {"support", "code", "general"} and all(len(p) == 24 for p in prompts.values())
    for name, draft in (("tuned", "support"), ("untuned", "support-untuned")):
        routes = route_labels(family.config_path(name), prompts)
        assert routes["support"] == {"routed": ["support"], "draft": draft}
        assert routes["code"] == {"routed": ["code"], "draft": "code"}
        assert routes["general"] == {"routed": ["default"], "draft": "general"}


def test_workload_keeps_the_poor_engine_cold_on_the_goal_domain():
    prompts = {d: [f"{d}{i}" for i in range(24)] for d in ("support", "code")}
    warmup, timed = workload(prompts, 2, configs=["plain", "tuned", "untuned"], goal_domain="support",
                             poor_config="untuned")
    assert [len(b) for b in warmup["plain"]] == [8, 8] and warmup["untuned"] == [prompts["code"][-8:]]
    assert [t["name"] for t in timed][:3] == ["support|1|0", "support|1|1", "support|8|0"]
    assert all(t["configs"] == ["plain", "tuned", "untuned"] for t in timed if t["name"].startswith("support"))
    assert all(t["configs"] == ["plain", "tuned"] for t in timed if t["name"].startswith("code"))
    # warm-up and timed prompts are disjoint
    assert not {p for b in warmup["plain"] for p in b} & {p for t in timed for p in t["prompts"]}


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
        {"support": _stats(20, 100, 90, predicted=1.6), "code": _stats(10, 50, 20, k=3, c=0.06, draft="g")},
    ])
    untuned = _result(dict(zip(keys[:2], (97.0, 360.0))), [
        {"support": _stats(10, 10, 1, "off", 0, draft="u"), "code": _stats(0, 0, 0, draft="g")},
        {"support": _stats(12, 12, 1, "off", 0, draft="u"), "code": _stats(0, 0, 0, c=0.2, draft="g")},
    ])
    routes = {name: {"support": {"routed": ["support"], "draft": d}, "code": {"routed": ["code"], "draft": "g"}}
              for name, d in (("tuned", "draft-support"), ("untuned", "draft-untuned"))}
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
    text = render(report, {"tuned": "TUNED", "untuned": "UNTUNED"})
    assert "2.50x" in text and "[MET   ]" in text and "[MISSED]" in text and "134.5M parameters" in text
    assert "plain CPU_ATTN" in text and "DISAGREE" in text
    json.dumps(report)  # --json writes exactly this


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


@pytest.mark.skipif(package_version("vllm") is None, reason="vLLM is not installed")
def test_small_real_run(tmp_path, capsys, monkeypatch):
    """Real vLLM, plain and tuned only, 4 tokens, 1 batch-1 prompt (about 40 s on 2 cores)."""
    from accel_plugin.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # conftest's 1 thread: the demo uses the machine

    out = tmp_path / "demo.json"
    rc = main(["demo", "--skip-doctor", "--models", str(TOY), "--no-untuned", "--max-tokens", "4",
               "--batch1-prompts", "1", "--repeats", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "tuned drafts" in text and "Goals" in text and "vLLM's own default backend" in text
    report = json.loads(out.read_text())
    # read back from each engine: vLLM's own CPU attention, the toy target's parameters
    assert all(e["attention_backends"] == ["CPU_ATTN"] for e in report["engines"].values()), report["engines"]
    assert report["engines"]["plain"]["parameters"] > 10_000_000
    rows = report["configs"]["tuned"]["rows"]
    assert {(r["domain"], r["batch"]) for r in rows} == {(d, b) for d in ("support", "code", "prose") for b in (1, 8)}
    assert all(r["plain_tokens_per_s"] > 0 and r["spec_tokens_per_s"] > 0 for r in rows)
    assert sum(r["identical_outputs"] for r in rows) >= 1


def test_repeats_keep_the_fastest_run_and_sum_the_counters():
    from accel_plugin.adapters.vllm.demo import _best

    def run(seconds, drafted, state):
        return {"name": "support|1|0", "seconds": seconds, "generated": 64, "token_ids": [[seconds]],
                "propose_steps": 10, "propose_seconds": 0.01,
                "delta": {"support": {"steps": 2, "drafted": drafted, "accepted": 1}},
                "stats": {"support": {"state": state}}}

    best = _best([run(2.0, 5, "on"), run(1.5, 4, "on"), run(3.0, 0, "off")])
    assert best["seconds"] == 1.5 and best["token_ids"] == [[1.5]]  # the fastest run's time and outputs
    assert best["seconds_all"] == [2.0, 1.5, 3.0]
    assert best["delta"]["support"] == {"steps": 6, "drafted": 9, "accepted": 3}  # every repeat counts
    assert (best["propose_steps"], best["propose_seconds"]) == (30, pytest.approx(0.03))
    assert best["stats"]["support"]["state"] == "off"  # the state after the last repeat
    spread = timing_spread({"tuned": {"runs": [best]}})
    assert spread == {"ratio": 2.0, "config": "tuned", "run": "support|1|0"}


def test_worker_protocol(monkeypatch):
    """serve(): READY after the warm-up, one RESULT per command line, DONE at the end."""
    import io

    from accel_plugin.adapters.vllm import demo as worker

    class FakeEngine:  # stands in for vLLM here; test_small_real_run drives the real one
        startup_s, spec, llm = 1.0, None, None
        warmed = []

        def __init__(self, target, **kwargs):
            pass

        def generate(self, prompts):
            self.warmed.append(prompts)

        def stats(self):
            return None

        def facts(self):
            return {"attention_backends": ["X"], "parameters": 1}

        def timed(self, name, prompts):
            return {"name": name, "n": len(prompts)}

    monkeypatch.setattr(worker, "_Engine", FakeEngine)
    lines = []
    monkeypatch.setattr(worker, "_emit", lambda kind, payload: lines.append((kind, payload)))
    stdin = io.StringIO(json.dumps({"name": "a", "prompts": ["x", "y"]}) + "\n" + json.dumps({"quit": True}) + "\n"
                        + json.dumps({"name": "never", "prompts": []}) + "\n")
    assert worker.serve({"target": "t", "warmup": [["w"]]}, stdin=stdin) == 0
    assert [k for k, _ in lines] == ["READY", "RESULT", "DONE"]
    assert lines[1][1] == {"name": "a", "n": 2} and FakeEngine.warmed == [["w"]]


@pytest.mark.skipif(package_version("vllm") is None, reason="vLLM is not installed")
def test_a_failing_engine_is_reported_with_its_output(tmp_path):
    from accel_plugin.adapters.vllm.demo import run_side_by_side

    with pytest.raises(RuntimeError) as exc:
        run_side_by_side(tmp_path / "no-such-model", {"plain": None}, warmup=[], timed=[], timeout_s=300)
    assert "plain: vLLM worker exited" in str(exc.value) and "no-such-model" in str(exc.value)


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


def test_a_worker_that_died_is_reported_when_sent_work():
    from accel_plugin.adapters.vllm.demo import _Worker

    worker = _Worker("tuned", {}, {}, timeout_s=60)
    worker.proc.kill()  # stands in for a crashed engine
    worker.proc.wait()
    with pytest.raises(RuntimeError, match="tuned: vLLM worker exited"):
        for _ in range(100):  # the pipe may take a write or two to report the broken end
            worker.send({"name": "x", "prompts": ["p" * 65536]})
    worker.close()


def test_without_an_adapter_answering_the_demo_stops_with_a_message(tmp_path, capsys, monkeypatch):
    """The core reaches vLLM's runner only through the accel_demo_harness hook."""
    from accel_plugin.plugins import manager
    from accel_plugin.cli import main

    real = manager.load_plugins

    def without_adapter(environ=None):
        plugins = real(environ)
        plugins.pm.unregister(name="accel.vllm")
        return plugins

    monkeypatch.setattr(manager, "load_plugins", without_adapter)
    rc = main(["demo", "--skip-doctor", "--models", str(TOY), "--no-untuned", "--max-tokens", "4",
               "--batch1-prompts", "1", "--repeats", "1"])
    assert rc == 1
    assert "no installed accel plugin provides a demo for vLLM" in capsys.readouterr().out
