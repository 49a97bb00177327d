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
