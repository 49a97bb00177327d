"""benchmarks.speculative_sweep: its options, workload and table, from fake harness results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "speculative_sweep.py"
_spec = importlib.util.spec_from_file_location("speculative_sweep", _FILE)
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


def _config(tokens_per_s: dict[int, float], step_stats=None):
    runs = [{"name": f"sweep|{n}|0", "seconds": 32 * n / t, "seconds_all": [32 * n / t] * 3, "generated": 32 * n,
             "token_ids": [[1]] * n, "step_stats": step_stats} for n, t in tokens_per_s.items()]
    return {"runs": runs}


def test_bad_batches_name_the_valid_form(capsys):
    with pytest.raises(SystemExit):
        sweep.parse_args(["--batches", "1,0"])
    assert "comma-separated batch sizes 1..256" in capsys.readouterr().err
    assert sweep.parse_args([]).batches == (1, 2, 4, 8, 16, 32, 64)


def test_workload_repeats_a_small_set_to_fill_a_batch():
    warmup, timed = sweep.workload(["a", "b", "c"], (1, 4))
    assert [t["prompts"] for t in timed] == [["a"], ["a", "b", "c", "a"]]
    assert [t["name"] for t in timed] == ["sweep|1|0", "sweep|4|0"] and warmup[-1] == ["a", "b", "c", "a"]


def test_rows_show_where_drafting_stops_paying_and_the_gate():
    step = {"1": {"gate": "on", "predicted_speedup": 1.6, "measured_speedup": 1.5},
            "64": {"gate": "off", "predicted_speedup": 0.9, "measured_speedup": None}}
    results = {"plain": _config({1: 10.0, 64: 300.0}), "ours": _config({1: 15.0, 64: 297.0}, step),
               "ngram": _config({1: 12.0, 64: 240.0})}
    rows = sweep.rows_from(results, (1, 64))
    assert rows[0]["ratio_ours"] == pytest.approx(1.5) and rows[0]["gate"] == "on"
    assert rows[1]["ratio_ngram"] == pytest.approx(0.8) and rows[1]["gate"] == "off"
    assert rows[0]["ratio_control"] is None  # no control engine in this run
    text = sweep.render(rows)
    assert "   64" in text and "0.99x" in text and "off" in text and "0.90" in text
    results["plain-again"] = _config({1: 10.5, 64: 270.0})  # the control, started first
    rows = sweep.rows_from(results, (1, 64))
    assert [r["ratio_control"] for r in rows] == [pytest.approx(1.05), pytest.approx(0.9)]
    assert "0.90x" in sweep.render(rows).splitlines()[3]
