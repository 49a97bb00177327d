"""Target and draft model directories: checks with clear messages, and loading.

A model directory is a Hugging Face one: ``config.json``, ``*.safetensors``
weights and (for the target at least) tokenizer files. Draft and target must share
one vocabulary: the same ``vocab_size`` and the same token -> id map.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import TuningError

__all__ = ["check_model_dir", "check_same_vocabulary", "load_lm", "load_tokenizer"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_dir(path: str | Path, flag: str, *, need_tokenizer: bool = False) -> Path:
    """``path`` as a model directory, or :class:`TuningError` naming ``flag``."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise TuningError(f"{flag}: model directory {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise TuningError(f"{flag}: {str(path)!r} has no config.json; expected a Hugging Face model directory")
    if not list(path.glob("*.safetensors")):
        raise TuningError(f"{flag}: {str(path)!r} has no *.safetensors weights")
    if need_tokenizer and not any((path / f).exists() for f in _TOKENIZER_FILES):
        raise TuningError(f"{flag}: {str(path)!r} has no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    return path


def _vocab(path: Path) -> dict[str, int] | None:
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab(with_added_tokens=True)
    if any((path / f).exists() for f in _TOKENIZER_FILES):
        return load_tokenizer(path).get_vocab()
    return None


def check_same_vocabulary(target: Path, draft: Path, draft_flag: str = "--draft") -> None:
    """Raise :class:`TuningError` when the draft cannot propose tokens for the target."""
    t_size = json.loads((target / "config.json").read_text()).get("vocab_size")
    d_size = json.loads((draft / "config.json").read_text()).get("vocab_size")
    if t_size != d_size:
        raise TuningError(
            f"{draft_flag}: the draft's vocab_size {d_size} differs from the target's {t_size}; "
            "draft and target must share one tokenizer"
        )
    t_vocab, d_vocab = _vocab(target), _vocab(draft)
    if t_vocab is not None and d_vocab is not None and t_vocab != d_vocab:
        differ = sum(1 for tok, i in d_vocab.items() if t_vocab.get(tok) != i) + len(set(t_vocab) - set(d_vocab))
        raise TuningError(
            f"{draft_flag}: the draft's tokenizer differs from the target's ({differ} tokens map to other ids); "
            "use a draft trained with the target's tokenizer"
        )


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def load_lm(path: Path):
    """A causal LM in float32, eval mode (weights may be stored in bf16)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars, not one per weight file
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model
