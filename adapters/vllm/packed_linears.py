"""Native copies of the target's matrices while our drafts speculate in vLLM (CPU, float32).

Why: vLLM's CPU build multiplies a float32 linear layer with oneDNN (``onednn_mm``, a
handle made at load time that holds the matrix prepacked; vLLM then drops the layer's
own ``weight``). A step of our speculation multiplies ``batch x (1 + drafts)`` rows with
each matrix, and the native few-row product (:mod:`accel_plugin.kernels.cpu_linear`,
``kernels/csrc/cpu_linear.cpp``) is faster than oneDNN's at every row count up to 64
on the 2-core machine (SmolLM2-135M's layer matrices, 2 threads, ms per step,
``.venv/bin/python -m benchmarks.target_linears --threads 2``, 2026-12-06):

| rows | 1 | 8 | 16 | 24 | 32 | 64 |
|---|---|---|---|---|---|---|
| vLLM ``onednn_mm`` | 19.5 ms | 23.7 | 30.3 | 36.5 | 42.4 | 69.1 |
| native few-row | 17.5 ms | 21.8 | 27.4 | 33.5 | 39.1 | 60.5 |

How (patch 10 of the vLLM ledger, :mod:`._patches`): vLLM's model runner builds our
proposer (:class:`~accel_plugin.adapters.vllm.DomainDraftProposer`) before it loads the
target. The proposer calls :func:`arm`, which wraps
``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``: while the target
loads, every 2-D float32 matrix gets its native copy before vLLM's own dispatch runs,
and the layer a ``cpu_linear`` that multiplies by vLLM's product up to
:attr:`PackedLinears.dense_rows` rows and above :data:`~.._packing.NATIVE_MAX_ROWS`
(prompts), by the copy in between. Once the target is loaded, the proposer's
``load_model`` calls :func:`finish`: vLLM's dispatch is put back, and ``dense_rows`` is
measured (both products over the model's own layers, 1 to 8 rows, the median of three;
once for the layers, once for the LM head). Engines without our proposer never see
the wrapper: it is installed only between the two calls, in the worker building one.

The cost: the copies hold the target's matrices again in host memory (the start-up line
says how much); ``ACCEL_VLLM_PREPACK=off`` makes none. A compiled engine (vLLM's CPU
default traces the model once with dynamo, ``DYNAMO_TRACE_ONCE``) gets none unless
``ACCEL_VLLM_PREPACK=on``: there the copies cost more than they save (ours 1.51x plain at
batch 1 with them, 1.98x without; 0.72x at batch 8, 1.02x without; docs/speculative.md). With
``on``, a Python choice by row
count would be fixed by that one trace, so there each layer calls one custom op,
``accel_vllm::target_linear`` (:func:`_target_linear_op`), which dynamo keeps as a call and
which chooses at every step. Where it does not apply (not a CPU, a dtype other than
float32, tensor parallelism, the native product not available), nothing changes and the
start-up line says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._packing import NATIVE_MAX_ROWS, dense_rows

__all__ = ["PackedLinears", "arm", "armed", "disarm", "dispatch", "finish", "why_not"]

_PROBE_BYTES = 256 << 20  # the layers' matrices measured: a prefix of at least this many bytes (cold)
#: the layers packed while armed: [(layer, vLLM's cpu_linear, copy, rows holder)]
_pending: list[tuple[Any, Callable, Any, list[int]]] = []
_ORIGINAL_ATTR = "__accel_original__"
#: the engine configuration whose target load gets copies, and whether that engine is compiled
_armed: dict[str, Any] = {"for": None, "traced": False}
#: the selectors of compiled engines' layers, by index, with each one's output columns; the index of each layer
_traced: list[tuple[Callable | None, int]] = []
_traced_index: dict[int, int] = {}
_op_holder: list[Callable] = []


@dataclass
class PackedLinears:
    """What :func:`finish` did: the layers with a native copy, or why none."""

    layers: int = 0
    reason: str = ""  #: why nothing was packed ("" when something was)
    dense_rows: dict = field(default_factory=dict)  #: "layers"/"head" -> rows still multiplied by vLLM's product
    packed_bytes: int = 0
    traced: bool = False  #: a compiled engine: each layer chooses inside ``accel_vllm::target_linear``

    def describe(self) -> str:
        if not self.layers:
            return f"target matrices left as vLLM has them ({self.reason})"
        rows = ", ".join(f"{name} up to {n} row{'s' * (n != 1)}" for name, n in self.dense_rows.items())
        from accel_plugin.kernels import cpu_linear

        return (f"{self.layers} target matrices with a copy for the {cpu_linear.NAME} (+"
                f"{self.packed_bytes / 2**20:.0f} MiB host memory; vLLM's product kept for {rows}, measured, "
                f"and above {NATIVE_MAX_ROWS} rows{'; compiled: the choice inside accel_vllm::target_linear' * self.traced})")


def _compilation_mode(vllm_config: Any):
    """vLLM's compilation mode of the engine ``vllm_config`` describes (0 / NONE: eager)."""
    return getattr(getattr(vllm_config, "compilation_config", None), "mode", 0)


