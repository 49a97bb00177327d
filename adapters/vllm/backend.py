"""accel-plugin's attention backends as vLLM ``AttentionBackend`` classes.

``AccelFlashBackend`` (``ACCEL_FLASH``) and ``AccelPagedBackend`` (``ACCEL_PAGED``)
wrap the framework-neutral :mod:`accel_plugin.attention` classes named by the
accel registry. vLLM sees:

* KV cache: vLLM's per-layer ``[num_blocks, num_kv_heads, block_size,
  2 * head_size]`` view in the ``LBNHC`` layout, i.e. each block stored as
  ``[block_size, num_kv_heads, K|V]``; K and V are its two halves,
  ``[num_blocks, block_size, num_kv_heads, head_size]`` each.
* ``forward_includes_kv_cache_update = False``: vLLM calls
  :meth:`AccelAttentionImpl.do_kv_cache_update` (the ``write_kv_cache`` kernel)
  before :meth:`AccelAttentionImpl.forward`.
* Capabilities (dtypes, head sizes, block sizes, compute capability) come from
  the accel registry, so ``accel doctor`` and vLLM agree. Anything else is
  refused with a reason naming the feature and the way out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from accel_plugin.attention import AttentionBatch, UnsupportedAttentionConfig
from accel_plugin.plugins.builtin import ACCEL_FLASH, ACCEL_PAGED

from . import _compat
from ._compat import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    logger,
)

__all__ = [
    "AccelAttentionImpl",
    "AccelAttentionMetadata",
    "AccelFlashBackend",
    "AccelMetadataBuilder",
    "AccelPagedBackend",
    "BACKEND_CLASS_PATHS",
    "fallback_hint",
]

#: accel registry name -> the vLLM backend class path registered under that name.
BACKEND_CLASS_PATHS = {
    ACCEL_FLASH: f"{__name__}.AccelFlashBackend",
    ACCEL_PAGED: f"{__name__}.AccelPagedBackend",
}

def fallback_hint(name: str) -> str:
    return (
        f"to use vLLM's own attention backend instead, unset ACCEL_ATTENTION_BACKEND "
        f"and do not pass --attention-backend {name}"
    )


def _spec(name: str):
    """The accel registry's spec of ``name``, from this process's one plugin manager
    (built by :func:`accel_plugin.adapters.vllm.register`)."""
    from accel_plugin.plugins.manager import process_plugins

    return process_plugins().registries.backends.get(name)


@dataclass
class AccelAttentionMetadata:
    """What one step's layers need: the kernel split, computed once per step."""

    batch: AttentionBatch
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    slot_mapping: torch.Tensor


