"""The target's matrices prepacked for oneDNN while our drafts speculate in TGI (CPU, float32).

Why: TGI's ``FastLinear`` calls ``F.linear``. On a CPU, torch multiplies one row (a
plain decode step at batch 1) with a matrix-vector kernel, and two or more rows with a
general product that repacks the whole weight matrix on every call. Measured with
TGI's torch 2.7, one thread, SmolLM2-135M's 30 layers and head (2026-12-04,
``docs/tgi.md``): 42 ms for one row, 73 ms for two, 95 ms for three. So verifying one
draft token at batch 1 made TGI's step 40% longer (the controller's ``v`` of 0.4-0.5),
which no draft's acceptance pays for. oneDNN's prepacked float32 product (what torch's
inductor uses for frozen CPU linears, and our drafts since 2026-12-03) takes 37 ms for
one row, 37 for two, 42 for three.

What it changes, per model, while :func:`accel_plugin.adapters.tgi.speculative.attach`
has our proposer on it: every ``FastLinear`` of the target gets its weight packed
(the dense one is freed: no extra memory) and a ``forward`` of its own that multiplies
with the packed matrix. ``.weight`` is gone meanwhile, so anything that reads it fails
loudly instead of reading a packed layout. :meth:`PackedLinears.undo` (run by
``detach``, and so by ``uninstall()``) unpacks each matrix exactly (a product with the
identity, bit for bit) and restores TGI's ``forward``.

Where it does not apply (a GPU, a dtype other than float32, tensor parallelism, a
torch without oneDNN, or a probe product that disagrees with ``F.linear``), nothing
changes and the start-up line says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["PackedLinears", "pack_target"]

_UNPACK_ROWS = 1024  # identity rows per product when unpacking (bounds the temporary)


@dataclass
class PackedLinears:
    """The packed ``FastLinear`` modules of one model, and how to put them back."""

    modules: list = field(default_factory=list)
    reason: str = ""  #: why nothing was packed ("" when something was)
    linear: Callable | None = None  #: the product with a packed matrix (``packed_linear``'s)

    def undo(self) -> None:
        for module in self.modules:
            packed = module.__dict__.pop("_accel_packed_weight")
            module.__dict__.pop("forward", None)
            module.weight = torch.nn.Parameter(_unpack(packed, self.linear), requires_grad=False)
        self.modules = []

    def describe(self) -> str:
        if not self.modules:
            return f"target matrices left as TGI has them ({self.reason})"
        return (f"{len(self.modules)} target matrices prepacked for oneDNN (multi-row verification at about "
                f"the cost of one row; undone when speculation detaches)")


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
    """Pack every ``FastLinear`` of TGI ``model`` (a ``FlashCausalLM``) where it applies."""
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

    result = PackedLinears(linear=linear)
    for module in model.model.modules():
        if type(module) is not FastLinear or module.weight.dim() != 2 or module.weight.device.type != "cpu":
            continue
        packed = pack(module.weight.detach())
        del module.weight  # the dense matrix is freed; .weight reads now fail loudly
        module._accel_packed_weight = packed
        module.forward = _packed_forward(module, linear)
        result.modules.append(module)
    if not result.modules:
        result.reason = "no FastLinear in the model"
    return result
