"""paged_attention against the float64 reference (small shapes, interpreter or GPU)."""

import pytest
import torch

from accel_plugin.kernels import paged_attention, reference

# (q_lens, seq_lens): each sequence's queries are the last q_len of its seq_len tokens.
BATCHES = {
    "decode": ([1, 1, 1], [1, 17, 97]),
    "verify": ([4, 4], [20, 97]),  # speculative verification, k + 1 = 4 tokens
    "chunked": ([17, 30], [97, 30]),  # chunked prefill over cached context, and a fresh prompt
    "mixed": ([1, 17, 4], [97, 40, 4]),
}


def run_both(inputs, lowp, check, q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
             dtype=torch.float16, causal=True, window=(-1, -1), softcap=0.0, num_splits=1, pad_rows=0):
    q, k_cache, v_cache, cu_q, lens, table = inputs.paged(q_lens, seq_lens, num_heads, num_kv_heads, head_dim,
                                                          block_size, dtype, pad_rows)
    opts = dict(causal=causal, window_size=window, softcap=softcap)
    args = (cu_q, lens, table, max(q_lens), max(seq_lens))
    out = paged_attention(q, k_cache, v_cache, *args, num_splits=num_splits, **opts)
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), *args, **opts)
    base = lowp.paged(q, k_cache, v_cache, cu_q, lens, table, **opts)
    return out, ref, base, check.max_score(q, k_cache, softcap=softcap)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("kind", BATCHES)
def test_batch_kinds(inputs, check, lowp, kind, num_splits):
    out, ref, base, max_score = run_both(inputs, lowp, check, *BATCHES[kind], num_splits=num_splits)
    check.close(out, ref, base, torch.float16, max_score=max_score)


@pytest.mark.parametrize("num_splits", [1, 0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_dtypes(inputs, check, lowp, dtype, num_splits):
    out, ref, base, max_score = run_both(inputs, lowp, check, *BATCHES["mixed"], dtype=dtype,
                                         num_splits=num_splits)
    assert out.dtype == dtype
    check.close(out, ref, base, dtype, max_score=max_score)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 1), (6, 2)],
                         ids=["mha", "gqa2", "mqa8", "gqa3"])
def test_gqa(inputs, check, lowp, num_heads, num_kv_heads):
    out, ref, base, max_score = run_both(inputs, lowp, check, [1, 9], [33, 40], num_heads, num_kv_heads,
                                         dtype=torch.float32, num_splits=2)
    check.close(out, ref, base, torch.float32, max_score=max_score)


# (causal, window_size, softcap)
MASKS = {
    "full": (False, (-1, -1), 0.0),
    "causal-window": (True, (20, -1), 0.0),
    "causal-softcap": (True, (-1, -1), 4.0),
    "window-both-sides": (False, (7, 3), 0.0),
}


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("mask", MASKS)
def test_masks(inputs, check, lowp, mask, num_splits):
    causal, window, softcap = MASKS[mask]
    out, ref, base, max_score = run_both(inputs, lowp, check, [1, 17], [97, 30], dtype=torch.float32,
                                         causal=causal, window=window, softcap=softcap, num_splits=num_splits)
    check.close(out, ref, base, torch.float32, max_score=max_score)


@pytest.mark.parametrize("block_size", [16, 24, 32, 64, 256])
def test_block_sizes(inputs, check, lowp, block_size):
    out, ref, base, max_score = run_both(inputs, lowp, check, [1, 5], [97, 70], block_size=block_size,
                                         num_splits=2)
    check.close(out, ref, base, torch.float16, max_score=max_score)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_head_dims(inputs, check, lowp, head_dim):
    out, ref, base, max_score = run_both(inputs, lowp, check, [1, 3], [20, 40], 2, 1, head_dim=head_dim)
    check.close(out, ref, base, torch.float16, max_score=max_score)


def test_more_splits_than_key_tiles(inputs, check, lowp):
    """Splits with no keys contribute nothing (lse -inf), for short and long sequences alike."""
    out, ref, base, max_score = run_both(inputs, lowp, check, [1, 2, 1], [1, 5, 97], dtype=torch.float32,
                                         num_splits=8)
    check.close(out, ref, base, torch.float32, max_score=max_score)


def test_splits_agree(inputs):
    q, k_cache, v_cache, cu_q, lens, table = inputs.paged([1, 6], [97, 60], 4, 2, 32, 16, torch.float32)
    args = (q, k_cache, v_cache, cu_q, lens, table, 6, 97)
    one = paged_attention(*args, num_splits=1)
    for splits in (0, 2, 5):
        torch.testing.assert_close(paged_attention(*args, num_splits=splits), one, rtol=1e-5, atol=1e-6)


def test_padding_rows_and_out(inputs):
    """vLLM pads q: rows beyond cu_seqlens_q[-1] stay untouched in out=, zero in a fresh output."""
    q, k_cache, v_cache, cu_q, lens, table = inputs.paged([1, 4], [30, 20], 4, 2, 32, 16, torch.float32,
                                                          pad_rows=6)
    args = (q, k_cache, v_cache, cu_q, lens, table, 4, 30)
    fresh = paged_attention(*args, num_splits=2)
    assert torch.all(fresh[5:] == 0)
    for splits in (1, 2):
        out = torch.full_like(q, 7.0)
        result = paged_attention(*args, num_splits=splits, out=out)
        assert result is out
        assert torch.all(out[5:] == 7.0)
        torch.testing.assert_close(out[:5], fresh[:5], rtol=1e-5, atol=1e-6)


