"""`accel kv simulate`: table, --json against the library, --plot, a trace file, bad inputs."""

from __future__ import annotations

import json

import pytest

from accel_plugin.cli import kv
from accel_plugin.cli.kv import report, trace_summary
from accel_plugin.observability.kv_simulator import compare_allocators
from accel_plugin.observability.kv_trace import synthetic_trace

SMALL = ["--requests", "60", "--seed", "2", "--arrival-rate", "2", "--max-model-len", "512", "--cache-tokens", "4096"]


def accel_kv(capsys, *argv):
    rc = kv.main(["simulate", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_json_agrees_with_the_library(capsys):
    rc, out, err = accel_kv(capsys, *SMALL, "--block-sizes", "1,16,64", "--json")
    assert rc == 0, err
    got = json.loads(out)
    trace = synthetic_trace(60, seed=2, max_model_len=512, arrival_rate=2.0)
    results = compare_allocators(trace, cache_tokens=4096, max_model_len=512, block_sizes=(1, 16, 64))
    expected = report(results, {**trace_summary(trace, "synthetic", 2), "arrival_rate": 2.0},
                      cache_tokens=4096, max_model_len=512)
    assert got == json.loads(json.dumps(expected))
    names = [r["allocator"] for r in got["rows"]]
    assert names == ["contiguous", "contiguous-oracle", "paged b=1", "paged b=16", "paged b=64", "paged b=16 +prefix"]
    rows = {r["allocator"]: r for r in got["rows"]}
    assert rows["contiguous"]["ratio_vs_contiguous"] == 1.0 and rows["paged b=1"]["internal_pct"] == 0.0
    for row in got["rows"]:
        total = row["internal_pct"] + row["reserved_pct"] + row["external_pct"]
        assert abs(total - row["waste_pct"]) < 0.03


def test_table_and_plot(capsys, tmp_path):
    png = tmp_path / "img" / "kv.png"
    rc, out, err = accel_kv(capsys, *SMALL, "--no-prefix-sharing", "--plot", str(png))
    assert rc == 0, err
    for needle in ("trace: synthetic (seed 2", "60 requests", "prompt_len median", "allocator", "internal %",
                   "reserved %", "external %", "waste %", "x contiguous", "contiguous-oracle", "paged b=256",
                   f"plot: {png}"):
        assert needle in out, needle
    assert "+prefix" not in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_file(capsys, tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 10, "output_len": 5}\n')
    rc, out, err = accel_kv(capsys, "--trace", str(path), "--block-sizes", "8", "--max-model-len", "32",
                            "--cache-tokens", "64", "--json")
    assert rc == 0, err
    rows = {r["allocator"]: r for r in json.loads(out)["rows"]}
    assert rows["paged b=8"]["waste_pct"] == 25.0  # 60 of 80 slot-steps used (tests/observability/test_kv_simulator.py)
    assert rows["contiguous"]["waste_pct"] == 62.5

    path.write_text('{"arrival": 0, "prompt_len": 10, "output_len": 5}\n{"arrival": -1, "prompt_len": 10, "output_len": 5}\n')
    rc, out, err = accel_kv(capsys, "--trace", str(path))
    assert rc == 2 and f"{path} line 2: arrival: Input should be greater than or equal to 0" in err


@pytest.mark.parametrize("argv, message", [
    (["--block-sizes", "0"], "each must be >= 1 and <= 65536"),
    (["--block-sizes", "8,x"], "expected comma-separated integers >= 1 and <= 65536, e.g. 1,8,16,32,64,256"),
    (["--block-sizes", "16.5"], "expected comma-separated integers"),
    (["--cache-tokens", "-5"], "must be >= 2 and <= 2147483648; got '-5'"),
    (["--requests", "0"], "must be >= 1 and <= 100000"),
    (["--requests", "nan"], "expected an integer >= 1 and <= 100000; got 'nan'"),
    (["--requests", "2.7"], "expected an integer >= 1 and <= 100000; got '2.7'"),
    (["--arrival-rate", "nan"], "must be > 0.0 and <= 10000.0; got 'nan'"),
    (["--arrival-rate", "inf"], "must be > 0.0 and <= 10000.0; got 'inf'"),
    (["--max-model-len", "1"], "must be >= 2"),
    (["--trace", "no/such/trace.jsonl"], "--trace: cannot read 'no/such/trace.jsonl'"),
    (["--trace", "t.jsonl", "--seed", "1"], "--seed: only for the synthetic trace, not with --trace"),
    (["--plot", "kv.jpg"], "--plot: expected a .png file name"),
    (["--requests", "5", "--cache-tokens", "1000"], "raise --cache-tokens to at least 2048"),
])
def test_bad_inputs_exit_2_naming_the_valid_values(capsys, argv, message):
    rc, _, err = accel_kv(capsys, *argv)
    assert rc == 2 and message in err, err


def test_default_block_sizes_match_the_library():
    from accel_plugin.observability.kv_simulator import DEFAULT_BLOCK_SIZES

    assert kv.DEFAULT_BLOCK_SIZES == DEFAULT_BLOCK_SIZES


def test_listed_in_accel_help(capsys):
    from accel_plugin.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "KV-cache fragmentation" in capsys.readouterr().out
