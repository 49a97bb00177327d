"""Contract test of adapters/tgi/packed_linears.py: TGI's ``FastLinear`` (a fake of its six
lines: a ``weight`` Parameter, a ``bias``, ``F.linear``) with torch's real oneDNN packing.
integration/test_tgi_speculative.py runs it in the real TGI (the start-up line names the
packed matrices; the speculating runs, packed, give the plain runs' ids, unpacked)."""

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


def model(dtype=torch.float32, world_size=1):
    gen = torch.Generator().manual_seed(0)
    layers = torch.nn.Sequential(
        FastLinear(torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)),
        torch.nn.GELU(),
        FastLinear(torch.randn(1000, 96, generator=gen), None),  # a head: many rows, no bias
    ).to(dtype)
    return types.SimpleNamespace(model=layers, device=torch.device("cpu"), dtype=dtype, world_size=world_size)


def test_packed_products_match_f_linear_and_undo_restores_tgi_exactly(fake_linear_module):
    target = model()
    dense = [m.weight.detach().clone() for m in target.model if isinstance(m, FastLinear)]
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    expected = target.model(x)
    packing = packed_linears.pack_target(target)
    assert len(packing.modules) == 2 and "2 target matrices prepacked" in packing.describe()
    for m in packing.modules:
        assert "weight" not in m._parameters and "forward" in m.__dict__
        with pytest.raises(AttributeError):
            m.weight  # noqa: B018  (a read of the packed layout fails loudly)
    for rows in (1, 2, 3, 7):
        torch.testing.assert_close(target.model(x[:rows]), expected[:rows], rtol=1e-5, atol=1e-4)
    packing.undo()
    assert packing.modules == []
    restored = [m for m in target.model if isinstance(m, FastLinear)]
    for m, before in zip(restored, dense):
        assert torch.equal(m.weight, before) and "forward" not in m.__dict__ and not m.weight.requires_grad
    assert torch.equal(target.model(x), expected)  # TGI's own F.linear again, bit for bit


@pytest.mark.parametrize("kwargs, reason", [({"dtype": torch.bfloat16}, "not float32"),
                                            ({"world_size": 2}, "tensor parallel over 2 ranks")])
def test_nothing_changes_where_it_does_not_apply(fake_linear_module, kwargs, reason):
    target = model(**kwargs)
    packing = packed_linears.pack_target(target)
    assert packing.modules == [] and reason in packing.describe()
    assert all("weight" in m._parameters for m in target.model if isinstance(m, FastLinear))


def test_without_tgi_fastlinear_nothing_is_packed(monkeypatch):
    monkeypatch.setitem(sys.modules, "text_generation_server.layers.linear", None)
    packing = packed_linears.pack_target(model())
    assert packing.modules == [] and "FastLinear" in packing.reason
