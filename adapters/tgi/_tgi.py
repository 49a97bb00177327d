"""What the draft-model speculation reads and changes of TGI's models and batches (v3.3.7).

TGI is imported by the functions that read it; the attention details are in
:mod:`._compat`. Standard library only at import.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SpeculationConfigError", "check_model", "get_speculate", "make_room", "model_dir"]


class SpeculationConfigError(ValueError):
    """Draft-model speculation cannot run with this TGI configuration (names the setting)."""


def get_speculate() -> int:
    """TGI's ``--speculate`` (``utils/speculate.py``; 0 when not given)."""
    from text_generation_server.utils.speculate import (
        get_speculate as tgi_get_speculate,
    )

    return int(tgi_get_speculate() or 0)


def model_dir(model) -> str:
    """The target's local directory: TGI keeps the ``--model-id`` as given (a hub id or a path)."""
    model_id = str(model.model_id)
    if Path(model_id).is_dir():
        return model_id
    from huggingface_hub import snapshot_download

    return snapshot_download(model_id, local_files_only=True)


def make_room(batch) -> None:
    """Widen ``all_input_ids_tensor`` to ``prompt + max_new_tokens + --speculate`` per row.

    ``FlashCausalLMBatch.from_pb`` sizes it so, but ``concatenate`` sizes it by each
    batch's speculative width at that moment (0 without ids): after a join with our
    ``None`` (or a width below N), a later step that accepts drafts near a request's
    ``max_new_tokens`` would write past its end (``generate_token`` raises). TGI's
    n-gram always has width N, so TGI never meets this.
    """
    import torch

    need = max(p + s.max_new_tokens for p, s in zip(batch.prompt_lengths, batch.stopping_criterias)) + get_speculate()
    have = batch.all_input_ids_tensor.shape[1]
    if have < need:
        batch.all_input_ids_tensor = torch.nn.functional.pad(batch.all_input_ids_tensor, (0, need - have))


def check_model(model) -> None:
    """Refuse targets whose batches or heads this adapter does not drive."""
    batch_type = getattr(model, "batch_type", None)
    if getattr(batch_type, "__name__", None) != "FlashCausalLMBatch":
        raise SpeculationConfigError(
            f"accel-plugin's draft-model speculation drives text-only FlashCausalLM models; "
            f"{type(model).__name__} batches are {getattr(batch_type, '__name__', batch_type)}; "
            "unset ACCEL_DRAFT_CONFIG for this model")
    if getattr(getattr(model.model, "lm_head", None), "speculator", None) is not None:
        raise SpeculationConfigError(
            "the target has TGI speculator heads (Medusa or MLP speculator), which propose their own "
            "tokens; use a plain target with ACCEL_DRAFT_CONFIG, or unset ACCEL_DRAFT_CONFIG")
    if int(getattr(model, "world_size", 1)) != 1:
        raise SpeculationConfigError(
            f"accel-plugin's draft-model speculation runs in one shard only (every shard would have to "
            f"draft identically); got {model.world_size} shards: use --num-shard 1 or unset ACCEL_DRAFT_CONFIG")
