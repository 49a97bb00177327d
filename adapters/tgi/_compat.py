"""Every TGI detail that changes between versions, in one place.

Checked against TGI v3.3.7 (commit dfb3fbe7; its server wheel calls itself
``text-generation-server 2.0.5.dev0``, upstream's stale version string). When TGI
moves one of these, this file is the only one to change:

* ``models/globals.py`` reads ``ATTENTION`` (``paged``, ``flashdecoding``,
  ``flashdecoding-ipex``, ``flashinfer``) and sets ``BLOCK_SIZE`` (16, 256, 64, 1);
* the attention package ``layers/attention/__init__.py`` re-exports ``attention``
  (prefill) and ``paged_attention`` (decode) from ``cuda.py``, ``rocm.py`` or
  ``ipex.py`` (signatures: :data:`SIGNATURES`);
* ``KVCache.key`` / ``.value`` are ``[num_blocks, num_kv_heads, BLOCK_SIZE, head_size]``
  on CPU with IPEX (``paged`` and ``flashdecoding-ipex``), ``[num_blocks,
  BLOCK_SIZE, num_kv_heads, head_size]`` for ``flashdecoding``/``flashinfer`` and on
  XPU, and a 5-D vLLM-style layout otherwise (:func:`cache_layout`);
* ``Seqlen`` carries ``input_lengths`` (this step's tokens), ``cache_lengths``
  (tokens already in the cache) and ``cu_seqlen_q``; ``max_k`` is not used here:
  ``FlashCausalLM.forward`` leaves it short of the speculative tokens (a TGI bug);
* TGI logs with loguru; ``SYSTEM`` (``utils/import_utils.py``) names the platform.

TGI itself is imported by the functions that read it (``accel doctor`` reads the
constants here without importing TGI).
"""

from __future__ import annotations

import inspect
from importlib import metadata

import torch

from accel_plugin.attention import UnsupportedAttentionConfig

__all__ = [
    "FALLBACK_HINT",
    "REMEDY",
    "SUPPORTED_VERSIONS",
    "TESTED_VERSIONS",
    "check_version",
    "LOGGER_NAME",
    "SIGNATURES",
    "SUPPORTED_ATTENTION",
    "TGI_VERSION",
    "attention_mode",
    "block_size",
    "cache_views",
    "check_attention_mode",
    "check_signatures",
    "device",
    "is_standard_head_mapping",
    "logger",
    "seq_lens",
    "system",
]

#: The version of TGI's server distribution as installed (v3.3.7 reports 2.0.5.dev0).
try:
    TGI_VERSION = metadata.version("text-generation-server")
except metadata.PackageNotFoundError:  # a source checkout on sys.path
    TGI_VERSION = "unknown"

#: The server versions this adapter supports (PEP 440) and the ones the matrix ran
#: (docs/compatibility.md). TGI v3.3.7's wheel says 2.0.5.dev0, a string upstream left
#: unchanged across releases, so the version alone cannot tell releases apart:
#: :func:`check_signatures` is the second guard (a TGI whose attention functions take
#: other parameters is refused too).
SUPPORTED_VERSIONS = "==2.0.5.dev0"
TESTED_VERSIONS = ("2.0.5.dev0 (TGI v3.3.7)",)
REMEDY = ("install TGI v3.3.7's server (text-generation-server 2.0.5.dev0), or unset "
          "ACCEL_ATTENTION_BACKEND and ACCEL_DRAFT_CONFIG to run this TGI without accel-plugin")


def check_version(version: str | None = None) -> None:
    """Refuse a TGI server outside :data:`SUPPORTED_VERSIONS`
    (:class:`~accel_plugin.versions.UnsupportedFrameworkVersion`, naming the range)."""
    from accel_plugin.versions import check_framework_version

    check_framework_version("TGI's server (text-generation-server)", TGI_VERSION if version is None else version,
                            SUPPORTED_VERSIONS, tested=TESTED_VERSIONS, remedy=REMEDY)


#: ATTENTION values whose KV cache our kernels read as it is.
SUPPORTED_ATTENTION: tuple[str, ...] = ("paged", "flashdecoding-ipex")

FALLBACK_HINT = "unset ACCEL_ATTENTION_BACKEND to use TGI's own attention"

#: Parameter names of TGI's functions, by kind, that ours mirror (v3.3.7).
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # name: (positional parameters, keyword-only parameters)
    "attention": ((), ("query", "key", "value", "kv_cache", "kv_scales", "seqlen", "block_tables",
                       "softmax_scale", "window_size_left", "causal", "softcap")),
    "paged_attention": (("query", "kv_cache", "kv_head_mapping", "softmax_scale", "block_tables",
                         "seqlen", "max_s"), ("kv_scales", "softcap", "window_size_left")),
}

_NHBD = "[num_blocks, num_kv_heads, block_size, head_size]"
_NBHD = "[num_blocks, block_size, num_kv_heads, head_size]"


