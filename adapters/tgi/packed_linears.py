"""A packed copy of the target's matrices for multi-row products while our drafts speculate in TGI (CPU, float32).

Why: TGI's ``FastLinear`` calls ``F.linear``. On a CPU, torch multiplies one row (a
plain decode step at batch 1) with a matrix-vector kernel that reads the matrix once,
and from about four rows with a general product that costs 1.5-2.4x more. Verifying k
draft tokens at batch 1 multiplies k + 1 rows per request, a batch of 8 at least 8:
with ``F.linear`` alone that step costs far more than a plain one, which no draft's
acceptance pays for.

The copy's product, the first that is available (``pack_target(product=...)``):

1. the native few-row product (:mod:`accel_plugin.kernels.cpu_linear`,
   ``kernels/csrc/cpu_linear.cpp``): the matrix in blocks of 64 output columns, streamed
   once for up to 6 rows, AVX-512; built with the native attention kernels;
2. oneDNN's prepacked float32 product (what torch's inductor uses for frozen CPU
   linears; 1.2x ``F.linear`` at one row, 1.3-1.5x at 4-8 rows where ``F.linear`` costs
   1.8-2.4x).

Measured on the 2-core machine (2026-12-06, TGI's torch 2.7 with IPEX, one thread,
SmolLM2-135M's 120 layer matrices, 30 distinct layers so that the weights stream from
memory as in a step; ``benchmarks/target_linears.py``):

| rows | 1 | 2 | 4 | 8 | 24 | 64 |
|---|---|---|---|---|---|---|
| ``F.linear`` | 32.4 ms | 36.8 | 60.8 | 76.6 | 83.5 | 121.9 |
| oneDNN prepacked | 37.6 ms | 43.2 | 44.6 | 50.1 | 68.5 | 116.5 |
| native few-row | 31.4 ms | 33.4 | 33.0 | 40.4 | 57.2 | 103.1 |

Each ``FastLinear`` keeps its matrix and gets the copy beside it, and a ``forward``
that multiplies ``F.linear``'s way up to :attr:`PackedLinears.dense_rows` rows, with
the copy above (the native product up to :data:`NATIVE_MAX_ROWS` rows, ``F.linear``
again for longer prompts). ``dense_rows`` is measured at start-up (:func:`dense_rows`:
both products over the model's matrices, cold, 1 to :data:`PROBE_ROWS` rows, the
median of three), once for the layers and once for the LM head (the widest matrix).

The cost: the copies double the target matrices' host memory while speculation is
attached (the start-up line says how much); ``ACCEL_TGI_PREPACK=off`` makes none
(every product then TGI's ``F.linear``). :meth:`PackedLinears.undo` (run by
``detach``, and so by ``uninstall()``) drops the copies and restores TGI's
``forward``; TGI's matrices are never touched.

Where it does not apply (a GPU, a dtype other than float32, tensor parallelism, neither
product available or agreeing with ``F.linear``), nothing changes and the start-up line
says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .._packing import NATIVE_MAX_ROWS, PROBE_ROWS
from .._packing import dense_rows as _dense_rows

__all__ = ["NATIVE_MAX_ROWS", "PROBE_ROWS", "PackedLinears", "dense_rows", "pack_target", "pass_ms"]

_PROBE_BYTES = 256 << 20  # the layers' matrices measured: a prefix of at least this many bytes (cold)
_PACKED = "_accel_packed_weight"


@dataclass
class PackedLinears:
    """The ``FastLinear`` modules of one model with prepacked copies, and how to take them off."""

    modules: list = field(default_factory=list)
    reason: str = ""  #: why nothing was packed ("" when something was)
    product: str = ""  #: the copies' product (native few-row or oneDNN's prepacked)
    max_rows: int | None = None  #: above this many rows F.linear again (``None``: the copy at every size)
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
        above = "" if self.max_rows is None else f" and above {self.max_rows} rows"
        return (f"{len(self.modules)} target matrices with a packed copy for multi-row verification, "
                f"{self.product} (+{self.packed_bytes / 2**20:.0f} MiB host memory; TGI's F.linear kept for {rows}, "
                f"measured{above}; dropped when speculation detaches)")


def _forward(module, linear: Callable, rows_dense: int, rows_max: int | None):
    def forward(input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // max(input.shape[-1], 1)
        if rows <= rows_dense or (rows_max is not None and rows > rows_max):
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
    every row count, over ``pairs`` of (matrix, prepacked copy) (:func:`.._packing.dense_rows`)."""
    return _dense_rows(pairs, linear, timer=timer, repeats=repeats)


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


def _product(prefer: str):
    """``(name, pack, linear, max_rows)`` of the copies' product, or ``(reason, None, None, 0)``:
    the native few-row product where it builds (``prefer`` ``auto``/``native``), else oneDNN's."""
    from accel_plugin.kernels import cpu_linear
    from accel_plugin.speculative.llama import packed_linear

    if prefer in ("auto", "native"):
        ops = cpu_linear.ops(torch.float32, torch.device("cpu"))
        if ops is not None:
            return (cpu_linear.NAME, *ops, NATIVE_MAX_ROWS)
        if prefer == "native":
            return f"the native product is not available ({cpu_linear.reason()})", None, None, 0
    ops = packed_linear(torch.float32, torch.device("cpu"))
    if ops is None:
        return "oneDNN's prepacked product is not available or disagrees with F.linear here", None, None, 0
    return ("oneDNN's prepacked product", *ops, None)


def pack_target(model, *, timer: Callable = pass_ms, environ=None, product: str = "auto") -> PackedLinears:
    """Give every ``FastLinear`` of TGI ``model`` (a ``FlashCausalLM``) a packed copy where it
    applies; the LM head is the one under ``model.model.lm_head``. ``environ``: where
    ``ACCEL_TGI_PREPACK`` is read (``os.environ`` by default); ``product``: ``auto`` (the
    native few-row product where it builds, else oneDNN's), ``native`` or ``onednn``."""
    from accel_plugin import envs

    if product not in ("auto", "native", "onednn"):
        raise ValueError(f"product must be auto, native or onednn; got {product!r}")
    if not envs.tgi_prepack(environ):
        return PackedLinears(reason=f"{envs.ACCEL_TGI_PREPACK} is off: no copies, no extra host memory")
    why = _why_not(model)
    if why is not None:
        return PackedLinears(reason=why)
    name, pack, linear, max_rows = _product(product)
    if pack is None:
        return PackedLinears(reason=name)
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
    result = PackedLinears(product=name, max_rows=max_rows)
    for group, modules in groups.items():
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
            result.dense_rows[group] = rows = dense_rows(probe, linear, timer=timer)
        for module, (weight, packed) in zip(modules, pairs):
            module.__dict__[_PACKED] = packed
            module.forward = _forward(module, linear, rows, max_rows)
            result.modules.append(module)
            result.packed_bytes += weight.numel() * weight.element_size()
    if not result.modules:
        result.reason = "no FastLinear in the model"
    return result
