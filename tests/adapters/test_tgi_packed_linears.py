"""Contract test of adapters/tgi/packed_linears.py: TGI's ``FastLinear`` (a fake of its six
lines: a ``weight`` Parameter, a ``bias``, ``F.linear``) with torch's real oneDNN packing.
integration/test_tgi_speculative.py runs it in the real TGI (the start-up line names the
laid-out matrices; the speculating runs, laid out, give the plain runs' ids, put back)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from accel_plugin.adapters.tgi import packed_linears
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


def test_laid_out_products_match_f_linear_and_undo_restores_tgi_exactly(fake_linear_module):
    target = model()
    dense = [m.weight.detach().clone() for m in target.model.linears()]
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    expected = target.model(x)
    packing = packed_linears.pack_target(target)
    assert len(packing.modules) == 3
    assert "2 target matrices transposed, 1 (the LM head) prepacked for oneDNN" in packing.describe()
    head = target.model.lm_head[0]
    assert "_accel_packed_weight" in head.__dict__ and "_accel_weight_t" not in head.__dict__
    for m, before in zip((target.model.layers[0], target.model.layers[2]), dense):
        assert torch.equal(m.__dict__["_accel_weight_t"], before.t()) and m._accel_weight_t.is_contiguous()
        assert "_accel_packed_weight" not in m.__dict__
    for m in packing.modules:
        assert "weight" not in m._parameters and "forward" in m.__dict__
        with pytest.raises(AttributeError):
            m.weight  # noqa: B018  (a read of the laid-out matrix fails loudly)
    for rows in (1, 2, 3, 7):
        torch.testing.assert_close(target.model(x[:rows]), expected[:rows], rtol=1e-4, atol=1e-3)  # float32 sums in another order
    packing.undo()
    assert packing.modules == []
    for m, before in zip(target.model.linears(), dense):
        assert torch.equal(m.weight, before) and "forward" not in m.__dict__ and not m.weight.requires_grad
        assert m.weight.is_contiguous() and set(m.__dict__) & {"_accel_weight_t", "_accel_packed_weight"} == set()
    assert torch.equal(target.model(x), expected)  # TGI's own F.linear again, bit for bit


def test_without_onednn_the_head_stays_as_tgi_has_it(fake_linear_module, monkeypatch):
    monkeypatch.setattr("accel_plugin.speculative.llama.packed_linear", lambda dtype, device: None)
    target = model()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    expected = target.model(x)
    packing = packed_linears.pack_target(target)
    assert len(packing.modules) == 2 and "weight" in target.model.lm_head[0]._parameters
    assert "the LM head as TGI has it (oneDNN's prepacked product is not available" in packing.describe()
    torch.testing.assert_close(target.model(x), expected, rtol=1e-4, atol=1e-3)  # float32 sums in another order
    packing.undo()
    assert torch.equal(target.model(x), expected)


@pytest.mark.parametrize("kwargs, reason", [({"dtype": torch.bfloat16}, "not float32"),
                                            ({"world_size": 2}, "tensor parallel over 2 ranks")])
def test_nothing_changes_where_it_does_not_apply(fake_linear_module, kwargs, reason):
    target = model(**kwargs)
    packing = packed_linears.pack_target(target)
    assert packing.modules == [] and reason in packing.describe()
    assert all("weight" in m._parameters for m in target.model.linears())


def test_without_tgi_fastlinear_nothing_is_packed(monkeypatch):
    monkeypatch.setitem(sys.modules, "text_generation_server.layers.linear", None)
    packing = packed_linears.pack_target(model())
    assert packing.modules == [] and "FastLinear" in packing.reason
