"""The target's matrices laid out for multi-row products while our drafts speculate in TGI (CPU, float32).

Why: TGI's ``FastLinear`` calls ``F.linear``. On a CPU, torch multiplies one row (a
plain decode step at batch 1) with a matrix-vector kernel, and several rows with a
general product that repacks the whole ``[out, in]`` weight matrix on every call.
So verifying k draft tokens at batch 1 made TGI's step much longer than a plain one
(on the first 2-core machine, 2026-12-04, one thread, SmolLM2-135M's 30 layers and
head: 42 ms for one row, 73 ms for two, 95 ms for three), which no draft's acceptance
pays for.

Two layouts, measured on the rebuilt 2-core machine with TGI's torch 2.7, one thread,
the products of SmolLM2-135M's 30 layers and head per step (2026-12-05, ``docs/tgi.md``):

| rows | TGI's ``F.linear`` | all oneDNN-prepacked | layers transposed, head prepacked |
|---|---|---|---|
| 1 | 20.1 ms | 25.7 ms | 20.3 ms |
| 4 | 38.6 ms | 26.6 ms | 22.4 ms |
| 8 | 62.5 ms | 30.7 ms | 29.0 ms |
| 32 | 83.7 ms | 67.1 ms | 62.2 ms |

* the layers' matrices (``[out, in]`` with ``out`` a few times ``in`` at most) are
  stored transposed, ``[in, out]`` contiguous, and multiplied with ``x @ W.T`` as a
  plain row-major product: as fast as TGI's matrix-vector kernel at one row (a plain
  step costs what it did) and as fast as oneDNN's prepacked product at several;
* the LM head (``vocab x hidden``, the widest) is prepacked for oneDNN (what torch's
  inductor uses for frozen CPU linears, and our drafts since 2026-12-03): from three
  rows on it is about twice as fast as either, at one row 1-2 ms slower.

Prepacking everything (this module until 2026-12-05) made a plain step at batch 1 read
0.86-0.87x of TGI's own on the rebuilt machine, the packed head's one-row cost and the
small layer matrices' (a step drafts nothing whenever the controller has drafting off).

What it changes, per model, while :func:`accel_plugin.adapters.tgi.speculative.attach`
has our proposer on it: every ``FastLinear`` of the target gets its weight in one of
the layouts (the dense one is freed: no extra memory) and a ``forward`` of its own that
multiplies with it. ``.weight`` is gone meanwhile, so anything that reads it fails
loudly instead of reading another layout. :meth:`PackedLinears.undo` (run by
``detach``, and so by ``uninstall()``) puts each matrix back exactly (a transpose, or
a product with the identity, bit for bit) and restores TGI's ``forward``.

Where it does not apply (a GPU, a dtype other than float32, tensor parallelism),
nothing changes and the start-up line says why; a torch without oneDNN's prepacked
product (or one whose probe disagrees with ``F.linear``) leaves the head as TGI has it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["PackedLinears", "pack_target"]

_UNPACK_ROWS = 1024  # identity rows per product when unpacking (bounds the temporary)
_PACKED, _TRANSPOSED = "_accel_packed_weight", "_accel_weight_t"  # where a module keeps its matrix


@dataclass
class PackedLinears:
    """The ``FastLinear`` modules of one model in our layouts, and how to put them back."""

    modules: list = field(default_factory=list)
    reason: str = ""  #: why nothing was changed ("" when something was)
    linear: Callable | None = None  #: the product with a prepacked matrix (``packed_linear``'s)
    head_note: str = ""  #: why the head was not prepacked ("" when it was, or there is none)

    def undo(self) -> None:
        for module in self.modules:
            module.__dict__.pop("forward", None)
            if _PACKED in module.__dict__:
                dense = _unpack(module.__dict__.pop(_PACKED), self.linear)
            else:
                dense = module.__dict__.pop(_TRANSPOSED).t().contiguous()
            module.weight = torch.nn.Parameter(dense, requires_grad=False)
        self.modules = []

    def describe(self) -> str:
        if not self.modules:
            return f"target matrices left as TGI has them ({self.reason})"
        packed = sum(_PACKED in m.__dict__ for m in self.modules)
        head = (f", {packed} (the LM head) prepacked for oneDNN" if packed else
                f", the LM head as TGI has it ({self.head_note})" if self.head_note else "")
        return (f"{len(self.modules) - packed} target matrices transposed{head} (multi-row verification at "
                f"about the cost of one row; undone when speculation detaches)")


def _unpack(packed: torch.Tensor, linear: Callable) -> torch.Tensor:
    """The dense ``[out, in]`` matrix of ``packed``: ``I @ W.T``, transposed, exact in float32."""
    in_features = packed.shape[1]
    parts = []
    for start in range(0, in_features, _UNPACK_ROWS):
        rows = min(_UNPACK_ROWS, in_features - start)
        eye = torch.zeros(rows, in_features, dtype=torch.float32)  # rows start.. of the identity
        eye[:, start:start + rows] = torch.eye(rows, dtype=torch.float32)
        parts.append(linear(eye, packed, None))  # rows start.. of W.T
    return torch.cat(parts).t().contiguous()


def _packed_forward(module, linear):
    def forward(input: torch.Tensor) -> torch.Tensor:
        return linear(input, module._accel_packed_weight, module.bias)

    return forward


def _transposed_forward(module):
    def forward(input: torch.Tensor) -> torch.Tensor:
        out = input.matmul(module._accel_weight_t)
        return out if module.bias is None else out.add_(module.bias)

    return forward


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


def pack_target(model) -> PackedLinears:
    """Lay out every ``FastLinear`` of TGI ``model`` (a ``FlashCausalLM``) where it applies: the
    LM head (the ``FastLinear`` under ``model.model.lm_head``) prepacked, the others transposed."""
    from accel_plugin.speculative.llama import packed_linear

    why = _why_not(model)
    if why is not None:
        return PackedLinears(reason=why)
    try:
        from text_generation_server.layers.linear import FastLinear
    except ImportError:  # a TGI without it: nothing to lay out
        return PackedLinears(reason="TGI has no text_generation_server.layers.linear.FastLinear")
    head = getattr(model.model, "lm_head", None)
    head_ids = {id(m) for m in head.modules()} if isinstance(head, torch.nn.Module) else set()
    ops = packed_linear(torch.float32, torch.device("cpu"))
    result = PackedLinears(linear=ops[1] if ops is not None else None)
    for module in model.model.modules():
        if type(module) is not FastLinear or module.weight.dim() != 2 or module.weight.device.type != "cpu":
            continue
        weight = module.weight.detach()
        if id(module) in head_ids:
            if ops is None:
                result.head_note = "oneDNN's prepacked product is not available or disagrees with F.linear here"
                continue
            setattr(module, _PACKED, ops[0](weight))
            module.forward = _packed_forward(module, ops[1])
        else:
            setattr(module, _TRANSPOSED, weight.t().contiguous())
            module.forward = _transposed_forward(module)
        del module.weight  # the dense matrix is freed; .weight reads now fail loudly
        result.modules.append(module)
    if not result.modules:
        result.reason = "no FastLinear in the model"
    return result
