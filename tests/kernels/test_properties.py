"""Property tests: random shapes and options, kernel == float64 reference (fp32, exact-ish)."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel_plugin.kernels import flash_attn_varlen_func, paged_attention, reference

SETTINGS = settings(max_examples=12, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
HEADS = st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4), (6, 3), (8, 1)])
WINDOW = st.tuples(st.integers(-1, 40), st.integers(-1, 40))


@st.composite
def varlen_case(draw):
    batch = draw(st.integers(1, 3))
    q_lens = draw(st.lists(st.integers(0, 70), min_size=batch, max_size=batch))
    k_lens = draw(st.lists(st.integers(0, 70), min_size=batch, max_size=batch))
    return dict(q_lens=q_lens, k_lens=k_lens, heads=draw(HEADS), head_dim=draw(st.sampled_from([32, 64])),
                causal=draw(st.booleans()), window=draw(WINDOW), softcap=draw(st.sampled_from([0.0, 3.0])),
                pad_rows=draw(st.integers(0, 3)))


@SETTINGS
@given(case=varlen_case())
def test_flash_attn_varlen(inputs, check, case):
    (num_heads, num_kv_heads), q_lens, k_lens = case["heads"], case["q_lens"], case["k_lens"]
    q, k, v, cu_q, cu_k = inputs.varlen(q_lens, k_lens, num_heads, num_kv_heads, case["head_dim"], torch.float32,
                                        case["pad_rows"])
    opts = dict(causal=case["causal"], window_size=case["window"], softcap=case["softcap"], return_lse=True)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), **opts)
    ref, ref_lse = reference.flash_attn_varlen_func(q.double(), k.double(), v.double(), cu_q, cu_k, max(q_lens),
                                                    max(k_lens), **opts)
    max_score = check.max_score(q, k, softcap=case["softcap"])
    check.close(out, ref, ref, torch.float32, max_score=max_score)
    check.lse_close(lse, ref_lse, max_score=max_score)


@st.composite
def paged_case(draw):
    batch = draw(st.integers(1, 3))
    q_lens = draw(st.lists(st.integers(0, 20), min_size=batch, max_size=batch))
    context = draw(st.lists(st.integers(0, 90), min_size=batch, max_size=batch))
    return dict(q_lens=q_lens, seq_lens=[q + c for q, c in zip(q_lens, context, strict=True)], heads=draw(HEADS),
                head_dim=draw(st.sampled_from([32, 64])), block_size=draw(st.sampled_from([16, 32, 48])),
                causal=draw(st.booleans()), window=draw(WINDOW), softcap=draw(st.sampled_from([0.0, 3.0])),
                num_splits=draw(st.integers(0, 4)), pad_rows=draw(st.integers(0, 3)))


@SETTINGS
@given(case=paged_case())
def test_paged_attention(inputs, check, case):
    (num_heads, num_kv_heads), q_lens, seq_lens = case["heads"], case["q_lens"], case["seq_lens"]
    q, k_cache, v_cache, cu_q, lens, table = inputs.paged(q_lens, seq_lens, num_heads, num_kv_heads,
                                                          case["head_dim"], case["block_size"], torch.float32,
                                                          case["pad_rows"])
    opts = dict(causal=case["causal"], window_size=case["window"], softcap=case["softcap"])
    args = (cu_q, lens, table, max(q_lens), max(seq_lens))
    out = torch.full_like(q, 7.0)
    paged_attention(q, k_cache, v_cache, *args, num_splits=case["num_splits"], out=out, **opts)
    ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), *args,
                                    out=torch.full_like(q, 7.0, dtype=torch.float64), **opts)
    rows = int(cu_q[-1])  # the padding rows beyond hold 7.0 in both, and must not set the outputs' scale
    assert torch.all(out[rows:] == 7.0)
    check.close(out[:rows], ref[:rows], ref[:rows], torch.float32,
                max_score=check.max_score(q, k_cache, softcap=case["softcap"]))
