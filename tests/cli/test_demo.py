"""`accel demo`: argument validation, workload, table and verdicts from fake numbers,
and one small real run (vLLM CPU build, a few tokens)."""

from __future__ import annotations

import argparse
import json

import pytest

from accel_plugin.cli import demo
from accel_plugin.cli.doctor import package_version
from accel_plugin.cli.main import build_parser
from accel_plugin.demo.family import default_models_dir, load_family
from accel_plugin.demo.plan import DemoSettings
from accel_plugin.demo.report import timing_spread

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
    assert demo.settings_from_args(parse("--no-control")) == DemoSettings(control=False)
    assert demo.settings_from_args(parse("--compile")) == DemoSettings(compile=True)


@pytest.mark.parametrize("change, needle", [
    ({"max_tokens": 0}, "--max-tokens: must be >= 1 and <= 256; got 0"),
    ({"repeats": 2.0}, "--repeats: expected an integer >= 1 and <= 9; got 2.0"),
    ({"attention": "fast"}, "--attention: must be one of default, flash, paged; got 'fast'"),
])
def test_settings_name_the_flag_and_the_valid_values(change, needle):
    with pytest.raises(ValueError) as exc:
        DemoSettings(**change)
    assert needle in str(exc.value)


def test_unknown_peers_are_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--peers", "ngram,medusa")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--peers" in err and "'medusa'" in err and "ngram, suffix" in err
    assert demo.settings_from_args(parse("--no-peers")).peers == ()
    assert demo.settings_from_args(parse("--peers", "ngram")).peers == ("ngram",)
    with pytest.raises(ValueError, match="--peers: unknown peer"):
        DemoSettings(peers=("eagle",))


def test_a_peer_whose_package_is_missing_is_not_run_and_says_why():
    from accel_plugin.demo.peers import PEERS, peer_configs

    run, skipped = peer_configs(("ngram", "suffix"), has_module=lambda module: False)
    assert run == {"ngram": PEERS["ngram"]} and "arctic_inference" in skipped["suffix"]
    assert "ACCEL_DEMO_SUFFIX_PATH" in skipped["suffix"]
    run, skipped = peer_configs(("suffix",), has_module=lambda module: module == "arctic_inference")
    assert run == {"suffix": PEERS["suffix"]} and skipped == {}


def test_the_workers_pythonpath_takes_the_suffix_path_first(tmp_path):
    import os
    import sys

    from accel_plugin.demo.peers import worker_has_module, worker_pythonpath

    env = {"ACCEL_DEMO_SUFFIX_PATH": f"/a{os.pathsep}/b", "PYTHONPATH": "/c"}
    assert worker_pythonpath(env) == os.pathsep.join(["/a", "/b", "/c"])
    (tmp_path / "only_here_pkg.py").write_text("")
    assert not worker_has_module("only_here_pkg", {**os.environ, "PYTHONPATH": ""})
    assert worker_has_module("only_here_pkg", {**os.environ, "ACCEL_DEMO_SUFFIX_PATH": str(tmp_path)})
    assert sys.executable  # the probe runs this interpreter


def test_missing_family_is_a_clear_error(tmp_path):
    args = parse("--models", str(tmp_path), "--skip-doctor")
    with pytest.raises(SystemExit) as exc:
        demo.run(args)
    assert "family.json" in str(exc.value) and "--models" in str(exc.value)


