"""Settings of ``accel tune-draft`` and ``accel bench acceptance`` as typed, validated data.

Field names are the flags' (``--batch-size`` -> ``batch_size``), defaults the
commands'; a value out of range raises :class:`~accel_plugin.tuning.errors.TuningError`
naming the flag and the valid values. The command line builds its argparse types
from the same ``RANGES`` and ``CHOICES``. Light: nothing heavy is imported here, so
``accel --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from ..ranges import Range, check_settings
from .errors import TuningError

__all__ = ["BenchSettings", "TrainingSettings", "TuneSettings"]


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """How a draft is trained toward its target: the part of ``accel tune-draft`` that
    :class:`~accel_plugin.tuning.distill.DistillSettings` also holds, declared once here
    with the command's defaults (keyword only)."""

    #: optimiser steps in all; 0 writes the starting draft untrained
    steps: int = 200
    #: prompts per step
    batch_size: int = 8
    #: AdamW learning rate
    lr: float = 1e-3
    #: constant: the learning rate after the warm-up; cosine: decayed to a tenth of it by ``steps``
    lr_schedule: str = "constant"
    #: kl: match the target's top-k probabilities; nll: its greedy tokens
    loss: str = "kl"
    #: target tokens generated per prompt
    gen_tokens: int = 64
    #: prompts held out for the acceptance report: a fraction < 1 or a count (part of
    #: the training data, so part of a checkpoint's key)
    holdout: float = 0.1
    #: steps between checkpoints
    checkpoint_every: int = 50
    #: seed of the held-out split and the batches
    seed: int = 0

    def training_settings(self) -> dict[str, Any]:
        """The :class:`TrainingSettings` fields of this object, by name (to build
        another kind of settings from them)."""
        return {f.name: getattr(self, f.name) for f in fields(TrainingSettings)}


@dataclass(frozen=True)
class TuneSettings(TrainingSettings):
    """``accel tune-draft`` as data (:func:`accel_plugin.tuning.tune.tune`): the fields
    here and those of :class:`TrainingSettings`. Give exactly one of ``draft`` and
    ``from_target_layers``."""

    #: the target model directory
    target: str | Path
    #: the domain's prompts: one per line, or JSONL with a ``prompt`` key
    prompts: str | Path
    #: where the tuned draft is written (checkpoints in OUT/checkpoints)
    out: str | Path
    #: a draft model directory to start from (same tokenizer as the target)
    draft: str | Path | None = None
    #: or start from these target layers
    from_target_layers: tuple[int, ...] | None = None
    #: with ``from_target_layers``: how many of the last layers are trained
    train_layers: int = 1
    #: with ``from_target_layers``: prune the head to the N tokens the target uses most
    head_vocab: int | None = None
    #: wrap each prompt as a user message in the target tokenizer's chat template
    chat: bool = False
    #: prompts for the acceptance report instead of a ``holdout`` share of ``prompts``
    held_out: str | Path | None = None
    #: prompts the target continues at once while building the data
    gen_batch_size: int = 64
    #: tokens drafted per step in the acceptance report
    k: int = 5
    #: torch CPU threads (``None``: torch's)
    threads: int | None = None
    #: dtype of the saved weights; auto = the draft's
    save_dtype: str = "auto"
    #: False: delete OUT/checkpoints and start over
    resume: bool = True

    RANGES: ClassVar[dict[str, Range]] = {
        "train_layers": Range(int, 0),
        "head_vocab": Range(int, 1, optional=True),
        "steps": Range(int, 0),
        "batch_size": Range(int, 1),
        "lr": Range(float, 0.0, 1.0, low_open=True),
        "gen_tokens": Range(int, 1, 1024),
        "gen_batch_size": Range(int, 1, 1024),
        "holdout": Range(float, 0.0, low_open=True, whole_from=1),
        "k": Range(int, 1, 16),
        "checkpoint_every": Range(int, 1),
        "seed": Range(int, 0),
        "threads": Range(int, 1, optional=True),
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "loss": ("kl", "nll"),
        "lr_schedule": ("constant", "cosine"),
        "save_dtype": ("auto", "float32", "bfloat16"),
    }

    def __post_init__(self) -> None:
        check_settings(self, self.RANGES, self.CHOICES, error=TuningError)
        if (self.draft is None) == (self.from_target_layers is None):
            raise TuningError("give one of --draft and --from-target-layers")
        layers = self.from_target_layers
        if layers is not None:
            layers = tuple(layers)
            if not layers or len(set(layers)) != len(layers) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in layers):
                raise TuningError(f"--from-target-layers: expected distinct layer indices; got {layers!r}")
            object.__setattr__(self, "from_target_layers", layers)


@dataclass(frozen=True)
class BenchSettings:
    """``accel bench acceptance`` as data: field names are the flags' (``--k-max`` ->
    ``k_max``), defaults the command's. Raises :class:`TuningError` naming the flag
    of a value out of range."""

    #: the draft YAML (``ACCEL_DRAFT_CONFIG`` format)
    config: str | Path
    #: the target model directory
    target: str | Path
    #: one prompt per line, or JSONL with ``prompt`` (and ``domain``)
    prompts: str | Path
    #: target tokens per prompt
    gen_tokens: int = 64
    #: wrap each prompt as a user message in the target tokenizer's chat template
    chat: bool = False
    #: at most this many prompts per domain (``None``: all)
    max_prompts: int | None = None
    #: largest k tried (``None``: the YAML's num_speculative_tokens per domain)
    k_max: int | None = None
    #: the target's step time measured elsewhere (``None``: measured here)
    target_step_ms: float | None = None
    #: torch CPU threads (``None``: torch's)
    threads: int | None = None
    #: a .png to draw speedup vs k per domain into
    plot: str | Path | None = None

    RANGES: ClassVar[dict[str, Range]] = {
        "gen_tokens": Range(int, 1, 1024),
        "max_prompts": Range(int, 1, optional=True),
        "k_max": Range(int, 1, 16, optional=True),
        "target_step_ms": Range(float, 0.0, low_open=True, optional=True),
        "threads": Range(int, 1, optional=True),
    }

    def __post_init__(self) -> None:
        check_settings(self, self.RANGES, error=TuningError)
