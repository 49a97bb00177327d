"""`accel bench acceptance` on tiny models: table, --json, --plot and bad inputs."""

from __future__ import annotations

import json

import pytest

from accel_plugin.cli import bench


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A target, a draft, a YAML with a 'support' domain and a 'same' domain whose
    draft is the target itself, and a prompt file reaching both and the default."""
    from accel_plugin.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.getbasetemp() / "tuning-models"
    target, draft = build_tiny_model("mha-d32", root), build_tiny_model("draft-d32", root)
    work = tmp_path_factory.mktemp("bench")
    config = work / "drafts.yaml"
    config.write_text(
        "num_speculative_tokens: 3\n"
        f"domains:\n  support:\n    draft: {draft}\n    match:\n      keywords: [refund]\n"
        f"  same:\n    draft: {target}\n    match:\n      regex: ['^def ']\n"
        "default:\n  draft: null\n"
    )
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in (
        {"prompt": "I want a refund for order 12", "domain": "support"},
        {"prompt": "where is my refund", "domain": "support"},
        {"prompt": "def value(x):", "domain": "code"},
        "just some words",
    )))
    return target, config, prompts, work


def run_bench(capsys, *argv):
    rc = bench.main(["acceptance", "--gen-tokens", "8", "--threads", "1", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_table_json_and_plot(setup, capsys):
    target, config, prompts, work = setup
    base = ["--config", str(config), "--target", str(target), "--prompts", str(prompts)]
    rc, out, err = run_bench(capsys, *base, "--target-step-ms", "5.0")
    assert rc == 0, err
    for needle in ("domain", "support", "same", "default", "(none)", "break-even", "expected S", "simulated S",
                   "acceptance per position", "given (--target-step-ms)"):
        assert needle in out, needle

    rc, out, err = run_bench(capsys, *base, "--json")
    assert rc == 0, err
    report = json.loads(out)
    rows = {r["domain"]: r for r in report["domains"]}
    assert set(rows) == {"support", "same", "default"}
    assert rows["support"]["labels"] == {"support": 2}
    assert rows["default"]["draft"] is None and "curve" not in rows["default"]
    same = rows["same"]
    assert same["alpha"] == 1.0 and same["per_position"] == [1.0, 1.0, 1.0]  # draft == target
    for row in (rows["support"], same):
        assert 0.0 <= row["alpha"] <= 1.0 and len(row["curve"]) == 3
        assert row["c"] == pytest.approx(row["draft_step_ms"] / row["target_step_ms"])
        assert 0 <= row["best_k"] <= 3 and 0.0 <= row["break_even_alpha"] <= 1.0


def test_plot(setup, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    target, config, prompts, work = setup
    plot = work / "speedup.png"
    rc, out, err = run_bench(capsys, "--config", str(config), "--target", str(target), "--prompts", str(prompts),
                             "--plot", str(plot), "--max-prompts", "1")
    assert rc == 0, err
    assert f"plot: {plot}" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case, needle", [
    ("missing-config", "--config: draft YAML"),
    ("bad-config", "num_speculative_tokens"),
    ("missing-target", "--target: model directory"),
    ("empty-prompts", "has no prompts"),
    ("plot-not-png", "--plot: expected a .png"),
    ("k-zero", "argument --k-max: must be >= 1 and <= 16; got '0'"),
    ("no-benchmark", "the following arguments are required: BENCHMARK"),
])
def test_bad_inputs(setup, tmp_path, capsys, case, needle):
    target, config, prompts, _ = setup
    bad = tmp_path / "bad.yaml"
    bad.write_text("domains: {}\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    args = {"--config": str(config), "--target": str(target), "--prompts": str(prompts)}
    extra = []
    if case == "missing-config":
        args["--config"] = str(tmp_path / "nope.yaml")
    elif case == "bad-config":
        args["--config"] = str(bad)
    elif case == "missing-target":
        args["--target"] = str(tmp_path / "nope")
    elif case == "empty-prompts":
        args["--prompts"] = str(empty)
    elif case == "plot-not-png":
        extra = ["--plot", str(tmp_path / "x.jpg")]
    elif case == "k-zero":
        extra = ["--k-max", "0"]
    if case == "no-benchmark":
        rc = bench.main([])
        err = capsys.readouterr().err
    else:
        rc, _, err = run_bench(capsys, *[x for kv in args.items() for x in kv], *extra)
    assert rc == 2
    assert needle in err, err
    assert "Traceback" not in err
