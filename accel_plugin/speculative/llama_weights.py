"""The weights of a Llama draft checkpoint, read for the lean forward (:mod:`.llama`).

Safetensors only (a pickle can run code when loaded), tensors borrowed from the
target and a pruned LM head as :mod:`.draft_format` describes; q/k/v and gate/up
projections fused per layer; the RoPE tables, as transformers computes them for the
config's ``rope_theta`` and static ``rope_scaling`` types. A checkpoint the lean
forward cannot run raises :class:`DraftModelError`, naming the setting and value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..models.dirs import ModelDirError, check_model_dir
from .draft_format import DraftFormatError, load_tensors

__all__ = ["DraftModelError", "LlamaWeights", "cast_matrices", "load_llama_weights", "map_matrices", "rope_tables",
           "weight_bytes"]

_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


class DraftModelError(ValueError):
    """A draft checkpoint the lean forward cannot run (names the setting and value)."""


def rope_tables(model_dir: Path, cfg: dict, head_dim: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[length, head_dim]`` in float32, as transformers computes them."""
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    params = {**legacy, **params}
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope_type not in _STATIC_ROPE_TYPES:
        raise DraftModelError(
            f"{model_dir}: rope type {rope_type!r} is not supported by the draft engine "
            f"(supported: {', '.join(_STATIC_ROPE_TYPES)})"
        )
    if rope_type == "default":
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        scaling = 1.0
    else:
        from transformers import AutoConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        hf_config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False)
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
        inv_freq = inv_freq.float()
    positions = torch.arange(length, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


class _Layer:
    __slots__ = ("down", "down_b", "gate_up", "gate_up_b", "ln_in", "ln_post", "o", "o_b", "qkv", "qkv_b")


@dataclass
class LlamaWeights:
    """A draft's tensors on its device and dtype."""

    embed: torch.Tensor  #: ``[vocab_size, hidden_size]``
    norm: torch.Tensor
    lm_head: torch.Tensor  #: ``[V, hidden_size]``, ``V`` = vocab_size or the pruned head's size
    head_vocab: torch.Tensor | None  #: token ids of the head's rows (``None``: the whole vocabulary)
    layers: list[_Layer]
    #: bytes of weights one forward reads (the embedding table only by row):
    #: the size-based estimate of what a forward costs on memory-bound hardware
    forward_bytes: int


def load_llama_weights(model_dir: Path, target_dir: Path | None, *, dtype: torch.dtype, device: torch.device,
                       vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                       head_dim: int, tied: bool) -> LlamaWeights:
    """Read and check the draft's weights (the sizes are its config.json's)."""
    # safetensors only: a pickle (pytorch_model.bin, *.pt) can run code when loaded
    try:
        check_model_dir(model_dir)
        tensors, spec = load_tensors(model_dir, target_dir)
    except (DraftFormatError, ModelDirError) as exc:
        raise DraftModelError(str(exc)) from None

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        t = tensors.get(name)
        if t is None:
            if required:
                raise DraftModelError(f"{model_dir}: weight {name!r} is missing from the safetensors files")
            return None
        return t.to(device, dtype).contiguous()

    def cat(*names: str, required: bool = True) -> torch.Tensor | None:
        parts = [take(n, required) for n in names]
        return None if any(p is None for p in parts) else torch.cat(parts, dim=0)

    embed = take("model.embed_tokens.weight")
    if embed.shape != (vocab_size, hidden_size):
        raise DraftModelError(
            f"{model_dir}: embed_tokens has shape {tuple(embed.shape)}, "
            f"config.json says ({vocab_size}, {hidden_size})"
        )
    norm = take("model.norm.weight")
    head = take("lm_head.weight", required=not tied)
    lm_head = embed if head is None else head
    head_vocab: torch.Tensor | None = None
    if spec is not None and spec.head_vocab:
        ids = tensors.get(spec.head_vocab)
        if ids is None or ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
            raise DraftModelError(
                f"{model_dir}: head_vocab tensor {spec.head_vocab!r} is missing or not a 1-d integer tensor"
            )
        ids = ids.to(torch.long)
        if len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise DraftModelError(f"{model_dir}: head_vocab ids must lie in 0..{vocab_size - 1}")
        head_vocab = ids.to(device)
        lm_head = lm_head.index_select(0, head_vocab).contiguous()
    layers: list[_Layer] = []
    for i in range(num_layers):
        p = f"model.layers.{i}."
        layer = _Layer()
        layer.ln_in = take(p + "input_layernorm.weight")
        layer.ln_post = take(p + "post_attention_layernorm.weight")
        attn = [p + f"self_attn.{x}_proj" for x in "qkv"]
        layer.qkv = cat(*(a + ".weight" for a in attn))
        layer.qkv_b = cat(*(a + ".bias" for a in attn), required=False)
        layer.o = take(p + "self_attn.o_proj.weight")
        layer.o_b = take(p + "self_attn.o_proj.bias", required=False)
        layer.gate_up = cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        layer.gate_up_b = cat(p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias", required=False)
        layer.down = take(p + "mlp.down_proj.weight")
        layer.down_b = take(p + "mlp.down_proj.bias", required=False)
        expect_qkv = (num_heads + 2 * num_kv_heads) * head_dim
        if layer.qkv.shape != (expect_qkv, hidden_size):
            raise DraftModelError(
                f"{model_dir}: layer {i} q/k/v projections have {layer.qkv.shape[0]} rows, "
                f"config.json implies {expect_qkv}"
            )
        layers.append(layer)
    return LlamaWeights(embed=embed, norm=norm, lm_head=lm_head, head_vocab=head_vocab, layers=layers,
                        forward_bytes=weight_bytes(layers, norm, lm_head))


def weight_bytes(layers: list[_Layer], norm: torch.Tensor, lm_head: torch.Tensor) -> int:
    """Bytes of weights one forward reads (the embedding table is read only by row)."""
    return sum(
        t.numel() * t.element_size()
        for layer in layers for t in (getattr(layer, n) for n in _Layer.__slots__) if t is not None
    ) + norm.numel() * norm.element_size() + lm_head.numel() * lm_head.element_size()


#: the matrices (and their biases) of a layer; the norms' weights are not among them
_MATRICES = ("qkv", "qkv_b", "o", "o_b", "gate_up", "gate_up_b", "down", "down_b")


def cast_matrices(layers: list[_Layer], dtype: torch.dtype) -> list[_Layer]:
    """Copies of ``layers`` whose projection matrices and biases are in ``dtype``
    (the RMSNorm weights are shared with the originals, unchanged)."""
    return map_matrices(layers, lambda t: t.to(dtype).contiguous())


def map_matrices(layers: list[_Layer], fn) -> list[_Layer]:
    """Copies of ``layers`` with ``fn`` applied to every projection matrix and bias
    (the RMSNorm weights are shared with the originals, unchanged)."""
    out = []
    for layer in layers:
        copy = _Layer()
        for name in _Layer.__slots__:
            t = getattr(layer, name)
            setattr(copy, name, fn(t) if name in _MATRICES and t is not None else t)
        out.append(copy)
    return out
