"""`accel demo`: argument validation, workload, table and verdicts from fake numbers,
and one small real run (vLLM CPU build, a few tokens)."""

from __future__ import annotations

import argparse
import json

import pytest

from accel_plugin.cli import build_parser, demo
from accel_plugin.cli.doctor import package_version


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
    assert flag in err and "must be an integer from" in err


@pytest.mark.parametrize("flag, value, valid", [("--backend", "fast", "flash"), ("--dtype", "fp8", "float32")])
def test_bad_choices_list_the_valid_values(capsys, flag, value, valid):
    with pytest.raises(SystemExit):
        parse(flag, value)
    err = capsys.readouterr().err
    assert flag in err and valid in err


def test_defaults():
    args = parse()
    assert (args.max_tokens, args.backend, args.dtype, args.json) == (64, "flash", "float32", None)
    assert (args.models / "drafts.yaml").exists()


def test_missing_models_dir_is_a_clear_error(tmp_path):
    args = parse("--models", str(tmp_path), "--skip-doctor")
    with pytest.raises(SystemExit) as exc:
        demo.run(args)
    assert "missing" in str(exc.value) and "--models" in str(exc.value)


def test_prompts_cover_every_domain_and_route_as_configured():
    models = demo.default_models_dir()
    prompts = demo.load_prompts(models / "prompts" / "bench.jsonl")
    assert set(prompts) == {"support", "code", "prose"}
    routes = demo.route_labels(models / "drafts.yaml", prompts)
    assert routes["support"] == {"routed": ["support"], "draft": "draft-support"}
    assert routes["prose"]["routed"] == ["default"]
    assert demo.route_labels(models / "drafts-untuned.yaml", prompts)["support"]["draft"] == "draft-general"
    warmup, timed = demo.workload(prompts, 2)
    assert [len(b) for b in warmup] == [8, 8, 8]
    assert [t["name"] for t in timed][:3] == ["support|1|0", "support|1|1", "support|8|0"]
    # warm-up and timed prompts are disjoint
    assert not set(warmup[0]) & {p for t in timed for p in t["prompts"]}


def _stats(steps, drafted, accepted, state="on", k=5):
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "state": state, "k": k, "k_max": 5,
            "alpha": accepted / drafted if drafted else None, "cost_ratio": 0.05, "propose_ms_per_step": 3.0}


def _result(tokens_per_s: dict, stats_per_run: list | None):
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
        runs.append({"name": f"{label}|{batch}|0", "seconds": generated / tps, "generated": generated,
                     "token_ids": [[1, 2, 3]] * batch, "stats": stats, "delta": delta,
                     "propose_steps": 10 if stats else 0, "propose_seconds": 0.03 if stats else 0.0})
    return {"startup_s": 3.0, "warmup_s": 5.0, "runs": runs,
            "after_warmup": {"support": _stats(0, 0, 0)} if stats_per_run else None,
            "final": stats_per_run[-1] if stats_per_run else None, "spec": {}}


def test_table_and_verdicts_from_fake_numbers():
    keys = [("support", 1), ("support", 8), ("code", 1)]
    plain = _result(dict(zip(keys, (100.0, 400.0, 100.0))), None)
    tuned = _result(dict(zip(keys, (250.0, 480.0, 110.0))), [
        {"support": _stats(10, 50, 45), "code": _stats(0, 0, 0)},
        {"support": _stats(20, 100, 90), "code": _stats(0, 0, 0)},
        {"support": _stats(20, 100, 90), "code": _stats(10, 50, 20, k=3)},
    ])
    untuned = _result(dict(zip(keys, (97.0, 360.0, 110.0))), [
        {"support": _stats(10, 10, 1, "off", 0), "code": _stats(0, 0, 0)},
        {"support": _stats(12, 12, 1, "off", 0), "code": _stats(0, 0, 0)},
        {"support": _stats(12, 12, 1, "off", 0), "code": _stats(10, 50, 20, k=3)},
    ])
    routes = {name: {"support": {"routed": ["support"], "draft": d}, "code": {"routed": ["code"], "draft": "g"}}
              for name, d in (("tuned", "draft-support"), ("untuned", "draft-general"))}
    report = demo.build_report({"plain": plain, "tuned": tuned, "untuned": untuned}, routes,
                               parse("--max-tokens", "64"))
    rows = {(r["domain"], r["batch"]): r for r in report["configs"]["tuned"]["rows"]}
    assert rows[("support", 1)]["ratio"] == pytest.approx(2.5)
    assert (rows[("support", 8)]["accepted"], rows[("support", 8)]["drafted"]) == (45, 50)  # the run's delta
    assert rows[("code", 1)]["proposer"]["code"]["k"] == 3
    goals = report["goals"]
    assert [g["met"] for g in goals] == [True, False, False, True]
    assert goals[1]["measured"] == pytest.approx(1.2)
    assert goals[2]["measured"] == pytest.approx(0.9)  # the worse batch of the poor-draft domain
    text = demo.render(report)
    assert "2.50x" in text and "[MET   ]" in text and "[MISSED]" in text
    assert "speculation switched off (in timed runs) for: support" in text
    json.dumps(report)  # --json writes exactly this


def test_verdicts_without_untuned_are_not_measured():
    goals = demo.verdicts({"tuned": {"rows": []}})
    assert all(g["met"] is None for g in goals)
    assert "--no-untuned" in goals[2]["detail"]


@pytest.mark.skipif(package_version("vllm") is None, reason="vLLM is not installed")
def test_small_real_run(tmp_path, capsys, monkeypatch):
    """Real vLLM, plain and tuned only, 4 tokens, 1 batch-1 prompt (about 40 s on 2 cores)."""
    from accel_plugin.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # conftest's 1 thread: the demo uses the machine

    out = tmp_path / "demo.json"
    rc = main(["demo", "--skip-doctor", "--no-untuned", "--max-tokens", "4", "--batch1-prompts", "1",
               "--repeats", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "tuned drafts" in text and "Goals" in text and "pure-torch reference" in text
    report = json.loads(out.read_text())
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
    spread = demo.timing_spread({"tuned": {"runs": [best]}})
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

    plain = demo.summarise(config([1.0, 1.5, 1.5]))[("support", 8)]
    spec = demo.summarise(config([1.05, 1.5, 1.5]))[("support", 8)]
    assert plain["rounds"] == [1.0, 1.5, 1.5] and plain["seconds"] == 1.5
    assert demo.per_round_ratios(plain, spec) == pytest.approx([1 / 1.05, 1.0, 1.0])
    assert demo.paired_ratio(plain, spec) == pytest.approx(1.0)
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
