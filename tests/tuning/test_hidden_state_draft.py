"""benchmarks/hidden_state_draft.py: its rounds replay as accel tune-draft's, and it runs end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from accel_plugin.tuning.acceptance import simulate

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    name = "accel_bench_hidden_state_draft"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "hidden_state_draft.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


flag_lists = st.lists(st.lists(st.booleans(), min_size=1, max_size=30), min_size=1, max_size=5)


@given(flag_lists)
def test_one_draft_rounds_are_the_tuning_tools_rounds(flags):
    bench = _benchmark()
    mine = bench.two_position_rounds(flags, [[False] * len(f) for f in flags], 1)
    theirs = simulate(flags, 1)
    assert mine["per_position"][0] == (round(theirs.accepted_per_pos[0] / theirs.tested_per_pos[0], 3)
                                       if theirs.tested_per_pos[0] else None)
    assert mine["tokens_per_step"] == round(theirs.tokens / theirs.rounds, 3)


@given(flag_lists)
def test_two_draft_rounds_match_simulate_where_the_second_flag_is_the_next_tokens(flags):
    # a draft whose second token is right exactly when its next first-token flag is (a draft that
    # never sees its own output) replays as simulate's k = 2
    bench = _benchmark()
    seconds = [[f[i + 1] if i + 1 < len(f) else False for i in range(len(f))] for f in flags]
    mine = bench.two_position_rounds(flags, seconds, 2)
    theirs = simulate(flags, 2)
    assert mine["tokens_per_step"] == round(theirs.tokens / theirs.rounds, 3)
    for got, a, t in zip(mine["per_position"], theirs.accepted_per_pos, theirs.tested_per_pos):
        assert got == (round(a / t, 3) if t else None)


def test_rounds_refuse_other_k():
    with pytest.raises(ValueError, match="k must be 1 or 2"):
        _benchmark().two_position_rounds([[True]], [[True]], 3)


def _dataset(target, path: Path) -> Path:
    from accel_plugin.tuning.acceptance import greedy_continuations
    from accel_plugin.tuning.distill import DistillSettings, build_dataset

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (6,), generator=gen).tolist() for _ in range(6)]
    items = build_dataset(target, prompts[:4], DistillSettings(gen_tokens=8, top_k=4), batch_size=4)
    held = prompts[4:]
    torch.save({"key": "test", "items": items,
                "held": [[p, c] for p, c in zip(held, greedy_continuations(target, held, 8, batch_size=2))]}, path)
    return path


def test_it_trains_and_compares_on_tiny_models(tmp_path_factory, tmp_path, capsys):
    from accel_plugin.testing.tiny_models import build_tiny_model
    from accel_plugin.tuning.loaders import load_lm

    root = tmp_path_factory.getbasetemp() / "tuning-models"
    target_dir, draft_dir = build_tiny_model("gqa-d32", root), build_tiny_model("draft-d32", root)
    dataset = _dataset(load_lm(target_dir), tmp_path / "dataset.pt")
    out = tmp_path / "r.json"
    assert _benchmark().main(["--dataset", str(dataset), "--target", str(target_dir), "--draft", str(draft_dir),
                              "--layers", "1", "--steps", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["loss_curve"]) == 2  # step 1 and the last
    (shipped, head), = [list(result["drafts"].values())]
    for r in (shipped, head):
        assert 0.0 <= r["teacher_forced"] <= 1.0
        assert len(r["k1"]["per_position"]) == 1 and len(r["k2"]["per_position"]) == 2
        assert 1.0 <= r["k1"]["tokens_per_step"] <= 2.0 and 1.0 <= r["k2"]["tokens_per_step"] <= 3.0
    out = capsys.readouterr().out
    assert "hidden-state head (target layers 1," in out and "of its own greedy token" in out
    assert 0.0 <= result["target_confidence"]["above_0.9"] <= result["target_confidence"]["above_0.5"] <= 1.0


def test_bad_arguments_name_the_flag(tmp_path_factory, tmp_path):
    from accel_plugin.testing.tiny_models import build_tiny_model
    from accel_plugin.tuning.loaders import load_lm

    bench = _benchmark()
    with pytest.raises(SystemExit, match="--dataset: .* is not a file"):
        bench.main(["--dataset", str(tmp_path / "missing.pt")])
    torch.save({"items": []}, tmp_path / "other.pt")
    with pytest.raises(SystemExit, match="no tune-draft dataset"):
        bench.main(["--dataset", str(tmp_path / "other.pt")])
    root = tmp_path_factory.getbasetemp() / "tuning-models"
    target_dir, draft_dir = build_tiny_model("gqa-d32", root), build_tiny_model("draft-d32", root)
    dataset = _dataset(load_lm(target_dir), tmp_path / "dataset.pt")
    with pytest.raises(SystemExit, match="--layers: the target has layers 0-1"):
        bench.main(["--dataset", str(dataset), "--target", str(target_dir), "--draft", str(draft_dir), "--layers", "2"])
    with pytest.raises(SystemExit, match="--target: "):
        bench.main(["--dataset", str(dataset), "--target", str(tmp_path), "--draft", str(draft_dir)])


@pytest.mark.parametrize("flag", [["--steps", "0"], ["--threads", "0"], ["--lr", "0"]])
def test_bad_numbers_are_refused_before_anything_loads(flag, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _benchmark().main(["--dataset", str(tmp_path / "missing.pt"), *flag])
    assert "--steps and --threads must be >= 1 and --lr > 0" in capsys.readouterr().err
