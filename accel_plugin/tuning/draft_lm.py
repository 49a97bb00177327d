"""Drafts as trainable torch modules: from a checkpoint, or cut from the target.

:class:`DraftLM` wraps a transformers Llama body and a (possibly vocabulary-pruned)
head; its ``forward(input_ids, attention_mask)`` returns an object with ``.logits``
over the head's tokens, and ``head_vocab`` (or ``None``) maps a logit index back to
a token id. Tensors a draft borrows from its target
(:mod:`accel_plugin.speculative.draft_format`) are frozen: training changes only
what the draft stores itself, and :meth:`DraftLM.save` writes only that.

- :func:`load_draft`: a draft directory (a plain Hugging Face checkpoint, or one
  that borrows from ``target_dir``);
- :func:`draft_from_target`: a new draft made of target layers, for example layers
  0-3 kept as they are (borrowed) and a copy of layer 29 to train, with the
  target's embedding and a head pruned to the tokens a domain uses.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from .errors import TuningError

__all__ = ["DraftLM", "draft_from_target", "head_vocab_from_counts", "load_draft"]

_EMBED = "model.embed_tokens.weight"


import torch
import torch.nn.functional as F


class DraftLM(torch.nn.Module):
    """A transformers Llama body and a head (pruned to ``head_vocab`` when given).

    ``borrowed``: names of tensors read from the target (frozen; not saved).
    """

    def __init__(self, hf_model, config: dict, spec, head_vocab, borrowed: set[str]):
        super().__init__()
        self.hf = hf_model
        self.config_dict = config
        self.spec = spec
        self.borrowed = set(borrowed)
        self.register_buffer("head_vocab", head_vocab, persistent=False)
        tied = bool(self.hf.config.tie_word_embeddings)
        for name, param in self.hf.named_parameters():
            if name in self.borrowed or (tied and name == "lm_head.weight" and _EMBED in self.borrowed):
                param.requires_grad_(False)

    def head_weight(self) -> torch.Tensor:
        weight = self.hf.lm_head.weight
        return weight if self.head_vocab is None else weight.index_select(0, self.head_vocab)

    def forward(self, input_ids, attention_mask=None):
        hidden = self.hf.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return SimpleNamespace(logits=F.linear(hidden, self.head_weight()))

    def save(self, out: Path, dtype: torch.dtype | None = None) -> Path:
        """Write the draft to ``out``: what it does not borrow, in ``dtype``."""
        from accel_plugin.speculative.draft_format import save_draft

        if self.spec is None:  # a plain checkpoint stays one
            out.mkdir(parents=True, exist_ok=True)
            self.hf.to(dtype or self.hf.dtype).save_pretrained(str(out), safe_serialization=True)
            return out
        state = self.hf.state_dict()
        if self.hf.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        tensors = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
                   for k, v in state.items() if k not in self.borrowed}
        if self.head_vocab is not None:
            tensors[self.spec.head_vocab] = self.head_vocab.to(torch.int64)
        config = dict(self.config_dict)
        if dtype is not None:
            config["dtype"] = str(dtype).removeprefix("torch.")
            config.pop("torch_dtype", None)
        return save_draft(out, config, tensors, self.spec)


def _hf_from_tensors(config: dict, tensors: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig.from_dict({k: v for k, v in config.items() if k != "accel_draft"})
    model = LlamaForCausalLM(hf_config)
    state = {k: v.to(torch.float32) for k, v in tensors.items() if not k.startswith("accel.")}
    if hf_config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if hf_config.tie_word_embeddings else set())
    missing = sorted(expected - set(state))
    if missing:
        raise TuningError(f"the draft is missing weights: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    model.load_state_dict(state, strict=False)
    model.eval()
    return model


def load_draft(draft_dir: Path, target_dir: Path | None = None):
    """A draft directory as a :class:`DraftLM` (float32, eval mode)."""
    from accel_plugin.speculative.draft_format import DraftFormatError, load_tensors

    try:
        tensors, spec = load_tensors(draft_dir, target_dir)
    except DraftFormatError as exc:
        raise TuningError(f"--draft: {exc}") from None
    config = json.loads((Path(draft_dir) / "config.json").read_text())
    head_vocab = None
    borrowed: set[str] = set()
    if spec is not None:
        if spec.head_vocab:
            head_vocab = tensors.pop(spec.head_vocab).long()
        borrowed = _borrowed_names(spec.from_target, tensors)
    return DraftLM(_hf_from_tensors(config, tensors), config, spec, head_vocab, borrowed)


def _borrowed_names(from_target: dict[str, str], tensors: dict) -> set[str]:
    out = set()
    for key in from_target:
        out |= {name for name in tensors if (name.startswith(key) if key.endswith(".") else name == key)}
    return out


def head_vocab_from_counts(counts: dict[int, int], size: int, vocab_size: int):
    """The ``size`` most frequent token ids (ties: the smaller id), sorted by id."""
    if not 1 <= size <= vocab_size:
        raise TuningError(f"--head-vocab must be in 1..{vocab_size} (the target's vocabulary); got {size}")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]
    ids = [token for token, _ in ranked]
    if len(ids) < size:  # fewer distinct tokens seen than asked for: fill with the lowest unused ids
        seen = set(ids)
        ids += [t for t in range(vocab_size) if t not in seen][: size - len(ids)]
    return torch.tensor(sorted(ids), dtype=torch.int64)


def draft_from_target(target_dir: Path, layers: list[int], train_layers: int, head_vocab=None):
    """A new draft of target layers ``layers`` (in order); the last ``train_layers`` of
    them (and the final norm) are copies to train, the others and the embedding are
    borrowed from the target (frozen, not stored); ``head_vocab``: token ids of a
    pruned head, or ``None`` for the whole vocabulary."""
    from accel_plugin.speculative.draft_format import DraftSpec, embed_fingerprint, load_tensors

    config = json.loads((target_dir / "config.json").read_text())
    num = config.get("num_hidden_layers", 0)
    bad = [i for i in layers if not 0 <= i < num]
    if not layers or bad:
        raise TuningError(f"--from-target-layers: layer indices must lie in 0..{num - 1} (the target has {num}); got "
                          f"{', '.join(map(str, bad or layers)) or 'none'}")
    if not 0 <= train_layers <= len(layers):
        raise TuningError(f"--train-layers must be in 0..{len(layers)} (the draft's layers); got {train_layers}")
    target_tensors, _ = load_tensors(target_dir)
    tied = bool(config.get("tie_word_embeddings", False))
    from_target = {_EMBED: _EMBED}
    if not tied:
        from_target["lm_head.weight"] = "lm_head.weight"
    tensors = {_EMBED: target_tensors[_EMBED], "model.norm.weight": target_tensors["model.norm.weight"].clone()}
    if not tied:
        tensors["lm_head.weight"] = target_tensors["lm_head.weight"]
    frozen = len(layers) - train_layers
    for i, src in enumerate(layers):
        prefix, src_prefix = f"model.layers.{i}.", f"model.layers.{src}."
        for name, value in target_tensors.items():
            if name.startswith(src_prefix):
                tensors[prefix + name[len(src_prefix):]] = value if i < frozen else value.clone()
        if i < frozen:
            from_target[prefix] = src_prefix
    draft_config = {**config, "num_hidden_layers": len(layers)}
    draft_config.pop("accel_draft", None)
    spec = DraftSpec(
        from_target=from_target,
        head_vocab="accel.head_vocab" if head_vocab is not None else None,
        target={"vocab_size": config.get("vocab_size"), "hidden_size": config.get("hidden_size"),
                "num_hidden_layers": num, "layers": list(layers),
                "embed_fingerprint": embed_fingerprint(target_tensors[_EMBED])},
    )
    borrowed = _borrowed_names(from_target, tensors)
    return DraftLM(_hf_from_tensors(draft_config, tensors), draft_config, spec, head_vocab, borrowed)
