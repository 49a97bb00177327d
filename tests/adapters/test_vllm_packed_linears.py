"""Contract test of adapters/vllm/packed_linears.py with vLLM's real CPU dispatch
(``dispatch_cpu_unquantized_gemm``: oneDNN's handle, the layer's weight dropped) on layers
that hold only a ``weight``, as vLLM's linear layers do when the dispatch runs; the engine
configuration is a namespace of the fields the module reads. integration/test_vllm_speculative.py
runs it in real engines (the start-up line names the copies; outputs identical to plain)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from accel_plugin import envs
from accel_plugin.kernels import cpu_linear

packed_linears = pytest.importorskip("accel_plugin.adapters.vllm.packed_linears", reason="needs vLLM")
pytestmark = pytest.mark.skipif(cpu_linear.ops() is None, reason=f"no native product here ({cpu_linear.reason()})")


def config(device="cpu", dtype=torch.float32, tp=1, mode=0):
    return types.SimpleNamespace(
        device_config=types.SimpleNamespace(device=device, device_type=device),
        model_config=types.SimpleNamespace(dtype=dtype),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp),
        compilation_config=types.SimpleNamespace(mode=mode))


class Layer(torch.nn.Module):
    def __init__(self, n, k, gen, dtype=torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k, generator=gen).to(dtype), requires_grad=False)


@pytest.fixture
def dispatch():
    """vLLM's dispatch as the model loader calls it (``remove_weight=True``, as its linear layers do)."""
    from vllm.model_executor.layers import utils

    yield lambda layer: utils.dispatch_cpu_unquantized_gemm(layer, True)
    packed_linears.disarm()
    packed_linears.finish(None)


@pytest.mark.parametrize("cfg, reason", [
    (config(device="cuda"), "device cuda, not a CPU"),
    (config(dtype=torch.bfloat16), "dtype torch.bfloat16, not float32"),
    (config(tp=2), "tensor parallel over 2 ranks"),
])
def test_where_it_does_not_apply_it_says_why(cfg, reason):
    assert reason in packed_linears.why_not(cfg, environ={})
    assert packed_linears.why_not(config(), environ={}) is None
    # a compiled engine: none by default (vLLM's compiled products measured as fast), with "on" the choice in one op
    assert "a compiled engine (2)" in packed_linears.why_not(config(mode=2), environ={})
    assert "ACCEL_VLLM_PREPACK=on makes them" in packed_linears.why_not(config(mode=2), environ={})
    assert packed_linears.why_not(config(mode=2), environ={"ACCEL_VLLM_PREPACK": "on"}) is None
    assert packed_linears.why_not(config(mode=0), environ={"ACCEL_VLLM_PREPACK": " Auto "}) is None


def test_accel_vllm_prepack_off_makes_none_and_a_wrong_value_names_the_valid_ones():
    assert "ACCEL_VLLM_PREPACK is off" in packed_linears.why_not(config(), environ={"ACCEL_VLLM_PREPACK": "off"})
    assert envs.vllm_prepack({}) == envs.vllm_prepack({"ACCEL_VLLM_PREPACK": ""}) == "auto"
    assert envs.vllm_prepack({"ACCEL_VLLM_PREPACK": "1"}) == "on" and envs.vllm_prepack({"ACCEL_VLLM_PREPACK": "no"}) == "off"
    with pytest.raises(envs.EnvVarError, match="ACCEL_VLLM_PREPACK.*auto, or 1/0, true/false, yes/no, on/off"):
        packed_linears.why_not(config(), environ={"ACCEL_VLLM_PREPACK": "sometimes"})


