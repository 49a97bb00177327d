"""The allocator simulator: exact numbers on hand-made traces, properties of replays, the compared rows."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.observability.kv_accounting import Usage
from accel_plugin.observability.kv_simulator import (ContiguousAllocator, PagedAllocator, SimulationError, _Seq,
                                                     compare_allocators, simulate)
from accel_plugin.observability.kv_trace import Request, synthetic_trace

SETTINGS = settings(max_examples=40, deadline=None, database=None)


def req(prompt_len, output_len, arrival=0, **extra):
    return Request(arrival=arrival, prompt_len=prompt_len, output_len=output_len, **extra)


# --- replays of hand-made traces -------------------------------------------------------------------

def test_one_request_prompt_10_output_5_block_8():
    trace = [req(10, 5)]
    result = simulate(trace, PagedAllocator(1024, 8), record=True)
    lens = [10, 11, 12, 13, 14]  # the prompt at the first step, one more token per step after
    assert result.usages == tuple(Usage(1, n, 16, 2, 16 - n) for n in lens)
    assert result.steps == 5 and result.concurrency == (1,) * 5 and result.mean_concurrent is None
    assert result.totals == Usage(5, 60, 80, 10, 20)
    assert result.totals.percent("waste") == 25.0

    contiguous = simulate(trace, ContiguousAllocator(1024, max_model_len=32), record=True)
    # 32 slots reserved; the request ends at 14 tokens: 18 never used, 14 - n reserved for later tokens
    assert contiguous.usages == tuple(Usage(1, n, 32, 1, 18, 14 - n) for n in lens)
    assert contiguous.totals.percent("waste") == 100 * (160 - 60) / 160
    oracle = simulate(trace, ContiguousAllocator(1024, 32, oracle=True), record=True)
    assert [u.allocated for u in oracle.usages] == [14] * 5 and oracle.totals.internal == 0


def test_shared_prefix_in_a_replay():
    trace = [req(40, 3, prefix_id="sys", prefix_len=35), req(40, 3, prefix_id="sys", prefix_len=35, arrival=1)]
    result = simulate(trace, PagedAllocator(1024, 16, prefix_sharing=True), record=True)
    # step 0: A alone (40 tokens, 3 blocks); steps 1-2: A and B, 2 prefix blocks once; step 3: B alone
    assert [u.blocks for u in result.usages] == [3, 4, 4, 3]
    assert [u.used for u in result.usages] == [40, 41 + 40 - 32, 42 + 41 - 32, 42]
    plain = simulate(trace, PagedAllocator(1024, 16), record=True)
    assert [u.blocks for u in plain.usages] == [3, 6, 6, 3]


def test_first_fit_places_in_the_first_hole_that_holds_it():
    alloc = ContiguousAllocator(40, max_model_len=10)
    a, b, c, e = (_Seq(i, req(5, 1, max_output_len=5)) for i in range(4))
    for seq in (a, b, c):
        assert alloc.admit(seq, 5)
    alloc.release(b)
    assert alloc.admit(e, 5)
    assert alloc.chunks() == [(0, 10, 0), (10, 10, 3), (20, 10, 2)]


def test_contiguous_external_fragmentation_known_hole():
    # cache of 30 slots, max_model_len 20; A, B, C reserve 10 each (prompt + max_output_len), D needs 15
    trace = [
        req(5, 2, max_output_len=5),   # A: [0, 10), leaves after step 1
        req(2, 8, max_output_len=8),   # B: [10, 20), leaves after step 7
        req(5, 3, max_output_len=5),   # C: [20, 30), leaves after step 2
        req(5, 1, max_output_len=10),  # D: 15 slots
    ]
    result = simulate(trace, ContiguousAllocator(30, max_model_len=20), record=True)
    # steps 3-7: holes [0, 10) and [20, 30): 20 slots free, D needs 15, no hole holds it
    assert [u.external for u in result.usages] == [0, 0, 0, 20, 20, 20, 20, 20, 0]
    assert [u.allocated for u in result.usages] == [30, 30, 20, 10, 10, 10, 10, 10, 15]
    assert result.concurrency == (3, 3, 2, 1, 1, 1, 1, 1, 1) and result.steps == 9
    assert result.mean_concurrent == statistics.fmean([3, 3, 2, 1, 1, 1, 1, 1])
    # the same trace with every chunk at max_model_len never strands memory
    same_size = simulate([r.model_copy(update={"max_output_len": None}) for r in trace],
                         ContiguousAllocator(40, max_model_len=20), record=True)
    assert same_size.totals.external == 0


def test_paged_preempts_the_newest_and_recomputes_it():
    # 4 blocks of 4 slots; A and B start with 2 blocks each, A needs a third at step 1
    trace = [req(8, 3), req(8, 3)]
    result = simulate(trace, PagedAllocator(16, 4), record=True)
    assert result.preemptions == 1
    # step 0: both (8 + 8); step 1: A grows to 9 and takes B's blocks; B returns after A leaves,
    # recomputing its prompt and the token it had sampled (9 tokens)
    assert [u.used for u in result.usages] == [16, 9, 10, 9, 10]
    assert result.concurrency == (2, 1, 1, 1, 1)
    assert result.totals.seqs == sum(r.output_len for r in trace)


def test_cache_smaller_than_a_request_is_refused():
    with pytest.raises(SimulationError, match="raise --cache-tokens to at least 2048"):
        simulate([req(10, 5)], ContiguousAllocator(1000, max_model_len=2048))
    with pytest.raises(SimulationError, match="at least 16"):
        simulate([req(10, 5)], PagedAllocator(15, 8))


# --- properties ------------------------------------------------------------------------------------

@st.composite
def traces(draw):
    prefix_lens = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))
    out = []
    for _ in range(draw(st.integers(1, 8))):
        which = draw(st.integers(-1, len(prefix_lens) - 1))
        prefix = {"prefix_id": which, "prefix_len": prefix_lens[which]} if which >= 0 else {}
        prompt = (prefix_lens[which] if which >= 0 else 0) + draw(st.integers(1, 30))
        out.append(req(prompt, draw(st.integers(1, 20)), arrival=draw(st.integers(0, 15)), **prefix))
    return out


class CheckedPaged(PagedAllocator):
    """Checks at each step that the allocator's free-block count agrees with paged_usage."""

    def usage(self, running, head):
        usage = super().usage(running, head)
        assert usage.blocks == self.num_blocks - self.free_blocks
        return usage


