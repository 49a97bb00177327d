"""The draft engine: greedy drafts equal the draft model's own greedy continuation,
across steps with accepted and rejected drafts, in mixed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel_plugin.speculative.draft_engine import DraftEngine, DraftJob


@pytest.fixture(scope="module")
def hf_draft(draft_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()


def greedy(hf, context: list[int], k: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([context]), max_new_tokens=k, min_new_tokens=k, do_sample=False)
    return out[0, len(context):].tolist()


def test_drafts_follow_contexts_across_steps(draft_dir, hf_draft):
    rng = np.random.default_rng(0)
    engine = DraftEngine(max_len=256, initial_slots=2)
    contexts = [rng.integers(3, 384, n).tolist() for n in (1, 4, 40, 9, 23)]
    caches = [engine.new_cache(str(draft_dir)) for _ in contexts]
    ks = [3, 1, 4, 2, 3]
    for step in range(6):
        jobs = [DraftJob(c, np.array(ctx), k) for c, ctx, k in zip(caches, contexts, ks)]
        result = engine.draft(str(draft_dir), jobs)
        for ctx, k, drafts in zip(contexts, ks, result.drafts):
            assert drafts == greedy(hf_draft, ctx, k)
        assert result.rounds == max(ks)
        # the "target" accepts a row-dependent number of drafts, then adds its own token
        for i, drafts in enumerate(result.drafts):
            accepted = (i + step) % (len(drafts) + 1)
            contexts[i] = contexts[i] + drafts[:accepted] + [int(rng.integers(3, 384))]
        ks = [1 + (k + step) % 4 for k in ks]


def test_long_prompt_joins_running_rows(draft_dir, hf_draft):
    engine = DraftEngine(max_len=512)
    a = engine.new_cache(str(draft_dir))
    ctx_a = list(range(10, 20))
    engine.draft(str(draft_dir), [DraftJob(a, np.array(ctx_a), 2)])
    ctx_a = ctx_a + [33]
    b = engine.new_cache(str(draft_dir))
    ctx_b = list(range(5, 305))  # a prompt of 300 tokens runs in a forward of its own
    result = engine.draft(str(draft_dir), [DraftJob(a, np.array(ctx_a), 3), DraftJob(b, np.array(ctx_b), 3)])
    assert result.drafts == [greedy(hf_draft, ctx_a, 3), greedy(hf_draft, ctx_b, 3)]
    # the prompt's forward is excluded from the per-step time: 1 short catch-up + 2 rounds
    assert result.rounds == 3


def test_zero_k_rows_are_skipped_and_cache_is_kept(draft_dir, hf_draft):
    engine = DraftEngine(max_len=128)
    cache = engine.new_cache(str(draft_dir))
    ctx = list(range(40, 60))
    engine.draft(str(draft_dir), [DraftJob(cache, np.array(ctx), 2)])
    cached = cache.tokens.copy()
    result = engine.draft(str(draft_dir), [DraftJob(cache, np.array(ctx + [101, 102]), 0)])
    assert result.drafts == [[]] and np.array_equal(cache.tokens, cached)
    # after several off steps the row catches up in one forward
    ctx = ctx + [101, 102, 103, 104, 105]
    assert engine.draft(str(draft_dir), [DraftJob(cache, np.array(ctx), 2)]).drafts == [greedy(hf_draft, ctx, 2)]


def test_free_cache_returns_slot(draft_dir):
    engine = DraftEngine(max_len=64, initial_slots=1)
    cache = engine.new_cache(str(draft_dir))
    model = engine.models[str(draft_dir)]
    assert model.num_free_slots == 0
    engine.free_cache(cache)
    assert model.num_free_slots == 1


def test_a_step_compares_only_the_new_tokens(draft_dir, hf_draft):
    """The cache keeps the last context by reference and compares only what came after
    it: a step's host work does not grow with the context (issue 22)."""
    engine = DraftEngine(max_len=256)
    cache = engine.new_cache(str(draft_dir))
    ctx = np.arange(40, 140, dtype=np.int64)
    first = engine.draft(str(draft_dir), [DraftJob(cache, ctx, 3)]).drafts[0]
    assert cache.verified == len(ctx) and cache.base is ctx and list(cache.tail) == first[:-1]
    # the target accepted the first draft and sampled another token
    longer = np.concatenate([ctx, [first[0], 7]])

    # a context whose old part differs (but ends on the same token) reads as cached:
    # only the tokens after the cached context were compared
    altered = longer.copy()
    altered[:10] = 0
    assert cache.cached_prefix(altered) == len(ctx) + 1  # the context + the accepted draft
    assert cache.cached_prefix(longer) == len(ctx) + 1
    assert engine.draft(str(draft_dir), [DraftJob(cache, longer, 2)]).drafts[0] == greedy(hf_draft, list(longer), 2)
    assert np.array_equal(cache.tokens[: len(longer)], longer)


def test_bfloat16_on_a_cpu_without_native_bf16_runs_mixed(draft_dir, monkeypatch):
    """dtype bfloat16 -> float32 compute and KV, bfloat16 weights for small forwards only."""
    from accel_plugin.speculative import llama

    monkeypatch.setattr(llama, "native_bf16", lambda: False)
    engine = DraftEngine(dtype=torch.bfloat16, max_len=64)
    model = engine.load(str(draft_dir))
    assert model.dtype == torch.float32 and model.small_batch_rows == llama.SMALL_BATCH_ROWS
    assert model.small_layers[0].qkv.dtype == torch.bfloat16
    result = engine.draft(str(draft_dir), [DraftJob(engine.new_cache(str(draft_dir)), np.arange(3, 12), 3)])
    assert len(result.drafts[0]) == 3
    monkeypatch.setattr(llama, "native_bf16", lambda: True)
    monkeypatch.setattr(llama, "native_bf16_product", lambda device="cpu": None)
    native = DraftEngine(dtype=torch.bfloat16, max_len=64).load(str(draft_dir))
    assert native.dtype == torch.bfloat16 and native.small_batch_rows == 0


def test_bfloat16_with_the_native_bf16_product_runs_float32_with_bf16_weights(draft_dir, monkeypatch):
    """dtype bfloat16 on a CPU with native bfloat16 and the native product: float32 compute and KV,
    the bfloat16 matrices by the native product up to NATIVE_BF16_ROWS rows."""
    from accel_plugin.speculative import llama

    if llama.native_bf16_product() is None:
        pytest.skip("no native product of bfloat16 matrices here (needs AVX512-BF16 and the native build)")
    monkeypatch.setattr(llama, "native_bf16", lambda: True)
    engine = DraftEngine(dtype=torch.bfloat16, max_len=64)
    model = engine.load(str(draft_dir))
    assert model.dtype == torch.float32 and model.small_batch_rows == llama.NATIVE_BF16_ROWS
    assert model.large_layers[0].qkv.dtype == torch.bfloat16
    result = engine.draft(str(draft_dir), [DraftJob(engine.new_cache(str(draft_dir)), np.arange(3, 12), 3)])
    assert len(result.drafts[0]) == 3