def test_armed_layers_multiply_by_the_copy_between_the_measured_rows_and_64(dispatch, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    layers = torch.nn.ModuleList([Layer(96, 64, gen), Layer(70, 96, gen)])
    weights = [layer.weight.detach().clone() for layer in layers]
    calls = []
    native = cpu_linear.linear
    monkeypatch.setattr(cpu_linear, "linear", lambda *a: calls.append(a[0].shape[0]) or native(*a))
    packed_linears.arm()
    assert packed_linears.armed()
    for layer in layers:
        dispatch(layer)
    assert layers[0].weight.numel() == 0  # vLLM dropped it: the copy was taken before

    def timer(entries, rows, use_packed, linear):  # vLLM's product wins up to 2 rows
        return (1.0 if rows <= 2 else 2.0) if not use_packed else 1.5

    result = packed_linears.finish(layers, timer=timer)
    assert not packed_linears.armed() and result.layers == 2 and result.dense_rows == {"layers": 2}
    assert "2 target matrices with a copy" in result.describe() and "layers up to 2 rows" in result.describe()
    bias = torch.randn(96, generator=gen)
    for rows, by_copy in ((1, False), (2, False), (3, True), (64, True), (65, False)):
        calls.clear()
        x = torch.randn(rows, 64, generator=gen)
        out = layers[0].cpu_linear(x, layers[0].weight, bias)
        torch.testing.assert_close(out, F.linear(x, weights[0], bias), rtol=1e-4, atol=1e-4)
        assert calls == ([rows] if by_copy else []), rows
    x = torch.randn(5, 96, generator=gen)
    torch.testing.assert_close(layers[1].cpu_linear(x, layers[1].weight, None), F.linear(x, weights[1]),
                               rtol=1e-4, atol=1e-4)


def test_only_float32_cpu_matrices_of_the_armed_engine_get_a_copy(dispatch, monkeypatch):
    from vllm import config as vllm_config_module

    gen = torch.Generator().manual_seed(1)
    engine, other = object(), object()
    current = {"config": other}
    monkeypatch.setattr(vllm_config_module, "get_current_vllm_config_or_none", lambda: current["config"])
    packed_linears.arm(engine)
    theirs, bf16, ours = Layer(64, 64, gen), Layer(64, 64, gen, torch.bfloat16), Layer(64, 64, gen)
    dispatch(theirs)  # another engine loading in this process
    current["config"] = engine
    dispatch(bf16), dispatch(ours)
    result = packed_linears.finish(torch.nn.ModuleList([theirs, bf16, ours]),
                                   timer=lambda entries, rows, use_packed, linear: 1.0)
    assert result.layers == 1 and result.packed_bytes == 64 * 64 * 4


def test_disarm_puts_vllms_dispatch_back_and_nothing_is_packed_without_arm(dispatch):
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    packed_linears.arm(), packed_linears.arm()
    assert utils.dispatch_cpu_unquantized_gemm is not original
    packed_linears.disarm()
    assert utils.dispatch_cpu_unquantized_gemm is original
    layer = Layer(64, 64, torch.Generator().manual_seed(2))
    dispatch(layer)
    result = packed_linears.finish(torch.nn.ModuleList([layer]))
    assert result.layers == 0 and "left as vLLM has them" in result.describe()


@pytest.mark.parametrize("compiled", [0, 2])
def test_an_input_embedding_beside_an_lm_head_keeps_no_copy(dispatch, monkeypatch, compiled):
    """A tied LM head (SmolLM2's) is a ``ParallelLMHead`` sharing the embedding's matrix: both
    pass vLLM's dispatch, only the head multiplies; the embedding gets vLLM's product back."""
    from vllm import config as vllm_config_module
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    gen = torch.Generator().manual_seed(3)

    def blank(cls, n=100, k=64):  # the layer as vLLM built it, without its tensor-parallel set-up
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer.weight = torch.nn.Parameter(torch.randn(n, k, generator=gen), requires_grad=False)
        return layer

    embedding, head, inner = blank(VocabParallelEmbedding), blank(ParallelLMHead), Layer(64, 64, gen)
    packed_linears.arm(config(mode=compiled))
    monkeypatch.setattr(vllm_config_module, "get_current_vllm_config_or_none", lambda: packed_linears._armed["for"])
    for layer in (embedding, head, inner):
        dispatch(layer)
    result = packed_linears.finish(torch.nn.ModuleList([embedding, head, inner]),
                                   timer=lambda entries, rows, use_packed, linear: 1.0)
    assert result.layers == 2 and set(result.dense_rows) == {"layers", "head"}
    assert result.packed_bytes == (128 * 64 + 64 * 64) * 4  # the copies as laid out: 100 columns padded to 128
    assert "_selector" not in getattr(embedding.cpu_linear, "__qualname__", "")
    assert "_selector" in head.cpu_linear.__qualname__
    # nothing holds the embedding's copy any more (a compiled engine's op table included)
    assert all(selector is None or selector.__closure__ is None or embedding not in
               [c.cell_contents for c in selector.__closure__] for selector, _ in packed_linears._traced)


def test_a_compiled_engine_chooses_at_every_call_inside_one_traced_op(dispatch, monkeypatch):
    """vLLM's CPU default traces the model once (DYNAMO_TRACE_ONCE): a compiled engine's layers
    call ``accel_vllm::target_linear``, which dynamo keeps whole (fullgraph, dynamic rows), so
    the copy still serves 1 to 64 rows and vLLM's product the others, call by call."""
    from vllm import config as vllm_config_module

    gen = torch.Generator().manual_seed(4)
    engine = config(mode=2)
    monkeypatch.setattr(vllm_config_module, "get_current_vllm_config_or_none", lambda: engine)
    calls = []
    native = cpu_linear.linear
    monkeypatch.setattr(cpu_linear, "linear", lambda *a: calls.append(a[0].shape[0]) or native(*a))
    layer = Layer(80, 64, gen)
    weight = layer.weight.detach().clone()
    packed_linears.arm(engine)
    dispatch(layer)
    result = packed_linears.finish(torch.nn.ModuleList([layer]),
                                   timer=lambda entries, rows, use_packed, linear: 1.5 if use_packed else rows)
    assert result.traced and "compiled: the choice inside accel_vllm::target_linear" in result.describe()
    bias = torch.randn(80, generator=gen)
    compiled = torch.compile(lambda x: layer.cpu_linear(x, layer.weight, bias), backend="eager", fullgraph=True,
                             dynamic=True)
    for rows, by_copy in ((1, False), (3, True), (64, True), (65, False), (2, True)):
        calls.clear()
        x = torch.randn(rows, 64, generator=gen)
        torch.testing.assert_close(compiled(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
        assert calls == ([rows] if by_copy else []), rows
