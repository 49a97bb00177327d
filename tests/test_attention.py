"""accel_plugin.attention: plan_batch's split, gather/scatter and padding paths, end to end.

A step is a random mix of fresh prompts (no cached context), requests that read the
cache (chunked-prefill continuations, prefix-cache hits, decodes, speculative
verification) and padding requests (no queries), in any order, with padding token
rows after the last query and framework tensors longer than the batch. Both backends
plan it, write this step's K/V and run; every request's rows must equal that
request's attention computed alone (the float64 reference on its whole context),
and the padding rows must be left untouched.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from accel_plugin import kernels
from accel_plugin.attention import FlashPagedAttention, PagedAttention, TokenGroup, plan_batch
from accel_plugin.kernels import reference

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 32, 16
SENTINEL = 7.0
BACKENDS = {"flash": FlashPagedAttention, "paged": PagedAttention}

#: (kind, q_len, cached tokens); padding requests have no queries and a stale or zero seq_len
REQUEST = st.one_of(
    st.tuples(st.just("fresh"), st.integers(1, 20), st.just(0)),
    st.tuples(st.just("cached"), st.integers(1, 6), st.integers(1, 40)),
    st.tuples(st.just("padding"), st.just(0), st.sampled_from([0, 0, 5])),
)


@st.composite
def steps(draw):
    return dict(
        requests=draw(st.lists(REQUEST, min_size=1, max_size=6)),
        pad_tokens=draw(st.integers(0, 3)),  # query rows after the last request's
        extra_rows=draw(st.integers(0, 2)),  # framework tensors longer than the batch
        cpu_copies=draw(st.booleans()),
        upper_bound=draw(st.integers(0, 3)),  # seq_lens_cpu larger than the truth for cached requests
        shared_cache_layer=draw(st.booleans()),  # key/value None: fresh prompts read the cache
        seed=draw(st.integers(0, 2**16)),
    )


class Step:
    """One step's tensors as a framework hands them over, plus each request's own q, k, v."""

    def __init__(self, case, dtype, device):
        gen = torch.Generator().manual_seed(case["seed"])

        def randn(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

        self.requests = case["requests"]
        self.shared_cache_layer = case["shared_cache_layer"]
        q_lens = [q for _, q, _ in self.requests]
        seq_lens = [q + c for _, q, c in self.requests]
        self.total = sum(q_lens)
        self.q_lens, self.seq_lens = q_lens, seq_lens
        used = [-(-n // BLOCK_SIZE) for n in seq_lens]
        num_blocks = sum(used) + 2
        perm = torch.randperm(num_blocks, generator=gen)
        table = torch.zeros(len(seq_lens) + case["extra_rows"], max(used + [1]) + 1, dtype=torch.int32)
        start = 0
        for r, n in enumerate(used):
            table[r, :n] = perm[start:start + n].to(torch.int32)
            start += n
        self.k_cache = torch.full((num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), 1e3, dtype=dtype)
        self.v_cache = torch.full_like(self.k_cache, 1e3)  # a slot read before it is written would show
        rows = self.total + case["pad_tokens"]
        self.query = randn(rows, NUM_HEADS, HEAD_DIM)
        self.key, self.value = randn(rows, NUM_KV_HEADS, HEAD_DIM), randn(rows, NUM_KV_HEADS, HEAD_DIM)
        self.context = []  # per request: (q, k, v) of its whole context
        slots, qsl = [], [0]
        for r, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
            cached = seq_len - q_len
            k_old, v_old = randn(cached, NUM_KV_HEADS, HEAD_DIM), randn(cached, NUM_KV_HEADS, HEAD_DIM)
            for t in range(cached):
                block, offset = table[r, t // BLOCK_SIZE], t % BLOCK_SIZE
                self.k_cache[block, offset], self.v_cache[block, offset] = k_old[t], v_old[t]
            rows_r = slice(qsl[-1], qsl[-1] + q_len)
            slots += [int(table[r, t // BLOCK_SIZE]) * BLOCK_SIZE + t % BLOCK_SIZE for t in range(cached, seq_len)]
            self.context.append((self.query[rows_r], torch.cat([k_old, self.key[rows_r]]),
                                 torch.cat([v_old, self.value[rows_r]])))
            qsl.append(qsl[-1] + q_len)
        qsl += [qsl[-1]] * case["extra_rows"]
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
        self.query_start_loc = torch.tensor(qsl, dtype=torch.int32)
        self.seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
        self.block_table = table
        self.plan_args = dict(query_start_loc=self.query_start_loc.to(device), seq_lens=self.seq_lens_t.to(device),
                              block_table=table.to(device), num_actual_tokens=self.total)
        if case["cpu_copies"]:
            bound = torch.tensor([n + case["upper_bound"] * (kind == "cached")
                                  for (kind, _, _), n in zip(self.requests, seq_lens, strict=True)], dtype=torch.int32)
            self.plan_args.update(query_start_loc_cpu=self.query_start_loc, seq_lens_cpu=bound)
        for name in ("k_cache", "v_cache", "query", "key", "value"):
            setattr(self, name, getattr(self, name).to(device))

    def expected(self, r: int) -> torch.Tensor:
        """Request r alone: causal attention of its queries over its whole context (float64)."""
        q, k, v = (t.double().cpu() for t in self.context[r])
        cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32)
        cu_k = torch.tensor([0, k.shape[0]], dtype=torch.int32)
        return reference.flash_attn_varlen_func(q, k, v, cu_q, cu_k, q.shape[0], k.shape[0], causal=True)


def requests_of(group: TokenGroup | None, step: Step) -> set[int]:
    """The requests whose query rows a group serves (padding requests have none)."""
    if group is None:
        return set()
    rows = range(group.rows.start, group.rows.stop) if isinstance(group.rows, slice) else group.rows.tolist()
    owner = [r for r, q_len in enumerate(step.q_lens) for _ in range(q_len)]
    return {owner[row] for row in rows}


class ReferenceKernels:
    """The float64 reference behind the kernels' call signatures; options of the kernels'
    own launches (``plans``, ``workspace``) change nothing in the result and are dropped."""

    @staticmethod
    def flash_attn_varlen_func(*args, plans=None, **kwargs):
        return reference.flash_attn_varlen_func(*args, **kwargs)

    @staticmethod
    def paged_attention(*args, plans=None, workspace=None, **kwargs):
        return reference.paged_attention(*args, **kwargs)

    write_kv_cache = staticmethod(reference.write_kv_cache)


def run(step: Step, backend: str, module, native_cpu: bool = False) -> tuple[torch.Tensor, object]:
    impl = BACKENDS[backend](num_heads=NUM_HEADS, head_size=HEAD_DIM, num_kv_heads=NUM_KV_HEADS,
                             scale=HEAD_DIM ** -0.5)
    if module is not kernels:  # the reference (fast, float64) behind the kernels' signatures
        impl._flash_fn, impl._paged_fn = module.flash_attn_varlen_func, module.paged_attention
        impl._write_fn, impl._native_cpu_ops = module.write_kv_cache, lambda: None
    elif native_cpu:  # the per-layer path of a process without the interpreter: the native CPU ops
        impl._cpu_mode = "torch"
        impl._flash_fn = ReferenceKernels.flash_attn_varlen_func  # fresh prompts: not what is tested here
    batch = impl.plan_batch(**step.plan_args)
    impl.write_kv(step.key, step.value, step.k_cache, step.v_cache, step.slot_mapping)
    output = torch.full_like(step.query, SENTINEL)
    shared = step.shared_cache_layer
    impl.forward(step.query, None if shared else step.key, None if shared else step.value, step.k_cache,
                 step.v_cache, batch, output)
    return output, batch


def check(step: Step, output: torch.Tensor, batch, backend: str, atol: float) -> None:
    kinds = [kind for kind, _, _ in step.requests]
    fresh = {r for r, kind in enumerate(kinds) if kind == "fresh"}
    cached = {r for r, kind in enumerate(kinds) if kind == "cached"}
    if backend == "paged" or not fresh:
        assert batch.fresh is None
    if backend == "flash" and fresh and cached:  # a real split: each group exactly its requests
        assert requests_of(batch.fresh, step) == fresh and requests_of(batch.cached, step) == cached
    if not fresh and not cached:
        assert batch.fresh is None and batch.cached is None
    start = 0
    for r, q_len in enumerate(step.q_lens):
        got = output[start:start + q_len].double().cpu()
        torch.testing.assert_close(got, step.expected(r), rtol=0, atol=atol, msg=lambda m, r=r: f"request {r}: {m}")
        start += q_len
    assert bool((output[step.total:] == SENTINEL).all()), "padding token rows were written"


SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
#: every path at least once: a contiguous fresh run, an interleaved gather/scatter, padding in between
MIXED = dict(requests=[("cached", 1, 30), ("fresh", 5, 0), ("padding", 0, 5), ("cached", 3, 17), ("fresh", 17, 0)],
             pad_tokens=2, extra_rows=1, cpu_copies=True, upper_bound=2, shared_cache_layer=False, seed=1)
CONTIGUOUS = dict(requests=[("fresh", 4, 0), ("fresh", 9, 0), ("cached", 1, 40), ("padding", 0, 0)],
                  pad_tokens=0, extra_rows=0, cpu_copies=False, upper_bound=0, shared_cache_layer=False, seed=2)


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@example(case=MIXED)
@example(case=CONTIGUOUS)
@example(case={**MIXED, "shared_cache_layer": True})
@given(case=steps())
def test_every_request_gets_its_own_attention(backend, case):
    step = Step(case, torch.float64, torch.device("cpu"))
    output, batch = run(step, backend, ReferenceKernels)
    check(step, output, batch, backend, atol=1e-12)


def _kernel_device() -> torch.device:
    if kernels.runtime_mode("cpu") == "interpreter":
        return torch.device("cpu")
    if kernels.runtime_mode("cuda") == "compiled":
        return torch.device("cuda")
    pytest.skip("needs TRITON_INTERPRET=1 (set before import) or a CUDA GPU")


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example(case=MIXED)
@given(case=steps())
def test_the_triton_kernels_too(backend, case):
    step = Step(case, torch.float32, _kernel_device())
    output, batch = run(step, backend, kernels)
    check(step, output, batch, backend, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@example(case=MIXED)
@example(case={**MIXED, "shared_cache_layer": True})
@given(case=steps())
def test_the_native_cpu_kernels_too(backend, case):
    """The per-layer path calls the native ops directly (KV write and paged attention), as in a
    vLLM or TGI process without TRITON_INTERPRET (fresh prompts: the reference here)."""
    if kernels.native_cpu_ops() is None:
        pytest.fail("the native CPU kernels did not build here (tests/kernels/test_cpu_attention.py says why)")
    step = Step(case, torch.float32, torch.device("cpu"))
    output, batch = run(step, backend, kernels, native_cpu=True)
    check(step, output, batch, backend, atol=1e-4)


def test_the_whole_batch_in_one_group_is_not_copied():
    """One kind of request: vLLM's own tensors, sliced, no gather; padding requests ride along."""
    step = Step(CONTIGUOUS | {"requests": [("cached", 1, 20), ("padding", 0, 0), ("cached", 2, 9)]},
                torch.float32, torch.device("cpu"))
    batch = plan_batch(**step.plan_args, split_fresh_prompts=True)
    assert batch.fresh is None and batch.cached.rows == slice(0, 3) and batch.cached.num_reqs == 3
    assert batch.cached.cu_seqlens_q.data_ptr() == step.plan_args["query_start_loc"].data_ptr()


def test_only_padding_plans_nothing():
    step = Step(CONTIGUOUS | {"requests": [("padding", 0, 0), ("padding", 0, 5)]}, torch.float32,
                torch.device("cpu"))
    batch = plan_batch(**step.plan_args, split_fresh_prompts=True)
    assert (batch.fresh, batch.cached, batch.num_actual_tokens) == (None, None, 0)
