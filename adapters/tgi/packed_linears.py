"""A oneDNN-prepacked copy of the target's matrices for multi-row products while our drafts speculate in TGI (CPU, float32).

Why: TGI's ``FastLinear`` calls ``F.linear``. On a CPU, torch multiplies one row (a
plain decode step at batch 1) with a matrix-vector kernel, and several rows with a
general product that repacks the whole weight matrix on every call. Verifying k draft
tokens at batch 1 multiplies k + 1 rows per request: with ``F.linear`` alone that step
cost far more than a plain one (on the first 2-core machine, 2026-12-04, one thread,
SmolLM2-135M's 30 layers and head: 42 ms for one row, 73 ms for two, 95 ms for three),
which no draft's acceptance pays for. oneDNN's prepacked float32 product (what torch's
inductor uses for frozen CPU linears, and our drafts since 2026-12-03) took 37, 37 and
42 ms there.

Which product wins depends on the machine and the row count. On the rebuilt 2-core
machine (2026-12-05, TGI's torch 2.7 with IPEX, one thread, SmolLM2-135M's 120 layer
matrices, 30 distinct layers so that the weights stream from memory as in a step):

| rows | 1 | 2 | 3 | 4 | 8 | 16 |
|---|---|---|---|---|---|---|
| ``F.linear`` | 32.2 ms | 37.9 | 40.2 | 60.3 | 80.9 | 76.0 |
| prepacked | 40.9 ms | 42.1 | 40.9 | 44.3 | 51.1 | 61.2 |

Replacing the matrices by prepacked ones (this module until 2026-12-05) therefore made
every step of one row 20% slower there: a TGI engine with our proposer read 0.86-0.87x
of TGI's own at batch 1 whenever nothing was drafted. So each ``FastLinear`` keeps its
matrix and gets a prepacked copy beside it, and a ``forward`` that multiplies
``F.linear``'s way up to :attr:`PackedLinears.dense_rows` rows and with the prepacked
copy above. ``dense_rows`` is measured at start-up (:func:`dense_rows`: both products
over the model's matrices, cold, 1 to :data:`PROBE_ROWS` rows, the median of three),
once for the layers and once for the LM head (the widest matrix; it prefers the
prepacked product sooner).

The cost: the prepacked copies double the target matrices' host memory while
speculation is attached (the start-up line says how much). :meth:`PackedLinears.undo`
(run by ``detach``, and so by ``uninstall()``) drops the copies and restores TGI's
``forward``; TGI's matrices are never touched.

Where it does not apply (a GPU, a dtype other than float32, tensor parallelism, a
torch without oneDNN, or a probe product that disagrees with ``F.linear``), nothing
changes and the start-up line says why.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = ["PROBE_ROWS", "PackedLinears", "dense_rows", "pack_target", "pass_ms"]

#: row counts the start-up measurement compares the two products at (1..PROBE_ROWS)
PROBE_ROWS = 8
_PROBE_BYTES = 256 << 20  # the layers' matrices measured: a prefix of at least this many bytes (cold)
_PACKED = "_accel_packed_weight"


@dataclass
class PackedLinears:
    """The ``FastLinear`` modules of one model with prepacked copies, and how to take them off."""

    modules: list = field(default_factory=list)
    reason: str = ""  #: why nothing was packed ("" when something was)
    dense_rows: dict = field(default_factory=dict)  #: "layers"/"head" -> rows still multiplied by F.linear
    packed_bytes: int = 0

    def undo(self) -> None:
        for module in self.modules:
            module.__dict__.pop(_PACKED, None)
            module.__dict__.pop("forward", None)
        self.modules = []

    def describe(self) -> str:
        if not self.modules:
            return f"target matrices left as TGI has them ({self.reason})"
        rows = ", ".join(f"{name} up to {n} row{'s' * (n != 1)}" for name, n in self.dense_rows.items())
        return (f"{len(self.modules)} target matrices with a oneDNN-prepacked copy for multi-row verification "
                f"(+{self.packed_bytes / 2**20:.0f} MiB host memory; TGI's F.linear kept for {rows}, measured; "
                f"dropped when speculation detaches)")


def _forward(module, linear: Callable, rows_dense: int):
    def forward(input: torch.Tensor) -> torch.Tensor:
        if input.numel() <= rows_dense * input.shape[-1]:
            return F.linear(input, module.weight, module.bias)
        return linear(input, module.__dict__[_PACKED], module.bias)

    return forward


def pass_ms(pairs, rows: int, use_packed: bool, linear: Callable) -> float:
    """One product of ``rows`` rows with every matrix of ``pairs`` (cold: each matrix once)."""
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w, _ in pairs}
    start = time.perf_counter()
    for weight, packed in pairs:
        x = xs[weight.shape[1]]
        linear(x, packed, None) if use_packed else F.linear(x, weight)
    return (time.perf_counter() - start) * 1e3


def dense_rows(pairs, linear: Callable, *, timer: Callable = pass_ms, repeats: int = 3) -> int:
    """The most rows up to which ``F.linear`` is at least as fast as the prepacked product at
    every row count, over ``pairs`` of (matrix, prepacked copy): 0 when the prepacked one wins
    at one row, :data:`PROBE_ROWS` when ``F.linear`` never loses up to there."""
    timer(pairs, 1, False, linear), timer(pairs, 1, True, linear)  # warm-up: first calls allocate
    for rows in range(1, PROBE_ROWS + 1):
        t_dense = statistics.median(timer(pairs, rows, False, linear) for _ in range(repeats))
        t_packed = statistics.median(timer(pairs, rows, True, linear) for _ in range(repeats))
        if t_packed < t_dense:
            return rows - 1
    return PROBE_ROWS


def _why_not(model) -> str | None:
    if not isinstance(getattr(model, "model", None), torch.nn.Module):
        return "no torch module under model.model"
    if getattr(model, "device", torch.device("cpu")).type != "cpu":
        return "not a CPU"
    if getattr(model, "dtype", None) != torch.float32:
        return f"dtype {getattr(model, 'dtype', None)}, not float32"
    if getattr(model, "world_size", 1) != 1:
        return f"tensor parallel over {model.world_size} ranks"
    return None


def pack_target(model, *, timer: Callable = pass_ms) -> PackedLinears:
    """Give every ``FastLinear`` of TGI ``model`` (a ``FlashCausalLM``) a prepacked copy where it
    applies; the LM head is the one under ``model.model.lm_head``."""
    from accel_plugin.speculative.llama import packed_linear

    why = _why_not(model)
    if why is not None:
        return PackedLinears(reason=why)
    ops = packed_linear(torch.float32, torch.device("cpu"))
    if ops is None:
        return PackedLinears(reason="oneDNN's prepacked product is not available or disagrees with F.linear here")
    pack, linear = ops
    try:
        from text_generation_server.layers.linear import FastLinear
    except ImportError:  # a TGI without it: nothing to pack
        return PackedLinears(reason="TGI has no text_generation_server.layers.linear.FastLinear")
    head = getattr(model.model, "lm_head", None)
    head_ids = {id(m) for m in head.modules()} if isinstance(head, torch.nn.Module) else set()
    groups: dict[str, list] = {"layers": [], "head": []}
    for module in model.model.modules():
        if type(module) is FastLinear and module.weight.dim() == 2 and module.weight.device.type == "cpu":
            groups["head" if id(module) in head_ids else "layers"].append(module)
    result = PackedLinears()
    for name, modules in groups.items():
        if not modules:
            continue
        pairs = [(m.weight.detach(), pack(m.weight.detach())) for m in modules]
        probe, size = [], 0
        for pair in pairs:  # a prefix big enough to stream from memory, as in a step
            probe.append(pair)
            size += pair[0].numel() * pair[0].element_size()
            if size >= _PROBE_BYTES:
                break
        with torch.no_grad():
            result.dense_rows[name] = rows = dense_rows(probe, linear, timer=timer)
        for module, (weight, packed) in zip(modules, pairs):
            module.__dict__[_PACKED] = packed
            module.forward = _forward(module, linear, rows)
            result.modules.append(module)
            result.packed_bytes += weight.numel() * weight.element_size()
    if not result.modules:
        result.reason = "no FastLinear in the model"
    return result
