"""Hugging Face model directories: checks with clear messages, and vocabularies.

The one home of these checks, for the draft YAML (:mod:`accel_plugin.speculative.draft_config.schema`) and
for tuning (``accel tune-draft``, ``accel bench``; :mod:`accel_plugin.tuning.loaders`).
A model directory holds ``config.json``, ``*.safetensors`` weights and (for a
target at least) tokenizer files (:func:`check_model_dir`; a draft the draft
engine runs: :func:`check_draft_dir`). A draft and its target must share one
vocabulary: the same ``vocab_size`` and the same token -> id map
(:meth:`TargetVocabulary.mismatch`). :func:`linear_shapes` reads a Llama config's
matrix shapes (the benchmarks of the products time them).

Framework-free: the standard library at import; ``tokenizers`` or
``transformers`` only when a vocabulary is read.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "TOKENIZER_FILES",
    "ModelDirError",
    "TargetVocabulary",
    "check_draft_dir",
    "check_model_dir",
    "has_tokenizer",
    "linear_shapes",
    "read_vocab",
    "vocab_size",
]

#: ``architectures`` of draft config.json files that the lean draft engine runs.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
#: any of these in a directory means it has a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
#: weight files that are not loaded, named in the message when no safetensors are found
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".gguf")


class ModelDirError(ValueError):
    """A directory that cannot be used as a model; the message names it and what is wrong."""


def check_model_dir(path: str | Path, *, need_tokenizer: bool = False) -> Path:
    """``path`` (``~`` expanded) as a model directory: config.json, safetensors weights
    and, with ``need_tokenizer``, tokenizer files. Raises :class:`ModelDirError`."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelDirError(f"model directory {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelDirError(f"{str(path)!r} has no config.json; expected a Hugging Face model directory")
    if not any(path.glob("*.safetensors")):
        others = sorted(p.name for p in path.iterdir() if p.suffix in _OTHER_WEIGHTS)
        found = f"; found {', '.join(others)}" if others else ""
        raise ModelDirError(
            f"{str(path)!r} has no *.safetensors weights{found}; only safetensors are loaded "
            "(convert with `model.save_pretrained(dir, safe_serialization=True)`)"
        )
    if need_tokenizer and not has_tokenizer(path):
        raise ModelDirError(f"{str(path)!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    return path


def check_draft_dir(path: str | Path, *, trust_remote_code: bool = False) -> Path:
    """:func:`check_model_dir`, and a model the draft engine runs: one of
    :data:`SUPPORTED_ARCHITECTURES`, no custom code unless ``trust_remote_code``."""
    path = check_model_dir(path)
    config_file = path / "config.json"
    try:
        hf_config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"cannot read {str(config_file)!r}: {exc}") from None
    if hf_config.get("auto_map") and not trust_remote_code:
        raise ModelDirError(
            f"{str(path)!r} needs custom code (auto_map in config.json); set trust_remote_code: true if you trust it"
        )
    archs = hf_config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ModelDirError(
            f"architecture {', '.join(archs) or '(none)'} of {str(path)!r} is not supported by the draft engine "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return path


def has_tokenizer(model_dir: Path) -> bool:
    return any((model_dir / f).exists() for f in TOKENIZER_FILES)


def read_vocab(model_dir: str | Path, *, trust_remote_code: bool = False) -> dict[str, int] | None:
    """Token -> id of the tokenizer saved in ``model_dir`` (added tokens included);
    ``None`` when it has none."""
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)
    if not has_tokenizer(model_dir):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code).get_vocab()


def vocab_size(model_dir: str | Path) -> int | None:
    """``vocab_size`` of ``model_dir/config.json``; ``None`` without the file or the key."""
    config_file = Path(model_dir) / "config.json"
    return json.loads(config_file.read_text()).get("vocab_size") if config_file.is_file() else None


class TargetVocabulary:
    """A target's vocabulary, to check drafts against: ``vocab_size`` from its
    config.json, the token -> id map from ``tokenizer_dir`` (default: the target's
    directory), read when a draft's sizes first agree with it."""

    def __init__(self, target_dir: str | Path, *, tokenizer_dir: str | Path | None = None,
                 trust_remote_code: bool = False):
        self.size = vocab_size(target_dir)
        self.trust_remote_code = trust_remote_code
        self._tokenizer_dir = Path(tokenizer_dir or target_dir)
        self._tokens: dict[str, int] | None = None
        self._read = False

    @property
    def tokens(self) -> dict[str, int] | None:
        """The token -> id map (``None``: the directory has no tokenizer)."""
        if not self._read:
            self._tokens = read_vocab(self._tokenizer_dir, trust_remote_code=self.trust_remote_code)
            self._read = True
        return self._tokens

    def mismatch(self, draft_dir: str | Path) -> str | None:
        """Why the draft in ``draft_dir`` cannot propose tokens for this target; ``None``
        when it can. What is unknown (no vocab_size, no tokenizer) is not compared."""
        draft_size = vocab_size(draft_dir)
        if self.size is not None and draft_size != self.size:
            return (f"the draft's vocab_size {draft_size} differs from the target's {self.size}; "
                    "draft and target must share one vocabulary (one tokenizer)")
        target_tokens = self.tokens
        if target_tokens is None:
            return None
        draft_tokens = read_vocab(draft_dir, trust_remote_code=self.trust_remote_code)
        if draft_tokens is None or draft_tokens == target_tokens:
            return None
        differ = sum(1 for tok, i in draft_tokens.items() if target_tokens.get(tok) != i)
        differ += len(set(target_tokens) - set(draft_tokens))
        return (f"the draft's tokenizer differs from the target's ({differ} tokens map to other ids); "
                "use a draft trained with the target's tokenizer")


def linear_shapes(config: dict) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """(out, in) of a Llama ``config.json``'s matrices, as a forward multiplies by them:
    per layer the fused QKV, O, fused gate-up and down projections, every layer in turn;
    and the LM head (the full vocabulary)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    layer = [((heads + 2 * kv) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter)]
    return layer * config["num_hidden_layers"], (config["vocab_size"], hidden)
