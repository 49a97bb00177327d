"""The accuracy rule the kernels are held to (flash-attn's), used by the tests and by
``accel doctor --self-test``.

A kernel's largest error against a float64 reference may be at most twice torch's
own error computing the same thing in the inputs' dtype (:class:`TorchLowp`), plus
a floor derived from the case (:func:`floor`): the floor covers what torch's own
error may miss, and grows with the scores because ``exp(s - m)`` in fp32 has a
relative error of about ``eps * |s|``.
"""

from __future__ import annotations

import math

import torch

from . import reference

__all__ = ["EPS", "FLOOR_ULPS", "FP32_EPS", "TorchLowp", "floor", "lse_limit", "max_err", "max_score",
           "verdict"]

#: Machine epsilon by dtype (the gap between 1 and the next number).
EPS = {dtype: torch.finfo(dtype).eps for dtype in (torch.float16, torch.bfloat16, torch.float32)}
FP32_EPS = EPS[torch.float32]
#: The floor's constants, in units of eps (one tolerance table for every dtype):
#: OUT: the output is rounded once to its dtype (and p once before p @ v in fp16/bf16);
#: SCORE: the kernels compute scores and softmax in fp32 whatever the dtype: each
#: ``exp2(s - m)`` carries a relative error of a few eps * |s| (s, m and s - m rounded,
#: the dot product's own rounding), so it scales with the largest score;
#: LSE: the log-sum-exp, in fp32 from the same scores, of magnitude about max |s| + log(keys);
#: the running sum over key tiles adds a rounding per tile.
#: Measured in the interpreter: at most 1.5 eps * |s| * |out| (out), 1.3 eps * |lse| (lse).
FLOOR_ULPS = {"out": 1.0, "score": 8.0, "lse": 16.0}


class TorchLowp:
    """Torch's own computation in the inputs' dtype (scores, softmax and p @ v all in it):
    the yardstick of the accuracy rule. Call it on one sequence, or use :meth:`varlen` /
    :meth:`paged` for a packed batch (same arguments as the kernels)."""

    def __call__(self, q, k, v, softmax_scale, causal, window_size, softcap):
        """One sequence: q [q_len, H, D], k/v [k_len, Hkv, D] -> [q_len, H, D]."""
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        allowed = reference.attention_mask(q.shape[0], k.shape[0], causal, window_size, device=q.device)
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        return torch.einsum("hqk,khd->qhd", p, v)

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
               window_size=(-1, -1), softcap=0.0):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.zeros_like(q)
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(len(cu_q) - 1):
            rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            out[rows] = self(q[rows], k[keys], v[keys], scale, causal, window_size, softcap)
        return out

    def paged(self, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, softmax_scale=None, causal=True,
              window_size=(-1, -1), softcap=0.0):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.zeros_like(q)
        cu_q = cu_seqlens_q.tolist()
        for b, seq_len in enumerate(seq_lens.tolist()):
            rows = slice(cu_q[b], cu_q[b + 1])
            k = reference.gather_kv(k_cache, block_table[b], seq_len)
            v = reference.gather_kv(v_cache, block_table[b], seq_len)
            out[rows] = self(q[rows], k, v, scale, causal, window_size, softcap)
        return out


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b|, in float64 (nan if either holds a nan); 0.0 for empty tensors."""
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def max_score(q: torch.Tensor, k: torch.Tensor, softmax_scale: float | None = None, softcap: float = 0.0) -> float:
    """Largest |q_i . k_j| * scale (after softcap) over every query row and key of the same
    head group: an upper bound on the case's scores, masks ignored.

    q: [total_q, num_heads, head_dim]; k: [total_k, num_kv_heads, head_dim] or a paged
    cache [num_blocks, block_size, num_kv_heads, head_dim].
    """
    num_kv_heads, head_dim = k.shape[-2], k.shape[-1]
    k = k.reshape(-1, num_kv_heads, head_dim).float()
    if q.shape[0] == 0 or k.shape[0] == 0:
        return 0.0
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    group = q.shape[1] // num_kv_heads
    rows_per_chunk = max(1, (1 << 26) // (q.shape[1] * k.shape[0]))  # at most 64M scores at a time
    largest = 0.0
    for start in range(0, q.shape[0], rows_per_chunk):
        rows = q[start:start + rows_per_chunk].float().view(-1, num_kv_heads, group, head_dim)
        s = torch.einsum("tgjd,sgd->gjts", rows, k)
        largest = max(largest, s.abs().max().item() * scale)
    return softcap * math.tanh(largest / softcap) if softcap > 0 else largest


def floor(dtype: torch.dtype, max_score: float, out_scale: float) -> float:
    """The error allowed besides torch's own, for outputs of magnitude ``out_scale``
    (the reference's largest |value|): one eps of the dtype for rounding the output,
    and FLOOR_ULPS["score"] fp32 eps per unit of the largest score for the softmax."""
    return out_scale * (FLOOR_ULPS["out"] * EPS[dtype] + FLOOR_ULPS["score"] * FP32_EPS * max(1.0, max_score))


def verdict(out: torch.Tensor, ref: torch.Tensor, lowp: torch.Tensor, dtype: torch.dtype,
            max_score: float) -> tuple[float, float, float]:
    """(err, limit, torch_err): the kernel's max error against ``ref`` (float64), what the
    rule allows, and torch's own error (``lowp``, from :class:`TorchLowp`). Passes when
    ``err <= limit`` (a nan error never does)."""
    err, torch_err = max_err(out, ref), max_err(lowp, ref)
    out_scale = ref.abs().max().item() if ref.numel() else 0.0
    return err, 2.0 * torch_err + floor(dtype, max_score, out_scale), torch_err


def lse_limit(ref_lse: torch.Tensor, max_score: float) -> float:
    """The error allowed in a log-sum-exp, which is fp32 whatever the dtype: FLOOR_ULPS["lse"]
    fp32 eps per unit of its magnitude (at least the largest score). ``ref_lse``: the
    reference's finite entries."""
    magnitude = max(1.0, max_score, ref_lse.abs().max().item() if ref_lse.numel() else 0.0)
    return FLOOR_ULPS["lse"] * FP32_EPS * magnitude
