"""Tiny draft models for the speculative tests and benchmark (seeded, offline).

A random draft agrees with a random target almost never, and the target itself
always; a *perturbed copy* of the target (its weight matrices plus seeded
Gaussian noise of ``scale`` times their standard deviation) sits in between, which
is what a partly good, domain-tuned draft looks like to the proposer. For the
tiny gqa-d64 target, scale 0.03 gives a greedy agreement of about 0.65.

    python vllm_spec_models.py TARGET_DIR OUT_DIR --scale 0.03
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def perturbed_copy(src: str | Path, dst: str | Path, scale: float, seed: int = 0) -> Path:
    """Copy the model dir ``src`` to ``dst`` with noisy weight matrices (idempotent)."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    marker = dst / ".perturbed"
    if marker.exists() and marker.read_text() == f"{src}:{scale}:{seed}":
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    gen = torch.Generator().manual_seed(seed)
    for f in sorted(dst.glob("*.safetensors")):
        weights = load_file(str(f))
        noisy = {
            name: (w + scale * w.float().std() * torch.randn(w.shape, generator=gen)).to(w.dtype) if w.ndim == 2 else w
            for name, w in weights.items()
        }
        save_file(noisy, str(f), metadata={"format": "pt"})
    marker.write_text(f"{src}:{scale}:{seed}")
    return dst


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--scale", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(perturbed_copy(args.src, args.dst, args.scale, args.seed))


def layered_pair(out_dir: str | Path, *, hidden_size: int = 512, num_layers: int = 8, damping: float = 0.05,
                 seed: int = 0) -> tuple[Path, Path]:
    """A target and a one-layer draft that predicts it well, for benchmarks (synthetic).

    The target is a random Llama whose layers after the first add only ``damping``
    times their usual contribution to the residual stream; the draft is the
    target's embedding, first layer, final norm and head. So the draft costs about
    1/num_layers of the target and agrees with it on most greedy tokens, like a
    good domain-tuned draft would. Returns (target_dir, draft_dir); idempotent.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from accel_plugin.testing.tiny_models import build_tokenizer

    out = Path(out_dir)
    target_dir, draft_dir = out / f"target-h{hidden_size}-l{num_layers}-d{damping}", out / f"draft-h{hidden_size}-d{damping}"
    if (target_dir / ".complete").exists() and (draft_dir / ".complete").exists():
        return target_dir, draft_dir
    heads = hidden_size // 64
    tokenizer = build_tokenizer(target_dir)
    build_tokenizer(draft_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        head_dim=64, max_position_embeddings=2048, initializer_range=0.1, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    target = LlamaForCausalLM(config).float()
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(damping)
            layer.mlp.down_proj.weight.mul_(damping)
    target.save_pretrained(str(target_dir), safe_serialization=True)
    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
    draft = LlamaForCausalLM(draft_config).float()
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    draft.load_state_dict(state)
    draft.save_pretrained(str(draft_dir), safe_serialization=True)
    (target_dir / ".complete").touch()
    (draft_dir / ".complete").touch()
    return target_dir, draft_dir
