"""Request traces: the seeded synthetic trace, JSONL traces and the errors naming their line and field."""

from __future__ import annotations

import json
import statistics

import pytest

from accel_plugin.observability.kv_trace import TraceError, load_trace, synthetic_trace


def test_synthetic_trace_is_seeded_and_sharegpt_like():
    a, b = synthetic_trace(1000, seed=3), synthetic_trace(1000, seed=3)
    assert a == b and a != synthetic_trace(1000, seed=4)
    assert all(r.prompt_len + r.output_len <= 2048 for r in a)
    assert 100 <= statistics.median(r.prompt_len for r in a) <= 200
    assert 150 <= statistics.median(r.output_len for r in a) <= 250
    assert 300 < sum(r.prefix_id is not None for r in a) < 700
    assert all(r.prompt_len + r.output_len <= 64 for r in synthetic_trace(200, seed=0, max_model_len=64))


def test_load_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [{"arrival": 0, "prompt_len": 10, "output_len": 5},
             {"arrival": 2, "prompt_len": 40, "output_len": 3, "prefix_id": "sys", "prefix_len": 35, "id": "r2"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    trace = load_trace(path, max_model_len=2048)
    assert [r.prompt_len for r in trace] == [10, 40] and trace[1].prefix_id == "sys"


@pytest.mark.parametrize("line, message", [
    ('{"arrival": 0, "prompt_len": 0, "output_len": 5}', "line 2: prompt_len: Input should be greater than or equal to 1, got 0"),
    ('{"arrival": 0, "prompt_len": 5}', "line 2: output_len: required field is missing"),
    ('{"arrival": 0.5, "prompt_len": 5, "output_len": 5}', "line 2: arrival: Input should be a valid integer"),
    ('{"arrival": 0, "prompt": 5, "output_len": 5}', ("line 2: prompt: unknown field (valid fields: arrival, "
     "prompt_len, output_len, prefix_id, prefix_len, max_output_len, id); prompt_len: required field is missing")),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 5, "prefix_id": "a"}', "line 2: prefix_id and prefix_len go together"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 5, "prefix_id": "a", "prefix_len": 9}', "prefix_len (9) must be <= prompt_len (5)"),
    ('{"arrival": 0, "prompt_len": 2000, "output_len": 100}', "line 2: prompt_len + output_len = 2100 exceeds --max-model-len 2048"),
    ('{"arrival": 0, "prompt_len": 50, "output_len": 5, "prefix_id": "p", "prefix_len": 20}', "line 2: prefix_len: prefix_id 'p' has prefix_len 10 at"),
    ('{"arrival": 0, "prompt_len": 5,', "line 2: not valid JSON"),
    ('[1, 2]', "line 2: expected a JSON object"),
])
def test_trace_errors_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 10, "output_len": 5, "prefix_id": "p", "prefix_len": 10}\n' + line + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path, max_model_len=2048)
    assert message in str(info.value) and str(path) in str(info.value)


def test_trace_file_problems(tmp_path):
    with pytest.raises(TraceError, match="--trace: cannot read"):
        load_trace(tmp_path / "missing.jsonl", 2048)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(tmp_path / "empty.jsonl", 2048)


# --- docs/observability.md -------------------------------------------------------------------------

def doc_block(lang):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    section = text[text.index("## KV-cache fragmentation"):]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.DOTALL)


def test_docs_trace_example_loads(tmp_path):
    (example,) = doc_block("json")
    path = tmp_path / "requests.jsonl"
    path.write_text(example)
    trace = load_trace(path, max_model_len=2048)
    assert len(trace) == 3 and trace[1].prefix_len == 200 and trace[2].max_output_len == 1024