@SETTINGS
@given(traces(), st.sampled_from([1, 3, 8, 16]), st.integers(0, 200))
def test_replay_properties(trace, block_size, spare):
    cache = 100 + spare  # holds the longest request (70 + 20 tokens) at any of these block sizes
    for allocator in (CheckedPaged(cache, block_size), CheckedPaged(cache, block_size, prefix_sharing=True),
                      ContiguousAllocator(cache, max_model_len=90), ContiguousAllocator(cache, 90, oracle=True)):
        result = simulate(trace, allocator, record=True)
        assert result.totals.seqs == sum(r.output_len for r in trace)  # every request ran each of its steps once
        for usage in result.usages:
            assert usage.used <= usage.allocated <= allocator.capacity
            assert usage.allocated + usage.external <= allocator.capacity
            if isinstance(allocator, PagedAllocator):
                assert usage.internal < block_size * usage.seqs and usage.external == 0
        if isinstance(allocator, PagedAllocator):
            assert allocator.free_blocks == allocator.num_blocks  # everything given back
    # with room for all at once both replays run the same schedule: sharing never allocates more
    big = 90 * len(trace)
    shared = simulate(trace, PagedAllocator(big, block_size, prefix_sharing=True), record=True)
    plain = simulate(trace, PagedAllocator(big, block_size), record=True)
    assert shared.concurrency == plain.concurrency
    assert all(s.allocated <= p.allocated for s, p in zip(shared.usages, plain.usages))
    if block_size == 1:
        assert plain.totals.internal == 0



def test_compare_allocators_rows():
    results = compare_allocators(synthetic_trace(80, seed=1, max_model_len=512, arrival_rate=2.0),
                                 cache_tokens=4096, max_model_len=512, block_sizes=(1, 16))
    assert [r.allocator for r in results] == ["contiguous", "contiguous-oracle", "paged b=1", "paged b=16",
                                              "paged b=16 +prefix"]
    contiguous = results[0]
    assert contiguous.mean_concurrent == 8.0  # 4096 // 512, whenever requests wait
    assert results[2].totals.internal == 0 and results[3].totals.percent("waste") < contiguous.totals.percent("waste")