def test_empty_sequences(inputs, check):
    """Padding requests (q_len 0, seq_len 0, garbage block_table row) ride along in the batch."""
    q, k_cache, v_cache, cu_q, lens, table = inputs.paged([0, 3, 0, 1], [0, 20, 5, 17], 4, 2, 32, 16,
                                                          torch.float32)
    table[0] = 10_000  # never read: seq_len 0
    out = paged_attention(q, k_cache, v_cache, cu_q, lens, table, 3, 20, num_splits=2)
    table[0] = 0
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), cu_q, lens, table, 3, 20)
    check.close(out, ref, ref, torch.float32, max_score=check.max_score(q, k_cache))


def test_strided_views(inputs, check):
    """q sliced from a fused qkv buffer; k/v caches as views into one [2, blocks, ...] tensor."""
    q_lens, seq_lens, num_heads, num_kv_heads, head_dim = [1, 6], [40, 23], 4, 2, 32
    _, k_cache, _, cu_q, lens, table = inputs.paged(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, 16,
                                                    torch.float32)
    kv_cache = torch.stack([k_cache, k_cache.flip(0)])  # kv_cache[1] differs from kv_cache[0]
    qkv = inputs.randn(sum(q_lens), num_heads + 2 * num_kv_heads, head_dim, dtype=torch.float32)
    q = qkv[:, :num_heads]
    out = paged_attention(q, kv_cache[0], kv_cache[1], cu_q, lens, table, 6, 40, num_splits=2)
    ref = reference.paged_attention(q.double(), kv_cache[0].double(), kv_cache[1].double(), cu_q, lens, table,
                                    6, 40)
    check.close(out, ref, ref, torch.float32, max_score=check.max_score(q, kv_cache[0]))


def test_matches_flash_attn_on_contiguous_cache(inputs, check):
    """With the whole prompt in the cache, paged attention equals varlen flash attention."""
    from accel_plugin.kernels import flash_attn_varlen_func

    lens = [17, 33]
    q, k_cache, v_cache, cu_q, seq_lens, table = inputs.paged(lens, lens, 4, 2, 32, 16, torch.float32)
    k = torch.cat([reference.gather_kv(k_cache, table[b], n) for b, n in enumerate(lens)])
    v = torch.cat([reference.gather_kv(v_cache, table[b], n) for b, n in enumerate(lens)])
    flash = flash_attn_varlen_func(q, k, v, cu_q, cu_q, 33, 33, causal=True)
    paged = paged_attention(q, k_cache, v_cache, cu_q, seq_lens, table, 33, 33, num_splits=1)
    torch.testing.assert_close(paged, flash, rtol=1e-5, atol=1e-5)



def test_workspace_holds_the_splits(inputs):
    """With a workspace, the split-K partials live in it (CUDA graphs: no allocation) and the
    result equals the allocating call's; the automatic split takes no more than it holds."""
    from accel_plugin.kernels import split_workspace_numel

    q, k_cache, v_cache, cu_q, lens, table = inputs.paged([1, 4], [97, 60], 4, 2, 32, 16, torch.float32)
    args = (q, k_cache, v_cache, cu_q, lens, table, 4, 97)
    workspace = torch.full((split_workspace_numel(q.shape[0], 4, 32, 3),), float("nan"), device=q.device)
    with_workspace = paged_attention(*args, num_splits=3, workspace=workspace)
    assert not torch.isnan(workspace).all(), "the partials were not written to the workspace"
    assert torch.equal(with_workspace, paged_attention(*args, num_splits=3))


def test_automatic_split_fits_the_workspace(inputs):
    """One short decode over 300 keys: the automatic rule splits (shapes and bounds only), as
    far as a workspace holds; below one split's worth it does not split."""
    from accel_plugin.kernels import auto_num_splits, split_workspace_numel

    q, k_cache, v_cache, cu_q, lens, table = inputs.paged([1], [300], 2, 1, 32, 16, torch.float32)
    args = (q, k_cache, v_cache, cu_q, lens, table, 1, 300)
    splits = auto_num_splits(1, 1, 2, 1, 32, torch.float32, q.device, 1, 300)
    assert splits > 1
    ample = torch.empty(split_workspace_numel(1, 2, 32, splits), device=q.device)
    assert torch.equal(paged_attention(*args, workspace=ample), paged_attention(*args, num_splits=splits))
    too_small = ample[: split_workspace_numel(1, 2, 32, 2) // 2 - 1]
    assert torch.equal(paged_attention(*args, workspace=too_small), paged_attention(*args, num_splits=1))


def test_workspace_bad_input(inputs):
    q, k_cache, v_cache, cu_q, lens, table = inputs.paged([1, 4], [97, 60], 4, 2, 32, 16, torch.float32)
    args = (q, k_cache, v_cache, cu_q, lens, table, 4, 97)
    with pytest.raises(ValueError, match="workspace must be a contiguous 1-D torch.float32 tensor"):
        paged_attention(*args, workspace=torch.zeros(64, dtype=torch.float16, device=q.device))
    with pytest.raises(ValueError, match="num_splits=4 needs"):
        paged_attention(*args, num_splits=4, workspace=torch.zeros(8, device=q.device))