def why_not(vllm_config: Any, environ=None) -> str | None:
    """Why the target of the engine ``vllm_config`` describes gets no copies (``None``: it gets them).
    Raises :class:`accel_plugin.envs.EnvVarError` for a wrong ``ACCEL_VLLM_PREPACK``."""
    from accel_plugin import envs
    from accel_plugin.kernels import cpu_linear

    setting = envs.vllm_prepack(environ)
    if setting == "off":
        return f"{envs.ACCEL_VLLM_PREPACK} is off: no copies, no extra host memory"
    device = str(getattr(vllm_config.device_config, "device_type", vllm_config.device_config.device))
    if device != "cpu":
        return f"device {device}, not a CPU"
    dtype = vllm_config.model_config.dtype
    if dtype != torch.float32:
        return f"dtype {dtype}, not float32"
    tp = vllm_config.parallel_config.tensor_parallel_size
    if tp != 1:
        return f"tensor parallel over {tp} ranks"
    if cpu_linear.ops(torch.float32, torch.device("cpu")) is None:
        return f"the native product is not available ({cpu_linear.reason()})"
    mode = _compilation_mode(vllm_config)
    if setting == envs.VLLM_PREPACK_AUTO and int(mode or 0) != 0:
        return (f"a compiled engine ({getattr(mode, 'name', mode)}): there the copies measured slower than "
                f"its own products (docs/speculative.md); {envs.ACCEL_VLLM_PREPACK}=on makes them")
    return None


def _utils():
    from vllm.model_executor.layers import utils

    return utils


def dispatch() -> Callable:
    """vLLM's CPU dispatch function as it is now (vLLM's, or our wrapper)."""
    return _utils().dispatch_cpu_unquantized_gemm


def armed() -> bool:
    """Whether vLLM's CPU dispatch is wrapped now (between :func:`arm` and :func:`finish`)."""
    return hasattr(_utils().dispatch_cpu_unquantized_gemm, _ORIGINAL_ATTR)


def _selector(original: Callable, copy: Any, rows_dense: list[int], linear: Callable) -> Callable:
    def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if rows <= rows_dense[0] or rows > NATIVE_MAX_ROWS:
            return original(x, weight, bias)
        return linear(x, copy, bias)

    return cpu_linear


def _target_linear_op() -> Callable:
    """``torch.ops.accel_vllm.target_linear(x, index, bias)``: the selector of compiled layer
    ``index`` as one custom op, so that dynamo traces the choice by row count as a call (made
    at each step) instead of fixing the branch its one trace took. Defined once per process."""
    if not _op_holder:
        @torch.library.custom_op("accel_vllm::target_linear", mutates_args=(),
                                 schema="(Tensor x, int index, Tensor? bias) -> Tensor")
        def target_linear(x, index, bias):
            return _traced[index][0](x, bias)

        @target_linear.register_fake
        def _(x, index, bias):
            return x.new_empty((*x.shape[:-1], _traced[index][1]))

        _op_holder.append(torch.ops.accel_vllm.target_linear)
    return _op_holder[0]


def _traced_selector(layer, selector: Callable, n: int) -> Callable:
    _traced.append((lambda x, bias: selector(x, layer.weight, bias), n))
    index, op = len(_traced) - 1, _target_linear_op()
    _traced_index[id(layer)] = index

    def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return op(x, index, bias)

    return cpu_linear


