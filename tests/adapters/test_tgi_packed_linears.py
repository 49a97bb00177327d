"""Contract test of adapters/tgi/packed_linears.py: TGI's ``FastLinear`` (a fake of its six
lines: a ``weight`` Parameter, a ``bias``, ``F.linear``) with torch's real oneDNN packing.
integration/test_tgi_speculative.py runs it in the real TGI (the start-up line names the
laid-out matrices; the speculating runs, laid out, give the plain runs' ids, put back)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accel_plugin import envs
from accel_plugin.adapters.tgi import packed_linears
from accel_plugin.kernels import cpu_linear
from accel_plugin.speculative.llama import packed_linear

pytestmark = pytest.mark.skipif(packed_linear(torch.float32, torch.device("cpu")) is None,
                                reason="this torch has no oneDNN prepacked product")


class FastLinear(torch.nn.Module):  # text_generation_server/layers/linear.py, v3.3.7
    def __init__(self, weight, bias) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = torch.nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight, self.bias)


@pytest.fixture
def fake_linear_module(monkeypatch):
    module = types.ModuleType("text_generation_server.layers.linear")
    module.FastLinear = FastLinear
    monkeypatch.setitem(sys.modules, "text_generation_server.layers.linear", module)


class Target(torch.nn.Module):  # FlashLlamaForCausalLM's shape: layers, then model.model.lm_head
    def __init__(self, gen):
        super().__init__()
        self.layers = torch.nn.Sequential(
            FastLinear(torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)), torch.nn.GELU(),
            FastLinear(torch.randn(64, 96, generator=gen), None))
        self.lm_head = torch.nn.Sequential(FastLinear(torch.randn(1000, 64, generator=gen), None))  # many rows

    def forward(self, x):
        return self.lm_head(self.layers(x))

    def linears(self):
        return [m for m in self.modules() if isinstance(m, FastLinear)]


def model(dtype=torch.float32, world_size=1):
    layers = Target(torch.Generator().manual_seed(0)).to(dtype)
    return types.SimpleNamespace(model=layers, device=torch.device("cpu"), dtype=dtype, world_size=world_size)


def fixed_rows(n):
    """A timer under which F.linear wins up to ``n`` rows and the prepacked product above
    (the products themselves run, as the real timer runs them)."""
    def timer(pairs, rows, use_packed, linear):
        packed_linears.pass_ms(pairs, rows, use_packed, linear)
        return (1.0 if rows <= n else 2.0) if not use_packed else 1.5
    return timer


NATIVE = pytest.param("native", marks=pytest.mark.skipif(cpu_linear.ops() is None, reason=str(cpu_linear.reason())))
PRODUCTS = {"native": "native few-row product", "onednn": "oneDNN's prepacked product"}


def test_auto_takes_the_native_product_where_it_builds(fake_linear_module):
    packing = packed_linears.pack_target(model(), timer=fixed_rows(2))
    expected = "onednn" if cpu_linear.ops() is None else "native"
    assert packing.product.startswith(PRODUCTS[expected]) and PRODUCTS[expected] in packing.describe()
    assert packing.max_rows == (packed_linears.NATIVE_MAX_ROWS if expected == "native" else None)
    packing.undo()
    with pytest.raises(ValueError, match="product must be auto, native or onednn"):
        packed_linears.pack_target(model(), product="mkl")


@pytest.mark.parametrize("product", [NATIVE, "onednn"])
def test_copies_products_match_and_undo_restores_tgi(fake_linear_module, product):
    target = model()
    dense = [m.weight for m in target.model.linears()]
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    expected = target.model(x)
    packing = packed_linears.pack_target(target, timer=fixed_rows(2), product=product)
    assert len(packing.modules) == 3 and packing.dense_rows == {"layers": 2, "head": 2}
    assert "3 target matrices with a packed copy for multi-row verification, " + PRODUCTS[product] in packing.describe()
    assert "F.linear kept for layers up to 2 rows, head up to 2 rows" in packing.describe()
    assert packing.packed_bytes == sum(w.numel() * 4 for w in dense)
    for m, before in zip(target.model.linears(), dense):
        assert m.weight is before and "_accel_packed_weight" in m.__dict__ and "forward" in m.__dict__
    for rows in (1, 2, 3, 7):  # F.linear's rows and the prepacked copy's
        torch.testing.assert_close(target.model(x[:rows]), expected[:rows], rtol=1e-4, atol=1e-3)
    packing.undo()
    assert packing.modules == []
    for m, before in zip(target.model.linears(), dense):
        assert m.weight is before and not set(m.__dict__) & {"_accel_packed_weight", "forward"}
    assert torch.equal(target.model(x), expected)  # TGI's own F.linear again, bit for bit


@pytest.mark.parametrize("product", [NATIVE, "onednn"])
def test_each_row_count_takes_the_product_measured_faster(fake_linear_module, monkeypatch, product):
    calls = []
    real = F.linear
    monkeypatch.setattr(packed_linears.F, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    target = model()
    packing = packed_linears.pack_target(target, timer=fixed_rows(3), product=product)
    calls.clear()
    big = packed_linears.NATIVE_MAX_ROWS + 1
    for rows in (1, 3, 4, 6, big):
        target.model(torch.randn(rows, 64))
    # three matrices at 1 and 3 rows; 4 and 6 rows the copy; a prompt longer than the native
    # product's limit F.linear again (oneDNN's product takes every size)
    assert calls == [1, 1, 1, 3, 3, 3] + ([big] * 3 if product == "native" else [])
    packing.undo()


@pytest.mark.parametrize("table, expected", [
    ({1: (1, 2), 2: (2, 2), 3: (3, 2)}, 2),  # F.linear ties at 2 rows (kept), loses at 3
    ({1: (2, 1)}, 0),  # the prepacked product wins at one row already
    ({r: (1, 2) for r in range(1, packed_linears.PROBE_ROWS + 1)}, packed_linears.PROBE_ROWS),
])
def test_dense_rows_is_the_last_row_count_where_f_linear_is_not_slower(table, expected):
    def timer(_pairs, rows, use_packed, _linear):
        dense, packed = table.get(rows, (2, 1))
        return packed if use_packed else dense
    assert packed_linears.dense_rows([], None, timer=timer) == expected


@pytest.mark.parametrize("kwargs, reason", [({"dtype": torch.bfloat16}, "not float32"),
                                            ({"world_size": 2}, "tensor parallel over 2 ranks")])
def test_nothing_changes_where_it_does_not_apply(fake_linear_module, kwargs, reason):
    target = model(**kwargs)
    packing = packed_linears.pack_target(target)
    assert packing.modules == [] and reason in packing.describe()
    assert all("weight" in m._parameters for m in target.model.linears())


@pytest.mark.parametrize("value", ["off", "0", "no"])
def test_accel_tgi_prepack_off_makes_no_copies(fake_linear_module, value):
    target = model()
    packing = packed_linears.pack_target(target, timer=fixed_rows(2), environ={"ACCEL_TGI_PREPACK": value})
    assert packing.modules == [] and packing.packed_bytes == 0
    assert "ACCEL_TGI_PREPACK is off: no copies" in packing.describe()
    assert all("forward" not in m.__dict__ and not hasattr(m, "_accel_packed_weight") for m in target.model.linears())
    on = packed_linears.pack_target(target, timer=fixed_rows(2), environ={"ACCEL_TGI_PREPACK": "on"})
    assert len(on.modules) == 3 and on.packed_bytes > 0
    on.undo()


def test_a_wrong_accel_tgi_prepack_names_the_valid_values(fake_linear_module):
    with pytest.raises(envs.EnvVarError, match="valid values: 1/0, true/false, yes/no, on/off"):
        packed_linears.pack_target(model(), environ={"ACCEL_TGI_PREPACK": "sometimes"})


def test_without_tgi_fastlinear_nothing_is_packed(monkeypatch):
    monkeypatch.setitem(sys.modules, "text_generation_server.layers.linear", None)
    packing = packed_linears.pack_target(model())
    assert packing.modules == [] and "FastLinear" in packing.reason


def test_the_benchmark_prints_both_products_per_row_count_and_the_pick(tmp_path):
    """``benchmarks/target_linears.py`` (what the start-up measurement decides, in full) on a small config."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 500}))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.target_linears", "--config", str(config),
                           "--rows", "1", "5", "--repeats", "1"], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "8 layer matrices and a 500x64 head" in proc.stdout
    # where vLLM is installed, its onednn_mm is a column of each group too
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| rows |"))
    vllm = " | layers vLLM onednn_mm" in header
    assert header == ("| rows | layers F.linear | layers oneDNN | layers native" + " | layers vLLM onednn_mm" * vllm
                      + " | head F.linear | head oneDNN | head native" + " | head vLLM onednn_mm" * vllm + " |")
    cells = 8 if vllm else 6
    rows = [line for line in proc.stdout.splitlines() if re.match(rf"\| [15] \|( ([\d.]+|n/a) \|){{{cells}}}$", line)]
    assert len(rows) == 2, proc.stdout
    native = "native" if cpu_linear.ops() is not None else "oneDNN"
    assert all(("n/a" in row) == (native == "oneDNN") for row in rows)
    assert re.search(rf"measurement \({native} product\) keeps F.linear up to: \{{'layers': \d, 'head': \d\}} rows",
                     proc.stdout)


def test_the_benchmark_names_a_missing_config_and_missing_keys(tmp_path):
    def run(path):
        return subprocess.run([sys.executable, "-m", "benchmarks.target_linears", "--config", str(path)],
                              cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    proc = run(tmp_path / "nope.json")
    assert proc.returncode != 0 and "nope.json: no such file (a Llama config.json" in proc.stderr
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    proc = run(tmp_path / "config.json")
    assert proc.returncode != 0
    assert "lacks intermediate_size, num_hidden_layers, vocab_size (a Llama config.json has them)" in proc.stderr
