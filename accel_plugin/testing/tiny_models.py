"""Tiny Llama-architecture models built locally: seeded, deterministic, offline.

Models cannot be downloaded on the machines this project is tested on, so tests and
examples build their own: a byte-level BPE tokenizer trained on text generated
here, and a ``LlamaForCausalLM`` with seeded random weights, saved as a Hugging
Face model directory (config.json, model.safetensors, tokenizer files) that vLLM
and transformers load like any other.

    from accel_plugin.testing.tiny_models import build_tiny_model
    path = build_tiny_model("gqa-d64", "/tmp/models")

Needs ``transformers`` and ``tokenizers`` (test extras), imported lazily.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

__all__ = ["SHAPES", "TinyModelSpec", "build_tiny_model", "build_tokenizer", "corpus"]

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")


@dataclass(frozen=True)
class TinyModelSpec:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int = 384
    max_position_embeddings: int = 1024
    # Larger than Llama's 0.02 so that logits are decisive: greedy decoding of a
    # random model then rarely hits near-ties that would make comparisons fragile.
    initializer_range: float = 0.1
    seed: int = 0
    dtype: str = "float32"

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


#: The shapes tests use: MHA and GQA, head_dim 32 and 64.
SHAPES: dict[str, TinyModelSpec] = {
    "mha-d32": TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=32, intermediate_size=256),
    "gqa-d32": TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256),
    "mha-d64": TinyModelSpec(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=64, intermediate_size=256),
    "gqa-d64": TinyModelSpec(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512),
    # A one-layer model sharing the tokenizer: a draft for speculative-decoding tests.
    "draft-d32": TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=32, intermediate_size=128, seed=1),
}

_WORDS = (
    "the a model token cache block attention kernel draft target request order refund "
    "delivery ticket python def class import return value list dict string number "
    "fast slow small large prompt answer question support customer code text data "
    "is are was be has have will can not and or but if then else for while with from"
).split()


def corpus(num_lines: int = 2000, seed: int = 0) -> list[str]:
    """Seeded pseudo-text the tokenizer is trained on (prose, code-like lines, support-like lines)."""
    rng = random.Random(seed)
    lines = []
    for i in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        kind = i % 3
        if kind == 0:
            lines.append(" ".join(words).capitalize() + ".")
        elif kind == 1:
            lines.append(f"def {words[0]}_{words[1]}({words[2]}, {words[3]}):\n    return {words[-1]}")
        else:
            lines.append(f"Customer: my {words[0]} ticket #{rng.randint(100, 999)} {' '.join(words[1:])}?")
    return lines


def build_tokenizer(out_dir: str | Path, vocab_size: int = 384, seed: int = 0):
    """Train a byte-level BPE tokenizer on :func:`corpus`; save and return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(spec: TinyModelSpec | str, cache_dir: str | Path, **overrides) -> Path:
    """Build (or reuse) the model directory for ``spec`` under ``cache_dir``.

    ``spec`` is a :class:`TinyModelSpec` or a key of :data:`SHAPES`; ``overrides``
    replace spec fields. The directory name contains a hash of the spec, and a model
    is rebuilt only when its directory is missing or incomplete.
    """
    if isinstance(spec, str):
        if spec not in SHAPES:
            raise ValueError(f"unknown tiny model {spec!r}; known: {', '.join(SHAPES)}")
        name, spec = spec, SHAPES[spec]
    else:
        name = "custom"
    spec = replace(spec, **overrides) if overrides else spec
    out = Path(cache_dir) / f"tiny-{name}-{spec.key()}"
    marker = out / ".complete"
    if marker.exists():
        return out

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, vocab_size=spec.vocab_size, seed=0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype=spec.dtype,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(str(out), safe_serialization=True)
    marker.write_text(json.dumps(asdict(spec), indent=2))
    return out
