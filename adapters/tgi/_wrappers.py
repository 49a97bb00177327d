"""The functions patches 3 and 4 of the ledger (:mod:`._patches`) put into TGI.

Each takes TGI's original and returns its replacement. They know nothing of the
ledger: what a model does when it is built comes in as ``attach`` (the ledger passes
the adapter's lifecycle function), and a model's speculation is found on the model
(:data:`._names.MODEL_ATTR`). Standard library only at import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._names import MODEL_ATTR
from ._tgi import get_speculate

__all__ = ["with_full_max_k", "wrap_generate_token", "wrap_init"]


def wrap_init(original: Callable, attach: Callable[[Any], object]) -> Callable:
    """``FlashCausalLM.__init__``, then ``attach(model)`` (ACCEL_DRAFT_CONFIG; unset = nothing)."""

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        attach(self)

    return __init__


def wrap_generate_token(original: Callable) -> Callable:
    """``FlashCausalLM.generate_token`` with drafts for the next step (models with a speculation)."""

    @functools.wraps(original)
    def generate_token(self, batch):
        spec = self.__dict__.get(MODEL_ATTR)
        if spec is None or not spec.enabled or get_speculate() <= 0:
            return original(self, batch)
        return spec.step(original, self, batch)

    return generate_token


def with_full_max_k(paged_attention: Callable) -> Callable:
    """TGI's ``paged_attention`` with ``seqlen.max_k`` raised to ``max_s`` (see the ledger)."""

    @functools.wraps(paged_attention)
    def wrapper(query, kv_cache, kv_head_mapping, softmax_scale, block_tables, seqlen, max_s, **kwargs):
        # forward() raises max_s by the speculative width but builds Seqlen(max_k=max_current_length)
        if seqlen.max_k is not None and seqlen.max_k < max_s:
            seqlen.max_k = max_s
        return paged_attention(query, kv_cache, kv_head_mapping, softmax_scale, block_tables, seqlen, max_s,
                               **kwargs)

    wrapper.__module__, wrapper.__qualname__ = __name__, "with_full_max_k.<locals>.paged_attention"
    wrapper.__accel_max_k__ = True  # type: ignore[attr-defined]
    return wrapper
