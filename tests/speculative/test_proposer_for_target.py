"""DomainProposer.for_target (one way for every adapter to build the proposer) and
DomainProposer.stats_dict (the per-domain report both adapters return)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from accel_plugin.speculative import DomainProposer, DraftTarget
from accel_plugin.speculative.draft_config import ConfigIssue, DraftConfigError
from accel_plugin.speculative.draft_format import checkpoint_parameters


def write_yaml(tmp_path, text: str):
    path = tmp_path / "drafts.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def one_domain(tmp_path, draft_dir, *, k=3, dtype="auto"):
    return write_yaml(tmp_path, f"""
        num_speculative_tokens: {k}
        dtype: {dtype}
        domains:
          support:
            draft: {draft_dir}
            match: {{keywords: [refund]}}
        default:
          draft: null
    """)


def detokenize(ids):
    return " ".join(map(str, ids))


def test_built_from_the_yaml_for_the_target(tmp_path, target_dir, draft_dir):
    target = DraftTarget(model_dir=target_dir, dtype=torch.bfloat16, max_len=96, framework_k=3)
    proposer = DomainProposer.for_target(one_domain(tmp_path, draft_dir), target, detokenize=detokenize,
                                         initial_slots=3)
    assert proposer.engine.dtype == torch.bfloat16  # dtype: auto is the target's
    assert proposer.max_len == 96 and proposer.engine.initial_slots == 3
    assert proposer.engine.target_dir == str(target_dir)
    assert proposer.controller.costs.target_bytes == checkpoint_parameters(target_dir) * 2
    assert proposer.engine.models == {}  # the drafts load with load()
    proposer.load()
    assert set(proposer.engine.models) == {str(draft_dir)}


def test_the_yaml_dtype_wins_over_the_target(tmp_path, target_dir, draft_dir, make_config):
    config = make_config(one_domain(tmp_path, draft_dir, dtype="float32").read_text())
    target = DraftTarget(model_dir=target_dir, dtype=torch.bfloat16, max_len=64)
    proposer = DomainProposer.for_target(config, target, detokenize=detokenize)
    assert proposer.config is config and proposer.engine.dtype == torch.float32


def test_every_issue_is_raised_together_the_adapters_first(tmp_path, target_dir, draft_dir):
    path = one_domain(tmp_path, draft_dir, k=4)
    target = DraftTarget(model_dir=target_dir, dtype=torch.float32, max_len=64, framework_k=2)
    mine = ConfigIssue("num_speculative_tokens", "exceeds the adapter's limit", str(path), 1)
    with pytest.raises(DraftConfigError) as info:
        DomainProposer.for_target(path, target, detokenize=detokenize, extra_issues=[mine])
    issues = info.value.issues
    assert issues[0] is mine and len(issues) == 2
    assert "exceeds the framework's num_speculative_tokens=2" in issues[1].message


def test_a_subclass_builds_itself(tmp_path, target_dir, draft_dir):
    class Mine(DomainProposer):
        pass

    target = DraftTarget(model_dir=target_dir, dtype=torch.float32, max_len=64)
    assert type(Mine.for_target(one_domain(tmp_path, draft_dir), target, detokenize=detokenize)) is Mine


def test_stats_dict_is_plain_and_has_the_derived_rates(tmp_path, target_dir, draft_dir):
    target = DraftTarget(model_dir=target_dir, dtype=torch.float32, max_len=64)
    proposer = DomainProposer.for_target(one_domain(tmp_path, draft_dir), target, detokenize=detokenize)
    before = proposer.stats_dict()
    assert set(before) == {"support", "default"}
    assert before["support"]["propose_ms_per_step"] is None
    proposer.num_steps, proposer.propose_seconds = 4, 0.002
    support = proposer.stats_dict()["support"]
    assert support["propose_ms_per_step"] == pytest.approx(0.5)
    assert support["acceptance_rate"] == 0.0 and support["mean_acceptance_length"] == 1.0
    assert support["domain"] == "support" and support["k_max"] == 3
