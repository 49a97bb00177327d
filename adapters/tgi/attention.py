"""accel-plugin's replacements for TGI's ``attention`` (prefill) and ``paged_attention`` (decode).

Same signatures as TGI v3.3.7's (``_compat.SIGNATURES``). Both read TGI's KV cache
as it is (``_compat.cache_views``: a permuted view, no copy) after TGI has written
this step's keys and values (``KVCache.store``), and map TGI's ``Seqlen`` and
``block_tables`` onto :func:`accel_plugin.attention.plan_batch`:

* ``query_start_loc`` = ``seqlen.cu_seqlen_q`` (prefill: the prompt chunks; decode:
  ``arange(B + 1)``; speculative decode: one row per token, each its own sequence);
* ``seq_lens`` = ``input_lengths + cache_lengths`` (never ``Seqlen.max_k``);
* ``block_table`` = ``block_tables`` (int32 ``[B, max_blocks]``).

``ACCEL_FLASH`` sends prompts without cached context to the flash kernel with this
step's ``key``/``value``, and everything that reads the cache (chunked-prefill
continuations, prefix-cache hits, decode) to the paged kernel; ``ACCEL_PAGED`` uses
the paged kernel for all. One plan per step: every layer of a forward pass gets
the same ``Seqlen`` object, so the plan is computed by the first layer only.

What cannot be computed is refused on the first call, naming the feature and the
way back to TGI's attention: a KV-cache dtype other than the model's (fp8),
sliding windows (``window_size_left``), non-causal attention, a non-standard
``kv_head_mapping``, softcapping where the backend lacks it, and head sizes or
dtypes outside the backend's capabilities.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from accel_plugin.attention import (
    AttentionBatch,
    UnsupportedAttentionConfig,
    plan_batch,
)

from . import _compat

__all__ = ["Settings", "attention", "call_counts", "configure", "current", "paged_attention", "reset"]


@dataclass
class Settings:
    """What activation decided; read by every call."""

    backend: str  #: registry name (ACCEL_FLASH, ACCEL_PAGED, or a plugin's)
    setting: str  #: the ACCEL_ATTENTION_BACKEND value that chose it
    attention_mode: str  #: TGI's ATTENTION
    block_size: int  #: TGI's BLOCK_SIZE
    rebound_modules: Callable[[], list[str]] | None = None  #: module names holding ours (log line)
    impls: dict = field(default_factory=dict)
    checked_mappings: dict = field(default_factory=dict)  #: id -> weakref of tensors found standard
    announced: bool = False


_settings: Settings | None = None
_calls: Counter = Counter()
_last_plan: tuple | None = None  # (weakref to Seqlen, block_tables, split, num_tokens, AttentionBatch)


def configure(settings: Settings | None) -> None:
    """Install the activation's settings (``None`` = inactive); forgets cached plans."""
    global _settings, _last_plan
    _settings = settings
    _last_plan = None


def current() -> Settings | None:
    return _settings


def call_counts() -> dict[str, int]:
    """Calls in this process: of our two functions (``attention``, ``paged_attention``) and
    how many of them ran the flash kernel, the paged kernel, both (one step mixing fresh
    prompts with rows that read the cache)."""
    return dict(_calls)


def reset() -> None:
    """Zero the counters (tests)."""
    _calls.clear()


def _refuse(what: str) -> UnsupportedAttentionConfig:
    backend = _settings.backend if _settings else "accel-plugin"
    return UnsupportedAttentionConfig(f"{backend} (accel-plugin) cannot run this TGI model: {what}; "
                                      f"{_compat.FALLBACK_HINT}")


def _impl(settings: Settings, query: torch.Tensor, num_kv_heads: int, scale: float, softcap: float | None):
    key = (query.shape[1], query.shape[2], num_kv_heads, float(scale), softcap, query.dtype)
    impl = settings.impls.get(key)
    if impl is not None:
        return impl
    from accel_plugin.plugins.manager import process_plugins

    spec = process_plugins().registries.backends.get(settings.backend)
    reasons = spec.capabilities.check(
        dtype=str(query.dtype), head_size=int(query.shape[2]), features=("softcap",) if softcap else (),
    )
    if reasons:
        raise _refuse("; ".join(reasons))
    try:
        impl = spec.load()(num_heads=query.shape[1], head_size=query.shape[2], num_kv_heads=num_kv_heads,
                           scale=scale, softcap=softcap)
    except UnsupportedAttentionConfig as exc:
        raise _refuse(str(exc)) from None
    settings.impls[key] = impl
    return impl


def _plan(impl, seqlen, block_tables: torch.Tensor, num_tokens: int) -> AttentionBatch:
    global _last_plan
    split = impl.split_fresh_prompts
    last = _last_plan
    if (last is not None and last[0]() is seqlen and last[1] is block_tables and last[2] == split
            and last[3] == num_tokens):
        return last[4]
    batch = plan_batch(
        query_start_loc=seqlen.cu_seqlen_q.to(torch.int32),
        seq_lens=_compat.seq_lens(seqlen),
        block_table=block_tables.to(torch.int32),
        num_actual_tokens=num_tokens,
        split_fresh_prompts=split,
    )
    _last_plan = (weakref.ref(seqlen), block_tables, split, num_tokens, batch)
    return batch


