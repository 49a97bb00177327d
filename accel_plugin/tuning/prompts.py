"""Prompt files for ``accel tune-draft`` and ``accel bench acceptance``.

Two formats, chosen by the file's suffix:

- ``.jsonl``: one JSON value per line, either a string (the prompt) or an object
  ``{"prompt": "...", "domain": "support"}`` (``domain`` optional); prompts may
  contain newlines;
- anything else: plain text, one prompt per line (blank lines are skipped).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from .errors import TuningError

__all__ = ["Prompt", "read_prompts", "split_holdout"]


@dataclass(frozen=True)
class Prompt:
    text: str
    #: the label given in the file, if any (the proposer routes by text, not by label)
    label: str | None = None


def read_prompts(path: str | Path, *, flag: str = "--prompts") -> list[Prompt]:
    """Read a prompt file; raises :class:`TuningError` naming ``flag`` and the line."""
    path = Path(path)
    if not path.exists():
        raise TuningError(f"{flag}: prompt file {str(path)!r} does not exist")
    if not path.is_file():
        raise TuningError(f"{flag}: {str(path)!r} is not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TuningError(f"{flag}: cannot read {str(path)!r}: {exc}") from None
    prompts: list[Prompt] = []
    jsonl = path.suffix == ".jsonl"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(line))
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TuningError(f"{flag}: {path}:{number}: not valid JSON ({exc.msg})") from None
        if isinstance(value, str):
            value = {"prompt": value}
        if not isinstance(value, dict) or not isinstance(value.get("prompt"), str) or not value["prompt"]:
            raise TuningError(f'{flag}: {path}:{number}: expected a string or {{"prompt": "...", "domain": "..."}}')
        label = value.get("domain")
        if label is not None and not isinstance(label, str):
            raise TuningError(f"{flag}: {path}:{number}: 'domain' must be a string; got {label!r}")
        prompts.append(Prompt(value["prompt"], label))
    if not prompts:
        raise TuningError(f"{flag}: prompt file {str(path)!r} has no prompts (one per line, or JSONL)")
    return prompts


def split_holdout(prompts: list[Prompt], holdout: float, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out): a seeded shuffle, ``holdout`` a fraction in (0, 1) or a count >= 1."""
    n = len(prompts)
    if n < 2:
        raise TuningError(f"--prompts: need at least 2 prompts (some for training, some held out); got {n}")
    count = int(holdout) if holdout >= 1 else max(1, round(n * holdout))
    if count >= n:
        raise TuningError(f"--holdout: {holdout} leaves no prompts for training ({n} prompts in the file)")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held = sorted(order[:count])
    train = sorted(order[count:])
    return [prompts[i] for i in train], [prompts[i] for i in held]
