"""Target and draft model directories for tuning: checks that name the flag, and loading.

The checks themselves live in :mod:`accel_plugin.models.dirs` (shared with the
draft YAML); here their message is prefixed with the command-line flag that named
the directory and raised as :class:`~accel_plugin.tuning.errors.TuningError`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..models import dirs as model_dirs
from .errors import TuningError

__all__ = ["check_model_dir", "check_same_vocabulary", "load_draft_model", "load_lm", "load_tokenizer"]


def check_model_dir(path: str | Path, flag: str, *, need_tokenizer: bool = False) -> Path:
    """``path`` as a model directory, or :class:`TuningError` naming ``flag``."""
    try:
        return model_dirs.check_model_dir(path, need_tokenizer=need_tokenizer)
    except model_dirs.ModelDirError as exc:
        raise TuningError(f"{flag}: {exc}") from None


def check_same_vocabulary(target: Path, draft: Path, draft_flag: str = "--draft") -> None:
    """Raise :class:`TuningError` when the draft cannot propose tokens for the target."""
    problem = model_dirs.TargetVocabulary(target).mismatch(draft)
    if problem:
        raise TuningError(f"{draft_flag}: {problem}")


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def load_lm(path: Path):
    """A causal LM in float32, eval mode (weights may be stored in bf16)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars, not one per weight file
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True)
    model.eval()
    return model


def load_draft_model(draft_dir: Path, target_dir: Path):
    """A draft directory as a torch module: a plain checkpoint (:func:`load_lm`), or
    one that borrows tensors from ``target_dir`` (:func:`.draft_lm.load_draft`)."""
    from ..speculative.draft_format import DRAFT_KEY

    if DRAFT_KEY in json.loads((draft_dir / "config.json").read_text()):
        from .draft_lm import load_draft

        return load_draft(draft_dir, target_dir)
    return load_lm(draft_dir)