def _announce(settings: Settings) -> None:
    settings.announced = True
    from accel_plugin.kernels import runtime_mode_reason

    modules = settings.rebound_modules() if settings.rebound_modules is not None else []
    _compat.logger().info(
        f"accel-plugin: TGI attention replaced by {settings.backend} "
        f"(ACCEL_ATTENTION_BACKEND={settings.setting}; ATTENTION={settings.attention_mode}, "
        f"block size {settings.block_size}): attention and paged_attention rebound in "
        f"{len(modules)} modules; process {os.getpid()}; Triton kernels: {runtime_mode_reason()}"
    )


def _compute(kind, query, key, value, kv_cache, seqlen, block_tables, softmax_scale, window_size_left,
             causal, softcap) -> torch.Tensor:
    settings = _settings
    if settings is None:
        raise RuntimeError("accel-plugin's TGI attention was called while the adapter is not active")
    if window_size_left is not None and window_size_left != -1:
        raise _refuse(f"sliding-window attention (window_size_left={window_size_left}) is not supported "
                      "under TGI")
    if not causal:
        raise _refuse("non-causal attention is not supported")
    k_cache, v_cache = _compat.cache_views(kv_cache)
    if k_cache.dtype != query.dtype:
        raise _refuse(f"the KV cache dtype ({str(k_cache.dtype).removeprefix('torch.')}) differs from "
                      f"the model's ({str(query.dtype).removeprefix('torch.')}): quantized (fp8) KV "
                      "caches are not supported; drop --kv-cache-dtype")
    impl = _impl(settings, query, k_cache.shape[2], softmax_scale, softcap)
    batch = _plan(impl, seqlen, block_tables, query.shape[0])
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    impl.forward(query, key, value, k_cache, v_cache, batch, out)
    _calls[kind] += 1
    flash = batch.fresh is not None and key is not None
    paged = batch.cached is not None or (batch.fresh is not None and key is None)
    _calls["flash_kernel"] += flash
    _calls["paged_kernel"] += paged
    _calls["both_kernels"] += flash and paged
    if not settings.announced:
        _announce(settings)
    return out


def attention(
    *,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache,
    kv_scales,
    seqlen,
    block_tables: torch.Tensor,
    softmax_scale: float,
    window_size_left: int = -1,
    causal: bool = True,
    softcap: float | None = None,
) -> torch.Tensor:
    """Prefill (TGI's ``attention``): ``query`` ``[T, H, D]``, ``key``/``value`` ``[T, Hkv, D]``
    (this step's, already stored in ``kv_cache``); returns ``[T, H, D]``."""
    return _compute("attention", query, key, value, kv_cache, seqlen, block_tables, softmax_scale,
                    window_size_left, causal, softcap)


def paged_attention(
    query: torch.Tensor,
    kv_cache,
    kv_head_mapping: torch.Tensor,
    softmax_scale: float,
    block_tables: torch.Tensor,
    seqlen,
    max_s: int,
    *,
    kv_scales,
    softcap: float | None = None,
    window_size_left: int | None = -1,
) -> torch.Tensor:
    """Decode (TGI's ``paged_attention``): ``query`` ``[B, H, D]`` (speculative decode: one
    row per token); ``max_s`` is not needed (lengths come from ``seqlen``)."""
    settings = _settings
    if settings is not None:
        _check_head_mapping(settings, kv_head_mapping, query.shape[1], kv_cache)
    return _compute("paged_attention", query, None, None, kv_cache, seqlen, block_tables, softmax_scale,
                    window_size_left, True, softcap)


def _check_head_mapping(settings: Settings, kv_head_mapping, num_heads: int, kv_cache) -> None:
    """Refuse a ``kv_head_mapping`` other than the standard GQA one (checked once per tensor)."""
    seen = settings.checked_mappings.get(id(kv_head_mapping))
    if seen is not None and seen() is kv_head_mapping:
        return
    k_cache, _ = _compat.cache_views(kv_cache)
    num_kv_heads = k_cache.shape[2]
    if num_kv_heads <= 0 or num_heads % num_kv_heads or not _compat.is_standard_head_mapping(
            kv_head_mapping, num_heads, num_kv_heads):
        raise _refuse(f"kv_head_mapping is not the standard grouping of {num_heads} query heads over "
                      f"{num_kv_heads} KV heads (query head h reads KV head h // {max(1, num_heads // max(1, num_kv_heads))})")
    settings.checked_mappings[id(kv_head_mapping)] = weakref.ref(kv_head_mapping)


attention.__accel_replacement__ = True  # type: ignore[attr-defined]
paged_attention.__accel_replacement__ = True  # type: ignore[attr-defined]