def arm(vllm_config: Any = None) -> None:
    """Wrap vLLM's CPU dispatch (idempotent): float32 matrices loaded from now on under
    ``vllm_config`` (vLLM's current configuration while a worker loads its model; ``None``:
    any) get a copy; a compiled engine's layers (``compilation_config.mode`` not NONE) choose
    inside one custom op (:func:`_target_linear_op`), an eager one's in Python."""
    utils = _utils()
    _armed.update({"for": vllm_config, "traced": int(_compilation_mode(vllm_config) or 0) != 0})
    if armed():
        return
    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        copy, ops = None, _ops_for(layer)
        if ops is not None:
            copy = ops[0](layer.weight)  # before vLLM may drop the layer's weight
        original(layer, remove_weight)
        if copy is not None and callable(getattr(layer, "cpu_linear", None)):
            rows = [0]
            _pending.append((layer, layer.cpu_linear, copy, rows))
            selector = _selector(layer.cpu_linear, copy, rows, ops[1])
            layer.cpu_linear = _traced_selector(layer, selector, copy.n) if _armed["traced"] else selector

    dispatch_cpu_unquantized_gemm.__doc__ = (original.__doc__ or "") + "\n\n(wrapped by accel-plugin)"
    setattr(dispatch_cpu_unquantized_gemm, _ORIGINAL_ATTR, original)
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def _ops_for(layer) -> tuple | None:
    """The native ``(pack, linear)`` when ``layer`` gets a copy: a 2-D float32 CPU matrix,
    loaded by the engine :func:`arm` was called for."""
    weight = getattr(layer, "weight", None)
    if not (isinstance(weight, torch.Tensor) and not weight.is_meta and weight.dim() == 2
            and weight.dtype == torch.float32 and weight.device.type == "cpu"):
        return None
    if _armed["for"] is not None:
        from vllm.config import get_current_vllm_config_or_none

        if get_current_vllm_config_or_none() is not _armed["for"]:
            return None
    from accel_plugin.kernels import cpu_linear

    return cpu_linear.ops(torch.float32, torch.device("cpu"))


def disarm() -> None:
    """Put vLLM's dispatch back (idempotent); layers already packed keep their copies."""
    utils = _utils()
    _armed.update({"for": None, "traced": False})
    original = getattr(utils.dispatch_cpu_unquantized_gemm, _ORIGINAL_ATTR, None)
    if original is not None:
        utils.dispatch_cpu_unquantized_gemm = original


def _pass_ms(entries, rows: int, use_packed: bool, linear: Callable) -> float:
    """One product of ``rows`` rows with every layer of ``entries`` (cold: each matrix once)."""
    xs: dict[int, torch.Tensor] = {}
    start = time.perf_counter()
    for layer, original, copy, _ in entries:
        k = copy.packed.shape[1]
        x = xs.setdefault(k, torch.randn(rows, k))
        linear(x, copy, None) if use_packed else original(x, layer.weight, None)
    return (time.perf_counter() - start) * 1e3


def finish(model: Any, *, timer: Callable = _pass_ms) -> PackedLinears:
    """Disarm, then measure where the copies of ``model``'s layers pay (the LM head apart: a
    ``ParallelLMHead``, else a ``VocabParallelEmbedding`` that serves as one); an input embedding
    beside an LM head keeps no copy (it only gathers), nor do layers packed for another model."""
    traced = _armed["traced"]
    disarm()
    from accel_plugin.kernels import cpu_linear

    ids = {id(m) for m in model.modules()} if isinstance(model, torch.nn.Module) else set()
    entries = [e for e in _pending if id(e[0]) in ids]
    _pending.clear()
    if not entries:
        return PackedLinears(reason="no float32 matrix was loaded through vLLM's CPU dispatch")
    _, linear = cpu_linear.ops(torch.float32, torch.device("cpu"))
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    heads = [e for e in entries if isinstance(e[0], ParallelLMHead)]
    embeddings = [e for e in entries if isinstance(e[0], VocabParallelEmbedding) and e not in heads]
    if heads:  # an input embedding only gathers rows: its copy is dropped, vLLM's product back
        for layer, original, _, _ in embeddings:
            layer.cpu_linear = original
            if id(layer) in _traced_index:  # a compiled engine's: its selector (and copy) go too
                _traced[_traced_index.pop(id(layer))] = (None, 0)
        embeddings = []
    groups = {"layers": [e for e in entries if not isinstance(e[0], VocabParallelEmbedding)],
              "head": heads or embeddings}
    result = PackedLinears(traced=traced)
    with torch.no_grad():
        for name, group in groups.items():
            if not group:
                continue
            probe, size = [], 0
            for entry in group:  # a prefix big enough to stream from memory, as in a step
                probe.append(entry)
                size += entry[2].packed.numel() * entry[2].packed.element_size()
                if size >= _PROBE_BYTES:
                    break
            rows = result.dense_rows[name] = dense_rows(probe, linear, timer=timer)
            for entry in group:
                entry[3][0] = rows
                result.packed_bytes += entry[2].packed.numel() * entry[2].packed.element_size()
            result.layers += len(group)
    return result
