"""Draft faults without a framework: non-finite logits, draft files that vanish.

The same faults inside a real `vllm serve` are integration/test_vllm_faults.py.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from accel_plugin.speculative import DomainProposer, DomainState
from accel_plugin.speculative.draft_engine import (
    DraftEngine,
    DraftJob,
    DraftOutputError,
)
from accel_plugin.speculative.llama import LlamaDraftModel

CONTEXT = np.array([5, 9, 17, 33, 2], dtype=np.int64)


def _poison(model: LlamaDraftModel, value: float, monkeypatch) -> None:
    forward = model.forward

    def poisoned(*args):
        logits = forward(*args).clone()
        logits[0, 7] = value  # one entry of one row is enough
        return logits

    monkeypatch.setattr(model, "forward", poisoned)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_logits_raise(draft_dir, monkeypatch, value):
    engine = DraftEngine(max_len=64)
    _poison(engine.load(str(draft_dir)), value, monkeypatch)
    with pytest.raises(DraftOutputError, match="non-finite logits"):
        engine.draft(str(draft_dir), [DraftJob(engine.new_cache(str(draft_dir)), CONTEXT, 3)])


@pytest.mark.parametrize("bad_round", [1, 2])
def test_non_finite_logits_in_a_later_round_raise(draft_dir, monkeypatch, bad_round):
    """Drafts stay on the device through the k loop; a NaN in any round still raises."""
    engine = DraftEngine(max_len=64)
    model = engine.load(str(draft_dir))
    forward, calls = model.forward, []

    def poisoned(*args):
        logits = forward(*args).clone()
        calls.append(1)
        if len(calls) == bad_round + 1:
            logits[0, 3] = float("nan")
        return logits

    monkeypatch.setattr(model, "forward", poisoned)
    with pytest.raises(DraftOutputError, match="non-finite logits"):
        engine.draft(str(draft_dir), [DraftJob(engine.new_cache(str(draft_dir)), CONTEXT, 4)])
    assert len(calls) == 4  # the call ran its rounds, then raised


def test_minus_inf_logits_are_fine(draft_dir, monkeypatch):
    """-inf marks a token as impossible; only a row with nothing finite is broken."""
    engine = DraftEngine(max_len=64)
    _poison(engine.load(str(draft_dir)), float("-inf"), monkeypatch)
    result = engine.draft(str(draft_dir), [DraftJob(engine.new_cache(str(draft_dir)), CONTEXT, 3)])
    assert len(result.drafts[0]) == 3


def test_nan_draft_switches_its_domain_off(make_config, draft_dir, target_dir, monkeypatch, caplog):
    config = make_config(f"""
        num_speculative_tokens: 3
        domains:
          broken: {{draft: {draft_dir}, match: {{keywords: [alpha]}}}}
        default: {{draft: {target_dir}}}
        controller: {{adaptive: false}}
    """)
    proposer = DomainProposer(config, lambda ids: "alpha" if ids[0] == 1 else "other", max_len=64)
    proposer.load()
    _poison(proposer.engine.models[str(draft_dir)], float("nan"), monkeypatch)
    tokens = np.zeros((2, 64), dtype=np.int32)
    tokens[0, :4], tokens[1, :4] = [1, 5, 6, 7], [2, 5, 6, 7]
    with caplog.at_level(logging.ERROR, logger="accel_plugin.speculative"):
        drafts = proposer.propose([[7], [7]], np.array([4, 4], dtype=np.int32), tokens)
    assert drafts[0] == [] and len(drafts[1]) == 3
    stats = proposer.stats()
    assert stats["broken"].state == DomainState.FAILED and "non-finite logits" in stats["broken"].error
    assert stats["default"].state == DomainState.FIXED
    assert [r.getMessage().split(";")[1].strip() for r in caplog.records] == [
        "speculation is off for domain(s) broken, which continue with plain decoding"]


def test_deleted_draft_files_change_nothing_once_loaded(tiny_models, tmp_path):
    """Drafts load at start-up; deleting the directory later (unlinking) is harmless."""
    copy = shutil.copytree(tiny_models("draft-d32"), tmp_path / "draft")
    engine = DraftEngine(max_len=64)
    engine.load(str(copy))
    before = engine.draft(str(copy), [DraftJob(engine.new_cache(str(copy)), CONTEXT, 3)]).drafts
    shutil.rmtree(copy)
    after = engine.draft(str(copy), [DraftJob(engine.new_cache(str(copy)), CONTEXT, 3)]).drafts
    assert after == before


def test_draft_files_overwritten_in_place_change_nothing_once_loaded(tiny_models, tmp_path):
    """Loaded tensors own their memory: a file truncated under a mapping would kill the
    process with SIGBUS at the next forward (a child process, so a regression fails
    this test, not the suite)."""
    copy = shutil.copytree(tiny_models("draft-d32"), tmp_path / "draft")
    script = textwrap.dedent(f"""
        import torch
        from pathlib import Path
        from accel_plugin.speculative.llama import LlamaDraftModel
        model = LlamaDraftModel({str(copy)!r}, max_len=64)
        slot = model.alloc_slot()
        args = (torch.tensor([[5, 9, 17]]), torch.tensor([0]), torch.tensor([3]), torch.tensor([slot]))
        before = model.forward(*args)
        for f in Path({str(copy)!r}).glob("*.safetensors"):
            f.write_bytes(b"")  # truncated in place, as `cp new.safetensors old.safetensors` does first
        assert torch.equal(model.forward(*args), before)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
