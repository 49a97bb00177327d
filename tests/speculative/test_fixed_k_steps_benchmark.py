"""``benchmarks/fixed_k_steps.py``: its fixed-k draft YAMLs load as the proposer reads them (the
family's drafts, absolute paths, ``adaptive: false``), bad ``--ks`` are refused, and its table
reads the harness's results. The engines themselves run in ``python -m benchmarks.fixed_k_steps``
(docs/speculative.md records a run); the harness is integration-tested by the demo's tests."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from accel_plugin.speculative.draft_config import load_draft_config
ROOT = Path(__file__).resolve().parents[2]
FAMILY = ROOT / "demo_models" / "smollm2"
_spec = importlib.util.spec_from_file_location("fixed_k_steps", ROOT / "benchmarks" / "fixed_k_steps.py")
fixed_k_steps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixed_k_steps)


def test_a_fixed_config_keeps_the_family_drafts_at_a_fixed_k(tmp_path):
    path = fixed_k_steps.fixed_config(FAMILY / "drafts.yaml", 2, tmp_path)
    config = load_draft_config(path)
    assert config.num_speculative_tokens == 2 and not config.controller.adaptive
    drafts = {name: d.draft for name, d in config.domains.items() if d.draft}
    assert drafts and all(Path(p).is_absolute() and Path(p).is_dir() for p in drafts.values())
    assert Path(config.default.draft) == (FAMILY / "drafts" / "general").resolve()


@pytest.mark.parametrize("text", ["0", "1,x", "", "17"])
def test_bad_k_values_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated k values 1..16"):
        fixed_k_steps.k_list(text)


def test_rows_read_steps_tokens_and_propose_time_from_the_harness():
    def result(seconds, generated, steps=0, propose=0.0):
        run = {"name": "fixed|2|0", "seconds": seconds, "seconds_all": [seconds, seconds], "generated": generated,
               "token_ids": [[1] * (generated // 2)] * 2, "propose_steps": steps, "propose_seconds": propose}
        return {"runs": [run]}

    plain = result(2.0, 40)
    ours = fixed_k_steps.row("k=1", result(1.0, 40, steps=20, propose=0.1), plain, 2)  # counters: both rounds
    assert ours["steps"] == 10 and ours["tokens_per_step"] == 2.0 and ours["step_ms"] == 100.0
    assert ours["propose_ms"] == pytest.approx(5.0) and ours["ratio"] == pytest.approx(2.0)
    base = fixed_k_steps.row("plain", plain, None, 2)
    assert base["steps"] == 20 and base["tokens_per_step"] == 1.0 and base["propose_ms"] is None
    assert "k=1" in fixed_k_steps.render([base, ours])


def test_the_engines_are_named_with_what_they_really_ran():
    """Both benchmarks print ``engine_lines`` of the harness's results before their table."""
    from accel_plugin.demo.report import engine_lines

    lines = engine_lines({"plain": {"attention_backends": ["CPU_ATTN"], "method": None, "compilation": "NONE"},
                          "k=1": {"attention_backends": ["CPU_ATTN"], "method": "custom_class",
                                  "compilation": "DYNAMO_TRACE_ONCE",
                                  "target_products": ["121 target matrices with a copy"]}})
    assert lines == ["attention backend each engine used (read back): plain CPU_ATTN (compilation NONE); k=1 CPU_ATTN "
                     "(method custom_class) (compilation DYNAMO_TRACE_ONCE)",
                     "target products of k=1 (read back): 121 target matrices with a copy"]


@pytest.mark.parametrize("flags, compiled", [([], False), (["--compile"], True)])
def test_engines_are_eager_unless_compile_is_given(monkeypatch, flags, compiled):
    import accel_plugin.adapters.vllm.demo as harness

    seen = {}

    def fake_run(target, configs, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")  # only the engines' settings are under test

    monkeypatch.setattr(harness, "run_side_by_side", fake_run)
    with pytest.raises(RuntimeError, match="stop here"):
        fixed_k_steps.main(["--ks", "1", "--models", str(FAMILY), *flags])
    assert seen["compile"] is compiled and seen["max_num_seqs"] == 16
