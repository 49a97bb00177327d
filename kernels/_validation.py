"""Input checks shared by the kernels and the reference.

Every failure raises ``ValueError`` naming the constraint, the value received and,
where there is one, the fix. Shapes, dtypes, devices and strides are always
checked. The *contents* of index tensors (cu_seqlens, seq_lens, block_table,
slot_mapping) are checked only when ``check_contents`` is true: the callers pass
true for CPU tensors and the interpreter (free there, and the interpreter has no
bounds checks) and false for compiled CUDA launches (checking would force a
host synchronisation on every call).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace

import torch

from . import limits

SUPPORTED_HEAD_SIZES: tuple[int, ...] = limits.HEAD_SIZES
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = tuple(getattr(torch, name) for name in limits.DTYPE_NAMES)
MIN_BLOCK_SIZE = limits.MIN_BLOCK_SIZE
MAX_BLOCK_SIZE = limits.MAX_BLOCK_SIZE

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
                torch.float64: "float64"}


#: CUDA grids allow at most this many programs along their second and third axes.
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class AttentionParams:
    """Scalar options after validation; window bounds are -1 when unbounded."""

    softmax_scale: float
    window_left: int
    window_right: int
    softcap: float
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0  # max_seq_len for paged attention


def _names(dtypes) -> str:
    return ", ".join(_DTYPE_NAMES.get(d, str(d)) for d in dtypes)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_tensor(name: str, t, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {layout}; got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be a {ndim}-D tensor {layout}; got shape {_shape(t)}")


def _check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1); got strides "
                         f"{t.stride()}; pass {name}.contiguous()")


def _check_device(anchor: str, device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"all tensors must be on one device; {anchor} is on {device}, {name} on {t.device}")


def _check_index_vector(name: str, t, length: int | None, dtypes: tuple[torch.dtype, ...], layout: str) -> None:
    _check_tensor(name, t, 1, layout)
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}; got {t.dtype}")
    if t.numel() > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous; got stride {t.stride(0)}; pass {name}.contiguous()")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have length {length} {layout}; got {t.shape[0]}")


def _as_int(name: str, value, minimum: int) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int; got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


def check_qkv_dtype(q: torch.Tensor, allowed: tuple[torch.dtype, ...], **others: torch.Tensor) -> None:
    if q.dtype not in allowed:
        raise ValueError(f"q.dtype must be one of {_names(allowed)}; got {q.dtype}")
    for name, t in others.items():
        if t.dtype != q.dtype:
            raise ValueError(f"{name}.dtype must equal q.dtype ({q.dtype}); got {t.dtype}")


def check_heads(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_SIZES:
        raise ValueError(f"head_dim must be one of {', '.join(map(str, SUPPORTED_HEAD_SIZES))}; got {head_dim}")
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads must be a multiple of num_kv_heads (MHA, GQA or MQA); got "
                         f"num_heads={num_heads}, num_kv_heads={num_kv_heads}")


def check_flag(name: str, value) -> bool:
    """Boolean switches must be bools: ``causal="no"`` would otherwise mean True."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_options(head_dim: int, softmax_scale, window_size, softcap) -> AttentionParams:
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a positive finite float or None; got {softmax_scale!r}")
    try:
        left, right = (operator.index(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair of ints (left, right), -1 = unbounded; "
                         f"got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1 = unbounded); got {(left, right)}")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off); got {softcap!r}")
    return AttentionParams(float(softmax_scale), left, right, float(softcap))


def _with_lengths(params: AttentionParams, max_seqlen_q: int, max_seqlen_k: int) -> AttentionParams:
    return replace(params, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)


def check_out(out, q: torch.Tensor) -> None:
    if out is None:
        return
    _check_tensor("out", out, 3, "[total_q, num_heads, head_dim]")
    if out.shape != q.shape:
        raise ValueError(f"out must have the shape of q {_shape(q)}; got {_shape(out)}")
    if out.dtype != q.dtype:
        raise ValueError(f"out.dtype must equal q.dtype ({q.dtype}); got {out.dtype}")
    _check_device("q", q.device, out=out)
    _check_last_dim_contiguous("out", out)