class AccelMetadataBuilder(AttentionMetadataBuilder[AccelAttentionMetadata]):
    """Splits each step's requests between the flash and the paged kernel, on the host from
    vLLM's ``*_cpu`` metadata. With full CUDA graphs on, the steps vLLM may capture (decode
    and uniform speculative verification) go to the paged kernel through persistent
    buffers filled in place (:mod:`accel_plugin.adapters.vllm.cudagraphs`)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = _compat.cudagraph_support()
    split_fresh_prompts: ClassVar[bool] = True

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        from .metrics import kv_recorder

        # live KV-cache metrics (docs/observability.md), from host-side lengths; None: off
        self._metrics = kv_recorder(kv_cache_spec, vllm_config)
        from .cudagraphs import graph_steps

        # persistent buffers of the steps CUDA graphs capture; None: vLLM captures no full graphs
        self.graph_steps = graph_steps(kv_cache_spec, vllm_config, device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AccelAttentionMetadata:
        common = common_attn_metadata
        if common.causal is not True:
            raise UnsupportedAttentionConfig(
                "accel-plugin attention backends compute causal decoder attention only; "
                "this batch asks for non-causal attention. " + fallback_hint("ACCEL_FLASH")
            )
        from accel_plugin.attention import plan_batch

        if self.graph_steps is not None and self.graph_steps.serves(common):
            batch = self.graph_steps.buffers.plan(
                query_start_loc=common.query_start_loc, seq_lens=common.seq_lens,
                block_table=common.block_table_tensor, num_actual_tokens=common.num_actual_tokens,
                max_query_len=common.max_query_len,
            )
        else:
            batch = plan_batch(
                query_start_loc=common.query_start_loc,
                seq_lens=common.seq_lens,
                block_table=common.block_table_tensor,
                num_actual_tokens=common.num_actual_tokens,
                max_seq_len=common.max_seq_len,
                query_start_loc_cpu=common.query_start_loc_cpu,
                seq_lens_cpu=_compat.seq_lens_cpu(common),
                split_fresh_prompts=self.split_fresh_prompts,
            )
        if self._metrics is not None:
            self._metrics.record(common)
        return AccelAttentionMetadata(
            batch=batch,
            num_actual_tokens=common.num_actual_tokens,
            max_query_len=common.max_query_len,
            max_seq_len=common.max_seq_len,
            slot_mapping=common.slot_mapping,
        )


class AccelPagedMetadataBuilder(AccelMetadataBuilder):
    split_fresh_prompts = False


_announced: set[str] = set()


class AccelAttentionImpl(AttentionImpl[AccelAttentionMetadata]):
    """One attention layer: refuses what it cannot compute, then calls the kernels."""

    backend_name: ClassVar[str] = ACCEL_FLASH

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **unsupported,
    ) -> None:
        name = self.backend_name
        num_kv_heads = num_kv_heads or num_heads
        refusals = []
        if attn_type != AttentionType.DECODER:
            refusals.append(f"attention type {attn_type!s} (encoder, encoder-only or cross attention)")
        if _compat.is_quantized_kv_cache(kv_cache_dtype):
            refusals.append(f"quantized KV cache (kv_cache_dtype={kv_cache_dtype}); use --kv-cache-dtype auto")
        elif kv_cache_dtype != "auto":
            # The kernels keep K/V in the model's dtype; a different cache dtype would
            # only fail later, at the first write.
            refusals.append(
                f"KV cache dtype {kv_cache_dtype} (the cache must use the model dtype); "
                "use --kv-cache-dtype auto"
            )
        if alibi_slopes is not None:
            refusals.append("ALiBi position biases")
        if sinks is not None:
            refusals.append("attention sinks")
        extra = {k: v for k, v in unsupported.items() if v is not None}
        if extra:
            refusals.append(f"layer options {sorted(extra)}")
        if refusals:
            raise UnsupportedAttentionConfig(
                f"{name} cannot run this model: not supported: {'; '.join(refusals)}. {fallback_hint(name)}"
            )
        try:
            self.accel = _spec(name).load()(
                num_heads=num_heads,
                head_size=head_size,
                num_kv_heads=num_kv_heads,
                scale=scale,
                sliding_window=sliding_window,
                softcap=logits_soft_cap,
            )
        except UnsupportedAttentionConfig as exc:
            raise UnsupportedAttentionConfig(f"{exc}. {fallback_hint(name)}") from None
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        if name not in _announced:
            _announced.add(name)
            from accel_plugin.kernels import runtime_mode_reason

            logger.info(
                "Using %s attention backend (accel-plugin) in process %d; kernels: %s",
                name, os.getpid(), runtime_mode_reason(),
            )

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        k_cache, v_cache = _compat.split_kv_cache(kv_cache, self.head_size)
        self.accel.write_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AccelAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(
                f"{self.backend_name} does not fuse output quantization; disable the attention "
                "quantization fusion pass or " + fallback_hint(self.backend_name)
            )
        if attn_metadata is None:  # profiling / warm-up run
            return output
        k_cache, v_cache = _compat.split_kv_cache(kv_cache, self.head_size)
        # A layer sharing another layer's KV cache gets no fresh key/value: read the cache.
        if self.kv_sharing_target_layer_name:
            key = value = None
        self.accel.forward(query, key, value, k_cache, v_cache, attn_metadata.batch, output)
        return output


class AccelPagedImpl(AccelAttentionImpl):
    backend_name = ACCEL_PAGED


class _AccelBackend(AttentionBackend):
    """What vLLM asks a backend class; the answers come from the accel registry."""

    backend_name: ClassVar[str]
    forward_includes_kv_cache_update: bool = False
    # "auto" = the model dtype, the only layout the kernels read. fp8 and other
    # quantized caches, or a cache dtype other than the model's, are refused.
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @classmethod
    def get_name(cls) -> str:
        return cls.backend_name

    @classmethod
    def capabilities(cls):
        return _spec(cls.backend_name).capabilities

    @classmethod
    def get_supported_kernel_block_sizes(cls, kv_cache_spec=None) -> list[int]:
        return list(cls.capabilities().block_sizes or ())

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(cls.capabilities().head_sizes or ())

    @classmethod
    def supports_dtype(cls, dtype: torch.dtype) -> bool:
        dtypes = cls.capabilities().dtypes
        return dtypes is None or str(dtype).removeprefix("torch.") in dtypes

    @classmethod
    def supported_kv_cache_layouts(cls):
        return _compat.KV_CACHE_LAYOUTS

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return "sliding_window" in cls.capabilities().features

    @classmethod
    def supports_kv_connector(cls) -> bool:
        return False  # KV connectors assume a backend's layout; none is tested with ours

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        return False  # mixed steps are split by the host's query lengths (plan_batch)

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        need = cls.capabilities().min_cuda_capability
        if capability is None or need is None:  # CPU: no device capability
            return True
        return (capability.major, capability.minor) >= tuple(need)

    @classmethod
    def validate_configuration(cls, **kwargs) -> list[str]:
        """vLLM's checks, with each reason spelled out for a user."""
        reasons = super().validate_configuration(**kwargs)
        return [_explain(cls, reason, kwargs) for reason in reasons]


