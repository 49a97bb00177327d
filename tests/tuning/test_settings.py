"""accel_plugin.tuning.settings (and accel_plugin.ranges): typed, validated settings
whose defaults and valid values are the command line's."""

from __future__ import annotations

import pytest

from accel_plugin.cli import bench, tune_draft
from accel_plugin.cli.main import build_parser
from accel_plugin.ranges import Range
from accel_plugin.tuning import TuningError
from accel_plugin.tuning.settings import BenchSettings, TuneSettings

PATHS = {"target": "t", "prompts": "p.txt", "out": "o"}


def test_range_bounds_kinds_and_text():
    k = Range(int, 1, 16)
    assert 1 in k and 16 in k and 0 not in k and 17 not in k and 2.0 not in k and True not in k
    lr = Range(float, 0.0, 1.0, low_open=True)
    assert 1 in lr and 0.5 in lr and 0.0 not in lr
    assert str(k) == ">= 1 and <= 16" and str(lr) == "> 0.0 and <= 1.0" and str(Range(int, 0)) == ">= 0"
    assert k.problem(None) == "expected an integer >= 1 and <= 16; got None"
    assert Range(int, 1, optional=True).problem(None) is None
    assert k.problem(17) == "must be >= 1 and <= 16; got 17" and k.problem("3") == "expected an integer >= 1 and <= 16; got '3'"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_range_refuses_nan_and_infinity(value):
    """nan compares as inside any bounds and inf passes a range without ``high``: both refused."""
    assert value not in Range(float, 0.0) and value not in Range(float, 0.0, 1.0)
    assert Range(float, 0.0).problem(value) == f"must be >= 0.0; got {value!r}"


def test_range_allows_infinity_only_when_asked_and_whole_numbers_from():
    assert float("inf") in Range(float, 0.0, allow_inf=True) and float("nan") not in Range(float, 0.0, allow_inf=True)
    holdout = Range(float, 0.0, low_open=True, whole_from=1)
    assert 0.5 in holdout and 1 in holdout and 2.0 in holdout and 2.7 not in holdout
    assert holdout.problem(2.7) == "must be > 0.0, a whole number when >= 1; got 2.7"


def test_tune_settings_defaults_are_the_flags_defaults():
    parser = build_parser()
    args = parser.parse_args(["tune-draft", "--target", "t", "--draft", "d", "--prompts", "p.txt", "--out", "o"])
    assert tune_draft.settings_from_args(args) == TuneSettings(**PATHS, draft="d")
    args = parser.parse_args(["tune-draft", "--target", "t", "--from-target-layers", "0-2,5", "--prompts", "p.txt",
                              "--out", "o", "--no-resume"])
    assert tune_draft.settings_from_args(args) == TuneSettings(**PATHS, from_target_layers=(0, 1, 2, 5), resume=False)


def test_bench_settings_defaults_are_the_flags_defaults():
    args = build_parser().parse_args(["bench", "acceptance", "--config", "c.yaml", "--target", "t", "--prompts", "p"])
    assert bench.settings_from_args(args) == BenchSettings(config="c.yaml", target="t", prompts="p")


@pytest.mark.parametrize("change, needle", [
    ({"steps": -1}, "--steps: must be >= 0; got -1"),
    ({"lr": 0.0}, "--lr: must be > 0.0 and <= 1.0; got 0.0"),
    ({"k": 17}, "--k: must be >= 1 and <= 16; got 17"),
    ({"batch_size": "8"}, "--batch-size: expected an integer >= 1; got '8'"),
    ({"loss": "mse"}, "--loss: must be one of kl, nll; got 'mse'"),
    ({"lr_schedule": "linear"}, "--lr-schedule: must be one of constant, cosine; got 'linear'"),
    ({"save_dtype": "float16"}, "--save-dtype: must be one of auto, float32, bfloat16"),
    ({"draft": None}, "give one of --draft and --from-target-layers"),
    ({"from_target_layers": [0, 1]}, "give one of --draft and --from-target-layers"),
    ({"draft": None, "from_target_layers": [1, 1]}, "--from-target-layers: expected distinct layer indices"),
    ({"seed": 1.5}, "--seed: expected an integer >= 0; got 1.5"),
    ({"holdout": 2.7}, "--holdout: must be > 0.0, a whole number when >= 1; got 2.7"),
    ({"lr": float("nan")}, "--lr: must be > 0.0 and <= 1.0; got nan"),
])
def test_tune_settings_name_the_flag_and_the_valid_values(change, needle):
    with pytest.raises(TuningError) as exc:
        TuneSettings(**{**PATHS, "draft": "d", **change})
    assert needle in str(exc.value)


def test_bench_settings_refuse_out_of_range_values():
    with pytest.raises(TuningError, match="--target-step-ms: must be > 0.0; got 0"):
        BenchSettings(config="c.yaml", target="t", prompts="p", target_step_ms=0)
    assert BenchSettings(config="c.yaml", target="t", prompts="p", target_step_ms=5).target_step_ms == 5
