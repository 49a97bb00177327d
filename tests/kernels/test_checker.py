"""The accuracy rule itself (conftest.Checker): the floor follows the case, and the rule
rejects a decode that lost a split-K partition. The kernels are not called: the
float64 reference stands in for them, so this runs on any machine."""

import torch

from accel_plugin.kernels import reference

FP32 = torch.float32


def test_floor_follows_the_scores(check):
    """Scores of hundreds (softmax_scale 20): fp32 rounding in exp(s - m) grows with |s|.
    An error of 3.78e-5, measured on an AMD EPYC machine in test_softmax_scale_and_large_scores
    (largest |score| about 450, outputs up to about 3.7), is within the floor; with
    ordinary scores (largest about 4) the floor stays below the former fixed 1e-5."""
    assert check.floor(FP32, 450.0, 3.7) > 3.78e-5
    assert check.floor(FP32, 4.0, 1.5) < 1e-5
    assert check.floor(FP32, 0.0, 1.0) == check.floor(FP32, 1.0, 1.0)
    assert check.floor(torch.bfloat16, 4.0, 0.05) < check.floor(torch.bfloat16, 4.0, 2.0) / 10


def test_max_score_bounds_every_score(check):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(7, 4, 32, generator=gen), torch.randn(11, 2, 32, generator=gen)
    largest = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(2, dim=1)).abs().max().item()
    assert abs(check.max_score(q, k) - largest * 32 ** -0.5) < 1e-5
    assert abs(check.max_score(q, k, 20.0) - largest * 20.0) < 1e-3
    assert check.max_score(q, k, 20.0, softcap=5.0) <= 5.0 < check.max_score(q, k, 20.0)
    assert check.max_score(q, k.view(1, 11, 2, 32)) == check.max_score(q, k)  # a paged cache
    assert check.max_score(q[:0], k) == 0.0


def test_lost_split_fails_the_check(check, lowp):
    """32k-key bf16 decode: outputs are about 0.03, so losing the last 1/8 of the keys moves
    them by about 0.01, which a fixed atol=rtol=2e-2 accepted. The rule accepts the
    correct result rounded to bf16 and rejects the one that lost the partition."""
    gen = torch.Generator().manual_seed(2)
    context, block_size, num_splits, dtype = 32768, 16, 8, torch.bfloat16
    num_blocks = context // block_size
    k_cache, v_cache = (torch.randn(num_blocks, block_size, 1, 128, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(1, 4, 128, generator=gen).to(dtype)
    table = torch.randperm(num_blocks, generator=gen).to(torch.int32)[None]
    cu = torch.tensor([0, 1], dtype=torch.int32)

    def decode(seq_len, compute):
        lens = torch.tensor([seq_len], dtype=torch.int32)
        return reference.paged_attention(q.to(compute), k_cache.to(compute), v_cache.to(compute), cu, lens, table,
                                         1, seq_len)

    ref = decode(context, torch.float64)
    base = lowp.paged(q, k_cache, v_cache, cu, torch.tensor([context], dtype=torch.int32), table)
    max_score = check.max_score(q, k_cache)
    check.close(decode(context, FP32).to(dtype), ref, base, dtype, max_score=max_score)
    lost = decode(context - context // num_splits, torch.float64).to(dtype)
    assert torch.allclose(lost.double(), ref, atol=2e-2, rtol=2e-2)  # what the former GPU tolerance allowed
    err, limit, _ = check.verdict(lost, ref, base, dtype, max_score)
    assert err > 5 * limit, f"a lost partition passed: error {err:.3g}, limit {limit:.3g}"
