"""Jitted building blocks shared by the attention kernels.

Scores are kept in log2 units: the softmax scale is pre-multiplied by log2(e) so
the inner loop uses ``exp2``, which maps to one hardware instruction (FA2 trick).
The running state per query row is (m, l, acc): the row maximum, the sum of
``exp2(s - m)`` and the unnormalised output, rescaled whenever m grows.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def score_constants(softmax_scale: float, softcap: float) -> tuple[float, float]:
    """(score_scale, softcap_log2e) as the kernels expect them.

    Without softcap, ``s = qk * score_scale`` with log2(e) folded in. With softcap,
    ``s = softcap_log2e * tanh(qk * score_scale)``, i.e. ``softcap * tanh(qk * scale / softcap)``
    in log2 units, as flash-attn and Gemma define it.
    """
    if softcap > 0:
        return softmax_scale / softcap, softcap * LOG2E
    return softmax_scale * LOG2E, 0.0


@triton.jit
def _tanh(x):
    # exp2 form instead of libdevice tanh: available on every triton version and in
    # the interpreter, and it saturates to +-1 instead of overflowing to nan.
    return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)  # 2 * log2(e)


@triton.jit
def attend_tile(acc, m_i, l_i, q, k_t, v, q_pos, k_idx, k_len, window_left, window_right, score_scale,
                softcap_log2e, MASKED: tl.constexpr, LOCAL_LEFT: tl.constexpr, LOCAL_RIGHT: tl.constexpr,
                USE_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One online-softmax step: rows q [M, D] against keys k_t [D, N] and values v [N, D].

    ``q_pos`` [M] and ``k_idx`` [N] are positions in the sequence's key axis (a query at
    position p sees keys j <= p under a causal mask). When MASKED, keys at or beyond
    ``k_len`` and outside the window get probability 0.
    """
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION)
    if USE_SOFTCAP:
        s = softcap_log2e * _tanh(s * score_scale)
    else:
        s = s * score_scale
    if MASKED:
        ok = (k_idx < k_len)[None, :]
        if LOCAL_LEFT:
            ok = ok & (k_idx[None, :] >= q_pos[:, None] - window_left)
        if LOCAL_RIGHT:
            ok = ok & (k_idx[None, :] <= q_pos[:, None] + window_right)
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # A row whose keys are all masked so far keeps m = -inf; subtracting -inf would give nan.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def finalize(acc, m_i, l_i):
    """(out, lse2): normalised output and log2-sum-exp per row; rows with no key give 0 and -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    return out, lse2


@triton.jit
def key_segments(lo, hi, full_lo, full_hi, BLOCK_N: tl.constexpr):
    """Split keys [lo, hi) into masked [lo, b), unmasked [b, c) and masked [c, hi).

    ``lo`` is a multiple of BLOCK_N; [full_lo, full_hi) are the keys that every row
    of the tile may see. b and c are multiples of BLOCK_N (or equal to hi), so the
    unmasked loop never reads past full_hi.
    """
    b = tl.minimum(tl.maximum(lo, tl.cdiv(full_lo, BLOCK_N) * BLOCK_N), hi)
    c = tl.maximum(b, tl.minimum((full_hi // BLOCK_N) * BLOCK_N, hi))
    return b, c
