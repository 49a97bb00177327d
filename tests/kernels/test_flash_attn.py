"""flash_attn_varlen_func against the float64 reference (small shapes, interpreter or GPU)."""

import pytest
import torch

from accel_plugin.kernels import flash_attn_varlen_func, reference

# (causal, window_size, softcap)
MASKS = {
    "full": (False, (-1, -1), 0.0),
    "causal": (True, (-1, -1), 0.0),
    "causal-window": (True, (23, -1), 0.0),
    "window-softcap": (False, (9, 30), 5.0),
}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
Q_LENS = [1, 17, 97]  # not multiples of the block


def run_both(inputs, lowp, check, q_lens, k_lens, num_heads, num_kv_heads, head_dim, dtype, causal, window,
             softcap, pad_rows=0):
    """(out, lse, ref, ref_lse, base, max_score): the kernel, the float64 reference, torch in dtype."""
    q, k, v, cu_q, cu_k = inputs.varlen(q_lens, k_lens, num_heads, num_kv_heads, head_dim, dtype, pad_rows)
    args = (cu_q, cu_k, max(q_lens), max(k_lens))
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    out, lse = flash_attn_varlen_func(q, k, v, *args, return_lse=True, **opts)
    ref, ref_lse = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), *args, return_lse=True,
                                                    **opts)
    base = lowp.varlen(q, k, v, cu_q, cu_k, **opts)
    return out, lse, ref, ref_lse, base, check.max_score(q, k, softcap=softcap)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference(inputs, check, lowp, dtype, mask):
    causal, window, softcap = MASKS[mask]
    out, lse, ref, ref_lse, base, max_score = run_both(inputs, lowp, check, Q_LENS, Q_LENS, 4, 2, 64, dtype,
                                                       causal, window, softcap)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (4, sum(Q_LENS))
    check.close(out, ref, base, dtype, max_score=max_score)
    check.lse_close(lse, ref_lse, max_score=max_score)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 1)], ids=["mha", "gqa2", "mqa8"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa(inputs, check, lowp, num_heads, num_kv_heads, causal):
    out, lse, ref, ref_lse, base, max_score = run_both(inputs, lowp, check, [17, 40], [17, 40], num_heads,
                                                       num_kv_heads, 32, torch.float32, causal, (-1, -1), 0.0)
    check.close(out, ref, base, torch.float32, max_score=max_score)
    check.lse_close(lse, ref_lse, max_score=max_score)


@pytest.mark.parametrize("head_dim", [32, 80, 96, 128, 256])
def test_head_dims(inputs, check, lowp, head_dim):
    out, _, ref, _, base, max_score = run_both(inputs, lowp, check, [17, 33], [17, 33], 2, 1, head_dim,
                                               torch.float16, True, (-1, -1), 0.0)
    check.close(out, ref, base, torch.float16, max_score=max_score)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bottom_right_alignment(inputs, check, lowp, causal):
    """q shorter than k (chunked prefill) and longer than k (leading rows see no key under causal)."""
    q_lens, k_lens = [5, 40, 30], [60, 40, 9]
    out, lse, ref, ref_lse, base, max_score = run_both(inputs, lowp, check, q_lens, k_lens, 2, 1, 32,
                                                       torch.float32, causal, (-1, -1), 0.0)
    check.close(out, ref, base, torch.float32, max_score=max_score)
    check.lse_close(lse, ref_lse, max_score=max_score)
    if causal:  # the third sequence's first 21 queries precede every key
        rows = slice(45, 45 + 21)
        assert torch.all(out[rows] == 0) and torch.all(lse[:, rows] == float("-inf"))


def test_window_narrower_than_block(inputs, check, lowp):
    out, _, ref, _, base, max_score = run_both(inputs, lowp, check, [97], [97], 2, 2, 32, torch.float32, False,
                                               (2, 0), 0.0)
    check.close(out, ref, base, torch.float32, max_score=max_score)


def test_padding_rows(inputs):
    """Rows at or beyond cu_seqlens_q[-1] are zero in a fresh output and untouched in out=."""
    q, k, v, cu_q, cu_k = inputs.varlen([3, 17], [3, 17], 2, 1, 32, torch.float32, pad_rows=5)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, causal=True, return_lse=True)
    assert torch.all(out[20:] == 0) and torch.all(lse[:, 20:] == float("-inf"))
    given = torch.full_like(q, 7.0)
    result = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, causal=True, out=given)
    assert result is given
    assert torch.all(given[20:] == 7.0)
    torch.testing.assert_close(given[:20], out[:20], rtol=0, atol=0)


def test_strided_views(inputs, check, lowp):
    """q, k, v sliced from a fused qkv projection; out a view into a wider buffer."""
    lens, num_heads, num_kv_heads, head_dim = [17, 30], 4, 2, 32
    qkv = inputs.randn(sum(lens), num_heads + 2 * num_kv_heads, head_dim, dtype=torch.float32)
    q, k, v = qkv[:, :num_heads], qkv[:, num_heads:num_heads + 2], qkv[:, num_heads + 2:]
    cu = inputs.cu_seqlens(lens)
    buffer = torch.zeros(sum(lens), num_heads, 2 * head_dim, device=q.device)
    out = buffer[:, :, :head_dim]
    flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True, out=out)
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu, cu, 30, 30, causal=True)
    base = reference.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True)
    check.close(out, ref, base, torch.float32, max_score=check.max_score(q, k))
    assert torch.all(buffer[:, :, head_dim:] == 0)


def test_empty_sequences(inputs, check):
    """Sequences with no queries or no keys: skipped, or zero output."""
    q_lens, k_lens = [0, 5, 3], [4, 0, 6]
    q, k, v, cu_q, cu_k = inputs.varlen(q_lens, k_lens, 2, 2, 32, torch.float32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6)
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu_q, cu_k, 5, 6)
    assert torch.all(out[:5] == 0)
    check.close(out, ref, ref, torch.float32, max_score=check.max_score(q, k))


def test_softmax_scale_and_large_scores(inputs, check):
    """A large scale makes scores of hundreds: the online softmax must not overflow."""
    q, k, v, cu_q, cu_k = inputs.varlen([40], [40], 2, 2, 32, torch.float32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, softmax_scale=20.0, causal=True)
    ref = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu_q, cu_k, 40, 40,
                                           softmax_scale=20.0, causal=True)
    assert torch.isfinite(out).all()
    check.close(out, ref, ref, torch.float32, max_score=check.max_score(q, k, 20.0))