def _check_cu_seqlens(name: str, cu: torch.Tensor, rows: int, rows_name: str, max_len: int,
                      max_name: str) -> None:
    cu = cu.cpu().long()
    if cu[0].item() != 0:
        raise ValueError(f"{name}[0] must be 0; got {cu[0].item()}")
    lens = cu[1:] - cu[:-1]
    if lens.numel() and lens.min().item() < 0:
        i = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"{name} must be non-decreasing; {name}[{i + 1}] < {name}[{i}]")
    if cu[-1].item() > rows:
        raise ValueError(f"{name}[-1] ({cu[-1].item()}) must be <= {rows_name} ({rows})")
    if lens.numel() and lens.max().item() > max_len:
        raise ValueError(f"{max_name} ({max_len}) must be >= the longest sequence in {name} "
                         f"({lens.max().item()})")


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                    window_size, softcap, out, allowed_dtypes, check_contents) -> AttentionParams:
    _check_tensor("q", q, 3, "[total_q, num_heads, head_dim]")
    _check_tensor("k", k, 3, "[total_k, num_kv_heads, head_dim]")
    _check_tensor("v", v, 3, "[total_k, num_kv_heads, head_dim]")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {_shape(k)} and v {_shape(v)}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k's head_dim must equal q's ({q.shape[2]}); got {k.shape[2]}")
    check_qkv_dtype(q, allowed_dtypes, k=k, v=v)
    check_heads(q.shape[1], k.shape[1], q.shape[2])
    _check_device("q", q.device, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_last_dim_contiguous(name, t)
    _check_index_vector("cu_seqlens_q", cu_seqlens_q, None, (torch.int32,), "[batch + 1]")
    if not 2 <= cu_seqlens_q.shape[0] <= MAX_GRID_YZ + 1:
        raise ValueError(f"cu_seqlens_q must have length batch + 1 with 1 <= batch <= {MAX_GRID_YZ}; "
                         f"got length {cu_seqlens_q.shape[0]}")
    _check_index_vector("cu_seqlens_k", cu_seqlens_k, cu_seqlens_q.shape[0], (torch.int32,),
                        "[batch + 1], like cu_seqlens_q")
    max_seqlen_q = _as_int("max_seqlen_q", max_seqlen_q, 0)
    max_seqlen_k = _as_int("max_seqlen_k", max_seqlen_k, 0)
    check_out(out, q)
    params = check_options(q.shape[2], softmax_scale, window_size, softcap)
    if check_contents:
        _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q.shape[0]", max_seqlen_q, "max_seqlen_q")
        _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k.shape[0]", max_seqlen_k, "max_seqlen_k")
    return _with_lengths(params, max_seqlen_q, max_seqlen_k)


def check_cache(k_cache, v_cache, num_kv_heads: int | None, head_dim: int | None) -> None:
    layout = "[num_blocks, block_size, num_kv_heads, head_dim]"
    _check_tensor("k_cache", k_cache, 4, layout)
    _check_tensor("v_cache", v_cache, 4, layout)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {_shape(k_cache)} "
                         f"and {_shape(v_cache)}")
    block_size = k_cache.shape[1]
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size (k_cache.shape[1]) must be in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]; "
                         f"got {block_size}")
    if num_kv_heads is not None and k_cache.shape[2] != num_kv_heads:
        raise ValueError(f"k_cache.shape[2] (num_kv_heads) must be {num_kv_heads}; got {k_cache.shape[2]}")
    if head_dim is not None and k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache.shape[3] (head_dim) must be {head_dim}; got {k_cache.shape[3]}")
    _check_last_dim_contiguous("k_cache", k_cache)
    _check_last_dim_contiguous("v_cache", v_cache)