#: The logger name our records carry. ``text-generation-server serve`` keeps only records
#: whose name starts with ``text_generation_server.`` (``logger.add(..., filter=...)``).
LOGGER_NAME = "text_generation_server.accel_plugin"


def _as_tgi_record(record) -> None:
    record["name"] = LOGGER_NAME


def logger():
    """TGI's logger (loguru), our records named so that TGI's sink shows them."""
    from loguru import logger as tgi_logger

    return tgi_logger.patch(_as_tgi_record)


def system() -> str:
    """TGI's ``SYSTEM``: cuda, rocm, ipex (CPU or XPU)."""
    from text_generation_server.utils.import_utils import SYSTEM

    return SYSTEM


def attention_mode() -> str:
    from text_generation_server.models import globals as tgi_globals

    return tgi_globals.ATTENTION


def block_size() -> int:
    from text_generation_server.models import globals as tgi_globals

    return int(tgi_globals.BLOCK_SIZE)


def check_attention_mode() -> str:
    """TGI's ATTENTION, if our kernels can serve it; else :class:`UnsupportedAttentionConfig`."""
    mode = attention_mode()
    if mode not in SUPPORTED_ATTENTION:
        raise UnsupportedAttentionConfig(
            f"accel-plugin's TGI adapter does not support ATTENTION={mode} (supported: "
            f"{', '.join(SUPPORTED_ATTENTION)}; TGI's KV-cache layout and kernels differ per value); "
            f"set ATTENTION to one of those, or {FALLBACK_HINT}"
        )
    return mode


def _parameter_names(func) -> tuple[tuple[str, ...], tuple[str, ...]]:
    params = inspect.signature(func).parameters.values()
    positional = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    keyword = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    return positional, keyword


def check_signatures(package) -> None:
    """TGI's functions take the parameters ours implement (else this TGI is too new)."""
    for name, expected in SIGNATURES.items():
        got = _parameter_names(getattr(package, name))
        if got != expected:
            raise RuntimeError(
                f"TGI's {package.__name__}.{name} takes {got}, accel-plugin's TGI adapter "
                f"implements {expected} (TGI v3.3.7); this TGI version ({TGI_VERSION}) is not "
                f"supported yet; {FALLBACK_HINT}"
            )


def device() -> tuple[str, tuple[int, int] | None]:
    """(device type, CUDA capability) of the process, as TGI chose it (``SYSTEM``)."""
    tgi_system = system()
    if tgi_system == "cuda" and torch.cuda.is_available():
        return "cuda", tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]
    if tgi_system == "ipex" and hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu", None
    if tgi_system == "rocm":
        return "rocm", None
    return "cpu", None


def cache_layout(device_type: str) -> str | None:
    """The layout of ``KVCache.key``/``.value`` (TGI's ``KVCache.__init__``), or None (5-D)."""
    mode = attention_mode()
    if mode in ("flashdecoding", "flashinfer") or (mode == "flashdecoding-ipex" and device_type == "xpu"):
        return _NBHD
    if system() == "ipex" and device_type == "cpu":
        return _NHBD
    return None


def cache_views(kv_cache) -> tuple[torch.Tensor, torch.Tensor]:
    """``KVCache`` -> (k_cache, v_cache), each ``[num_blocks, block_size, num_kv_heads,
    head_size]`` as strided views of TGI's tensors (no copy)."""
    key, value = kv_cache.key, kv_cache.value
    layout = cache_layout(key.device.type)
    if layout is None or key.dim() != 4:
        raise UnsupportedAttentionConfig(
            f"TGI's KV cache has shape {tuple(key.shape)} on {key.device.type} with "
            f"ATTENTION={attention_mode()} (SYSTEM={system()}); accel-plugin reads {_NHBD} "
            f"(IPEX on CPU) or {_NBHD} only; {FALLBACK_HINT}"
        )
    if layout == _NHBD:
        return key.permute(0, 2, 1, 3), value.permute(0, 2, 1, 3)
    return key, value


def seq_lens(seqlen) -> torch.Tensor:
    """Whole context per sequence, this step's tokens included (int32 ``[B]``).

    Not ``Seqlen.max_k``: that one misses the speculative tokens."""
    return (seqlen.input_lengths + seqlen.cache_lengths).to(torch.int32)


def is_standard_head_mapping(kv_head_mapping: torch.Tensor, num_heads: int, num_kv_heads: int) -> bool:
    """Query head h reads KV head h // (num_heads // num_kv_heads), as our kernels do."""
    if kv_head_mapping.dim() != 1 or kv_head_mapping.numel() != num_heads:
        return False
    standard = torch.arange(num_kv_heads, device=kv_head_mapping.device).repeat_interleave(
        num_heads // num_kv_heads
    )
    return bool(torch.equal(kv_head_mapping.to(standard.dtype), standard))