def _explain(cls: type[_AccelBackend], reason: str, config: dict) -> str:
    caps = cls.capabilities()

    def listed(values) -> str:
        return ", ".join(map(str, values)) if values else "any"

    details = {
        "head_size": lambda: f"head size {config.get('head_size')} is not supported "
        f"(supported: {listed(caps.head_sizes)})",
        "dtype": lambda: f"dtype {config.get('dtype')} is not supported (supported: {listed(caps.dtypes)})",
        "kv_cache_dtype": lambda: f"kv_cache_dtype {config.get('kv_cache_dtype')} is not "
        "supported (quantized KV caches are not implemented; use --kv-cache-dtype auto)",
        "block_size": lambda: f"block size {config.get('block_size')} is not supported "
        f"(supported: multiples of {listed(caps.block_sizes)})",
        "mla": lambda: "MLA (multi-head latent attention) models are not supported",
        "compute_capability": lambda: "CUDA compute capability "
        f"{config.get('device_capability')} is below the required "
        f"{'.'.join(map(str, caps.min_cuda_capability or ()))}",
    }
    by_reason = {_compat.VALIDATION_REASONS[key]: explain for key, explain in details.items()}
    text = by_reason[reason]() if reason in by_reason else reason
    return f"{cls.backend_name}: {text}; {fallback_hint(cls.backend_name)}"


class AccelFlashBackend(_AccelBackend):
    """``ACCEL_FLASH``: flash kernel for fresh prompts, paged kernel for cached context."""

    backend_name = ACCEL_FLASH

    @staticmethod
    def get_impl_cls():
        return AccelAttentionImpl

    @staticmethod
    def get_builder_cls():
        return AccelMetadataBuilder


class AccelPagedBackend(_AccelBackend):
    """``ACCEL_PAGED``: the paged kernel for every token."""

    backend_name = ACCEL_PAGED

    @staticmethod
    def get_impl_cls():
        return AccelPagedImpl

    @staticmethod
    def get_builder_cls():
        return AccelPagedMetadataBuilder
