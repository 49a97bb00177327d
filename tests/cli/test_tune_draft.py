"""`accel tune-draft` on tiny models: a short run, resume, and every bad input."""

from __future__ import annotations

import json
import random

import pytest

from accel_plugin.cli import tune_draft


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target, draft, draft with another tokenizer): tiny Llama dirs, built once per session."""
    from accel_plugin.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.getbasetemp() / "tuning-models"
    return (build_tiny_model("mha-d32", root), build_tiny_model("draft-d32", root),
            build_tiny_model("draft-d32", root, vocab_size=320))


@pytest.fixture
def prompts(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "support.txt"
    path.write_text("".join(f"Customer: my order #{rng.randint(100, 999)} is late, refund please\n" for _ in range(10)))
    return path


def tune(capsys, target, draft, prompts, out, *extra):
    rc = tune_draft.main(["--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                          "--out", str(out), "--gen-tokens", "6", "--batch-size", "2", "--holdout", "2",
                          "--k", "3", "--threads", "1", *extra])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_tunes_saves_a_model_dir_and_resumes(models, prompts, tmp_path, capsys):
    target, draft, _ = models
    out = tmp_path / "tuned"
    rc, stdout, err = tune(capsys, target, draft, prompts, out, "--steps", "2", "--checkpoint-every", "1")
    assert rc == 0, err
    assert "8 for training, 2 held out" in stdout and "before" in stdout and "after" in stdout
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tune_report.json"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*.pt")) == ["step-000002.pt"]
    first = json.loads((out / "tune_report.json").read_text())
    assert first["steps"] == 2 and first["resumed_from_step"] == 0 and len(first["loss_curve"]) >= 2

    rc, stdout, err = tune(capsys, target, draft, prompts, out, "--steps", "4", "--json")
    assert rc == 0, err
    report = json.loads(stdout)
    assert report["resumed_from_step"] == 2 and report["steps"] == 4
    assert report["before"] == first["before"]  # "before" is always the untuned draft
    assert (out / "checkpoints" / "step-000004.pt").is_file()

    # an uninterrupted run of 4 steps does exactly what 2 + 2 did
    rc, stdout, err = tune(capsys, target, draft, prompts, tmp_path / "straight", "--steps", "4", "--json")
    assert rc == 0, err
    assert json.loads(stdout)["final_loss"] == pytest.approx(report["final_loss"], rel=1e-4)

    from accel_plugin.tuning.models import load_lm

    assert load_lm(out).config.vocab_size == load_lm(target).config.vocab_size

    # a resume with other settings is refused, --no-resume starts over
    rc, _, err = tune(capsys, target, draft, prompts, out, "--steps", "4", "--lr", "0.01")
    assert rc == 2 and "--no-resume" in err
    rc, stdout, err = tune(capsys, target, draft, prompts, out, "--steps", "1", "--lr", "0.01", "--no-resume", "--json")
    assert rc == 0, err
    assert json.loads(stdout)["resumed_from_step"] == 0


@pytest.mark.parametrize("case, needle", [
    ("missing-target", "--target: model directory"),
    ("missing-draft", "--draft: model directory"),
    ("not-a-model", "has no config.json"),
    ("other-tokenizer", "vocab_size"),
    ("empty-prompts", "has no prompts"),
    ("missing-prompts", "--prompts: prompt file"),
    ("one-prompt", "need at least 2 prompts"),
    ("out-is-draft", "--out:"),
    ("steps-negative", "argument --steps: must be >= 0; got '-1'"),
    ("lr-negative", "argument --lr: must be > 0.0 and <= 1.0"),
    ("k-too-big", "argument --k: must be >= 1 and <= 16"),
    ("steps-word", "argument --steps: expected int; got 'many'"),
    ("loss-unknown", "argument --loss: invalid choice: 'mse'"),
    ("holdout-all", "--holdout: 10.0 leaves no prompts"),
])
def test_bad_inputs_fail_with_a_clear_message(models, prompts, tmp_path, capsys, case, needle):
    target, draft, other = models
    out = tmp_path / "out"
    extra = ["--steps", "1"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    single = tmp_path / "one.txt"
    single.write_text("only one\n")
    nomodel = tmp_path / "nomodel"
    nomodel.mkdir()
    changes = {
        "missing-target": dict(target=tmp_path / "nope"),
        "missing-draft": dict(draft=tmp_path / "nope"),
        "not-a-model": dict(draft=nomodel),
        "other-tokenizer": dict(draft=other),
        "empty-prompts": dict(prompts=empty),
        "missing-prompts": dict(prompts=tmp_path / "nope.txt"),
        "one-prompt": dict(prompts=single),
        "out-is-draft": dict(out=draft),
        "steps-negative": dict(extra=["--steps", "-1"]),
        "lr-negative": dict(extra=["--lr", "-1"]),
        "k-too-big": dict(extra=["--k", "17"]),
        "steps-word": dict(extra=["--steps", "many"]),
        "loss-unknown": dict(extra=["--loss", "mse"]),
        "holdout-all": dict(extra=["--holdout", "10"]),
    }[case]
    args = dict(target=target, draft=draft, prompts=prompts, out=out, extra=extra) | changes
    rc, stdout, err = tune(capsys, args["target"], args["draft"], args["prompts"], args["out"], *args["extra"])
    assert rc == 2
    assert needle in err, err
    assert "Traceback" not in err + stdout
    assert not (out / "model.safetensors").exists()


def cut(capsys, target, prompts, out, *extra):
    rc = tune_draft.main(["--target", str(target), "--prompts", str(prompts), "--out", str(out),
                          "--gen-tokens", "6", "--batch-size", "2", "--holdout", "2", "--k", "3", "--threads", "1",
                          *extra])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_a_draft_cut_from_the_target_borrows_and_is_tuned(models, prompts, tmp_path, capsys):
    """--from-target-layers: only the trained layer, the norm and the head's ids are
    stored; the draft engine loads the rest from the target; training lowers the loss."""
    from safetensors import safe_open

    from accel_plugin.speculative.llama import LlamaDraftModel

    target, _, _ = models
    out = tmp_path / "cut"
    rc, stdout, err = cut(capsys, target, prompts, out, "--from-target-layers", "0,1", "--train-layers", "1",
                          "--head-vocab", "64", "--steps", "30", "--lr", "0.003", "--json")
    assert rc == 0, err
    report = json.loads(stdout)
    curve = report["loss_curve"]
    assert report["head_vocab"] == 64 and sum(curve[-3:]) < sum(curve[:3])
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" not in names and not any(n.startswith("model.layers.0.") for n in names)
    assert "accel.head_vocab" in names and any(n.startswith("model.layers.1.") for n in names)
    model = LlamaDraftModel(out, max_len=64, initial_slots=1, target_dir=target)
    assert model.num_layers == 2 and model.lm_head.shape[0] == 64


@pytest.mark.parametrize("extra, needle", [
    (["--from-target-layers", "zero"], "expected layer indices like 0,1,2 or 0-3,29"),
    (["--from-target-layers", "0,0"], "expected distinct layer indices"),
    (["--from-target-layers", "99"], "--from-target-layers: layer indices must lie in 0.."),
    (["--from-target-layers", "0", "--train-layers", "2"], "--train-layers must be in 0..1"),
    (["--from-target-layers", "0", "--head-vocab", "0"], "argument --head-vocab: must be >= 1"),
])
def test_bad_cut_arguments_name_the_valid_values(models, prompts, tmp_path, capsys, extra, needle):
    target, _, _ = models
    rc, stdout, err = cut(capsys, target, prompts, tmp_path / "out", "--steps", "1", *extra)
    assert rc == 2 and needle in err, err
    assert "Traceback" not in err + stdout


def test_head_vocab_needs_a_cut_draft(models, prompts, tmp_path, capsys):
    target, draft, _ = models
    rc, _, err = tune(capsys, target, draft, prompts, tmp_path / "out", "--head-vocab", "8")
    assert rc == 2 and "--head-vocab and --train-layers go with --from-target-layers" in err