@pytest.mark.skipif(package_version("vllm") is None, reason="vLLM is not installed")
def test_small_real_run(tmp_path, capsys, monkeypatch):
    """Real vLLM, plain, tuned, vLLM's n-gram peer and the control (a second plain engine), 4 tokens, 1
    batch-1 prompt (about a minute on 2 cores)."""
    from accel_plugin.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # conftest's 1 thread: the demo uses the machine

    out = tmp_path / "demo.json"
    rc = main(["demo", "--skip-doctor", "--models", str(TOY), "--no-untuned", "--max-tokens", "4",
               "--batch1-prompts", "1", "--repeats", "1", "--peers", "ngram", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "tuned drafts" in text and "Goals" in text and "vLLM's own default backend" in text
    report = json.loads(out.read_text())
    # read back from each engine: vLLM's own CPU attention, the toy target's parameters
    assert all(e["attention_backends"] == ["CPU_ATTN"] for e in report["engines"].values()), report["engines"]
    assert report["engines"]["plain"]["parameters"] > 10_000_000
    rows = report["configs"]["tuned"]["rows"]
    assert {(r["domain"], r["batch"]) for r in rows} == ({(d, b) for d in ("support", "code", "prose") for b in (1, 8)}
                                                          | {("mixed", 8)})
    assert all(r["plain_tokens_per_s"] > 0 and r["spec_tokens_per_s"] > 0 for r in rows)
    assert sum(r["identical_outputs"] for r in rows) >= 1
    # vLLM's own n-gram speculator ran beside ours, and said so itself
    assert report["engines"]["ngram"]["method"] == "ngram" and report["engines"]["tuned"]["method"] == "custom_class"
    assert "ours (tuned drafts) beside vLLM's own speculators" in text and "Goals of issue 23" in text
    compared = {(r["domain"], r["batch"]): r for r in report["comparison"]}
    assert set(compared) == {(d, b) for d in ("support", "code", "prose") for b in (1, 8)} | {("mixed", 8)}
    assert all(r["peers"]["ngram"]["tokens_per_s"] > 0 for r in compared.values())
    # the control, a second plain engine, ran every row beside them
    assert report["engines"]["plain-again"]["method"] is None
    assert all(r["control_ratio"] > 0 for r in compared.values()) and "control = a second plain engine" in text


@pytest.mark.skipif(package_version("vllm") is None, reason="vLLM is not installed")
def test_untimed_entries_run_once_after_the_rounds_prompt_by_prompt_on_their_engines(monkeypatch):
    """Real vLLM, the toy family: an untimed entry runs once, on the engines it names, one prompt
    at a time, and its proposer counters come back (what the free-style goal reads)."""
    from accel_plugin.adapters.vllm.demo import run_side_by_side
    from accel_plugin.demo.family import load_prompts

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    family = load_family(TOY)
    support = load_prompts(family)["support"][:3]
    results = run_side_by_side(TOY / family.target, {"plain": None, "tuned": family.config_path("tuned")},
                               warmup=[], timed=[{"name": "support|8|0", "prompts": support}], repeats=2,
                               untimed=[{"name": "support|accept", "prompts": support, "configs": ["tuned"]}],
                               max_tokens=6, ignore_eos=True, timeout_s=300)
    assert "untimed" not in results["plain"]
    [run] = results["tuned"]["untimed"]
    assert run["name"] == "support|accept" and run["generated"] == 18 and len(run["token_ids"]) == 3
    assert run["delta"]["support"]["drafted"] > 0 and run["delta"]["support"]["steps"] > 0
    # not timed: the timed runs are the rounds' alone
    assert [len(r["seconds_all"]) for r in results["tuned"]["runs"]] == [2]


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

        def timed(self, name, prompts, one_at_a_time=False):
            return {"name": name, "n": len(prompts), "each": one_at_a_time}

    monkeypatch.setattr(worker, "_Engine", FakeEngine)
    lines = []
    monkeypatch.setattr(worker, "_emit", lambda kind, payload: lines.append((kind, payload)))
    stdin = io.StringIO("".join(json.dumps(c) + "\n" for c in (
        {"name": "a", "prompts": ["x", "y"]}, {"name": "b", "prompts": ["x"], "one_at_a_time": True}, {"quit": True},
        {"name": "never", "prompts": []})))
    assert worker.serve({"target": "t", "warmup": [["w"]]}, stdin=stdin) == 0
    assert [k for k, _ in lines] == ["READY", "RESULT", "RESULT", "DONE"]
    assert lines[1][1] == {"name": "a", "n": 2, "each": False} and FakeEngine.warmed == [["w"]]
    assert lines[2][1] == {"name": "b", "n": 1, "each": True}


@pytest.mark.skipif(package_version("vllm") is None, reason="vLLM is not installed")
def test_a_failing_engine_is_reported_with_its_output(tmp_path):
    from accel_plugin.adapters.vllm.demo import run_side_by_side

    with pytest.raises(RuntimeError) as exc:
        run_side_by_side(tmp_path / "no-such-model", {"plain": None}, warmup=[], timed=[], timeout_s=300)
    assert "plain: vLLM worker exited" in str(exc.value) and "no-such-model" in str(exc.value)


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
    from accel_plugin.cli import main
    from accel_plugin.plugins import manager

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