def validate_paged(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len,
                   softmax_scale, window_size, softcap, num_splits, out, allowed_dtypes,
                   check_contents) -> AttentionParams:
    _check_tensor("q", q, 3, "[total_q, num_heads, head_dim]")
    check_cache(k_cache, v_cache, None, q.shape[2])
    check_qkv_dtype(q, allowed_dtypes, k_cache=k_cache, v_cache=v_cache)
    check_heads(q.shape[1], k_cache.shape[2], q.shape[2])
    _check_device("q", q.device, k_cache=k_cache, v_cache=v_cache, cu_seqlens_q=cu_seqlens_q,
                  seq_lens=seq_lens, block_table=block_table)
    _check_last_dim_contiguous("q", q)
    _check_index_vector("seq_lens", seq_lens, None, (torch.int32,), "[batch]")
    batch = seq_lens.shape[0]
    _check_index_vector("cu_seqlens_q", cu_seqlens_q, batch + 1, (torch.int32,), "[batch + 1]")
    _check_tensor("block_table", block_table, 2, "[batch, max_blocks_per_seq]")
    if block_table.dtype != torch.int32:
        raise ValueError(f"block_table must have dtype torch.int32; got {block_table.dtype}")
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table.shape[0] must equal len(seq_lens) ({batch}); got {block_table.shape[0]}")
    _check_last_dim_contiguous("block_table", block_table)
    max_seqlen_q = _as_int("max_seqlen_q", max_seqlen_q, 0)
    max_seq_len = _as_int("max_seq_len", max_seq_len, 0)
    num_splits = _as_int("num_splits", num_splits, 0)
    if num_splits > MAX_GRID_YZ:
        raise ValueError(f"num_splits must be <= {MAX_GRID_YZ} (0 = automatic); got {num_splits}")
    check_out(out, q)
    params = check_options(q.shape[2], softmax_scale, window_size, softcap)
    if check_contents:
        _check_paged_contents(q, k_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len)
    return _with_lengths(params, max_seqlen_q, max_seq_len)


def _check_paged_contents(q, k_cache, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seq_len):
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q.shape[0]", max_seqlen_q, "max_seqlen_q")
    cu = cu_seqlens_q.cpu().long()
    q_lens = cu[1:] - cu[:-1]
    lens = seq_lens.cpu().long()
    if lens.numel() == 0:
        return
    short = torch.nonzero(lens < q_lens)
    if short.numel():
        i = int(short[0])
        raise ValueError(f"seq_lens[{i}] ({int(lens[i])}) must be >= that sequence's query length "
                         f"({int(q_lens[i])}): seq_lens counts the whole context including the queries")
    if lens.max().item() > max_seq_len:
        raise ValueError(f"max_seq_len ({max_seq_len}) must be >= max(seq_lens) ({lens.max().item()})")
    block_size, num_blocks = k_cache.shape[1], k_cache.shape[0]
    capacity = block_table.shape[1] * block_size
    if lens.max().item() > capacity:
        raise ValueError(f"max(seq_lens) ({lens.max().item()}) exceeds block_table capacity "
                         f"(max_blocks_per_seq {block_table.shape[1]} x block_size {block_size} = {capacity})")
    used = torch.arange(block_table.shape[1])[None, :] < ((lens + block_size - 1) // block_size)[:, None]
    entries = block_table.cpu()[used]
    if entries.numel() and (entries.min().item() < 0 or entries.max().item() >= num_blocks):
        raise ValueError(f"block_table entries in use must be in [0, num_blocks={num_blocks}); got "
                         f"range [{entries.min().item()}, {entries.max().item()}]")


def validate_write_kv(k, v, k_cache, v_cache, slot_mapping, allowed_dtypes, check_contents) -> None:
    _check_tensor("k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    _check_tensor("v", v, 3, "[num_tokens, num_kv_heads, head_dim]")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {_shape(k)} and v {_shape(v)}")
    check_cache(k_cache, v_cache, k.shape[1], k.shape[2])
    if k.shape[2] not in SUPPORTED_HEAD_SIZES:
        raise ValueError(f"head_dim must be one of {', '.join(map(str, SUPPORTED_HEAD_SIZES))}; got {k.shape[2]}")
    if k_cache.dtype not in allowed_dtypes:
        raise ValueError(f"k_cache.dtype must be one of {_names(allowed_dtypes)}; got {k_cache.dtype}")
    for name, t in (("k", k), ("v", v), ("v_cache", v_cache)):
        if t.dtype != k_cache.dtype:
            raise ValueError(f"{name}.dtype must equal k_cache.dtype ({k_cache.dtype}); got {t.dtype}")
    _check_device("k", k.device, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    _check_last_dim_contiguous("k", k)
    _check_last_dim_contiguous("v", v)
    _check_index_vector("slot_mapping", slot_mapping, k.shape[0], (torch.int64, torch.int32), "[num_tokens]")
    if check_contents and slot_mapping.numel():
        slots = slot_mapping.cpu()
        capacity = k_cache.shape[0] * k_cache.shape[1]
        if slots.min().item() < -1 or slots.max().item() >= capacity:
            raise ValueError(f"slot_mapping entries must be -1 (skip) or in [0, num_blocks x block_size = "
                             f"{capacity}); got range [{slots.min().item()}, {slots.max().item()}]")
