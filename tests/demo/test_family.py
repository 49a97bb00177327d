"""accel_plugin.demo.family: demo model families, their prompts, routing and the workload."""

from __future__ import annotations

import pytest

from accel_plugin.demo.family import (
    default_models_dir,
    load_family,
    load_prompts,
    route_labels,
    workload,
)

TOY = default_models_dir().parent  # demo_models: the toy family


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
    assert set(prompts) == {"support", "code", "general", "support-free", "repeat"}
    assert all(len(p) == 24 for p in prompts.values())
    for name, draft in (("tuned", "support"), ("untuned", "support-untuned")):
        routes = route_labels(family.config_path(name), prompts)
        assert routes["support"] == {"routed": ["support"], "draft": draft}
        assert routes["code"] == {"routed": ["code"], "draft": "code"}
        assert routes["general"] == {"routed": ["default"], "draft": "general"}
        # the free-style set reaches the default domain too (words the keywords miss): both drafts named
        assert routes["support-free"] == {"routed": ["default", "support"], "draft": f"general/{draft}"}


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


def test_a_prompt_set_whose_file_is_absent_is_skipped_not_fatal(tmp_path):
    import json
    import shutil

    root = tmp_path / "fam"
    shutil.copytree(default_models_dir(), root, ignore=shutil.ignore_patterns("drafts", "*-tune.jsonl"))
    raw = json.loads((root / "family.json").read_text())
    raw["prompts"]["later"] = "prompts/not-written-yet.jsonl"
    (root / "family.json").write_text(json.dumps(raw))
    family = load_family(root)
    assert family.problems() == [] and family.missing_sets() == ["later"]
    assert "later" not in load_prompts(family)
    raw["prompts"]["support"] = "prompts/gone.jsonl"  # the goal domain's set must be there
    (root / "family.json").write_text(json.dumps(raw))
    assert any("gone.jsonl" in p for p in load_family(root).problems())


def test_the_mixed_batch_takes_every_set_in_turn():
    from accel_plugin.demo.family import mixed_batch

    prompts = {d: [f"{d}{i}" for i in range(24)] for d in ("a", "b", "c")}
    assert mixed_batch(prompts) == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2"]
    _, timed = workload(prompts, 1, configs=["plain", "tuned", "untuned"], goal_domain="a", poor_config="untuned",
                        mixed=True)
    assert timed[-1] == {"name": "mixed|8|0", "prompts": mixed_batch(prompts), "configs": ["plain", "tuned"]}


def test_the_plan_reads_acceptance_over_both_whole_support_sets_untimed_on_ours_only():
    # the timed rows hold one prompt of each set at batch 1 (and the gate may be off at batch 8):
    # the free-style goal needs the goal domain's draft over both whole sets
    import dataclasses

    from accel_plugin.demo.plan import DemoSettings, plan_demo

    family = dataclasses.replace(load_family(default_models_dir()), chat=False)  # no tokenizer needed
    plan = plan_demo(DemoSettings(peers=()), family, default_models_dir(), has_module=lambda name: False)
    assert [(e["name"], len(e["prompts"]), e["configs"]) for e in plan.untimed] == [
        ("support|accept", 24, ["tuned"]), ("support-free|accept", 24, ["tuned"])]
    assert plan.harness_arguments()["untimed"] is plan.untimed
    assert any("the 24 prompts of support-free one at a time" in line for line in plan.describe("x"))
    toy = plan_demo(DemoSettings(peers=()), load_family(TOY), TOY / "models" / "target", has_module=lambda name: False)
    assert toy.untimed == []  # no free-style set: nothing to compare
    # the first engine started read slower than later identical ones: the control starts first, not the baseline
    assert list(plan.configs)[:3] == ["plain-again", "plain", "tuned"]
    alone = plan_demo(DemoSettings(peers=(), control=False), load_family(TOY), TOY, has_module=lambda name: False)
    assert list(alone.configs) == ["plain", "tuned", "untuned"]
    # eager engines unless --compile (vLLM's CPU default), said before they start and passed to every worker
    assert alone.harness_arguments()["compile"] is False and any("engines: eager" in x for x in alone.describe("x"))
    compiled = plan_demo(DemoSettings(peers=(), compile=True), load_family(TOY), TOY, has_module=lambda name: False)
    assert compiled.harness_arguments()["compile"] is True
    assert any("engines: compiled, vLLM's CPU default" in x for x in compiled.describe("x"))


def test_the_benchmarks_prompt_set_names_the_valid_sets_when_absent():
    from accel_plugin.demo.family import FamilyError
    from accel_plugin.demo.plan import open_prompt_set

    with pytest.raises(FamilyError, match=r"--set: 'nope' is not a prompt set of .*; valid: support, code"):
        open_prompt_set(default_models_dir(), "nope")
