"""KV-cache accounting and the allocator simulator: exact numbers on hand-made traces, properties."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.observability.kv import ContiguousAllocator, PagedAllocator, Request, SimulationError, TraceError, Usage, _Seq, compare_allocators, contiguous_usage, load_trace, paged_usage, simulate, synthetic_trace

SETTINGS = settings(max_examples=40, deadline=None, database=None)


def req(prompt_len, output_len, arrival=0, **extra):
    return Request(arrival=arrival, prompt_len=prompt_len, output_len=output_len, **extra)


# --- the pure accounting functions ---------------------------------------------------------------

def test_paged_usage_exact():
    # lengths 1, 17, 97 at block 16: 1 + 2 + 7 blocks
    assert paged_usage([1, 17, 97], 16) == Usage(seqs=3, used=115, allocated=160, blocks=10, internal=45)
    assert paged_usage([], 16) == Usage(0, 0, 0, 0, 0)
    assert paged_usage([0, 16], 16) == Usage(2, 16, 16, 1, 0)


def test_shared_prefix_full_blocks_counted_once():
    # prefix of 35 tokens at block 16: 2 full blocks (32 tokens) shared; the 3 tokens after them are not
    shared = paged_usage([40, 40], 16, [("sys", 35), ("sys", 35)])
    assert shared == Usage(seqs=2, used=80 - 32, allocated=64, blocks=4, internal=16)
    assert paged_usage([40, 40], 16) == Usage(2, 80, 96, 6, 16)
    # a prefix shorter than a block shares nothing; different prefix ids share nothing
    assert paged_usage([40, 40], 16, [("a", 15), ("a", 15)]) == paged_usage([40, 40], 16)
    assert paged_usage([40, 40], 16, [("a", 35), ("b", 35)]) == paged_usage([40, 40], 16)
    # three sequences in a group and one without a prefix
    assert paged_usage([32, 50, 33, 7], 16, [("p", 32)] * 3 + [None]).blocks == 2 + 2 + 1 + 1


def test_paged_usage_refuses_bad_input():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
            paged_usage([3], bad)
    with pytest.raises(ValueError, match="seq_lens must be >= 0"):
        paged_usage([-1], 16)
    with pytest.raises(ValueError, match="prefix_len must be in 0..seq_len"):
        paged_usage([10], 16, [("p", 11)])
    with pytest.raises(ValueError, match="has prefix_len 20 and 30"):
        paged_usage([40, 40], 16, [("p", 20), ("p", 30)])


def test_contiguous_usage_exact():
    assert contiguous_usage([10, 3], [32, 32], [14, 5]) == Usage(seqs=2, used=13, allocated=64, blocks=2,
                                                                   internal=64 - 19, reserved=19 - 13)
    with pytest.raises(ValueError, match="seq_len <= final_len <= reservation"):
        contiguous_usage([10], [8], [10])


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

@SETTINGS
@given(st.lists(st.integers(0, 300), max_size=20), st.integers(1, 64))
def test_paged_usage_properties(seq_lens, block_size):
    usage = paged_usage(seq_lens, block_size)
    assert usage.used == sum(seq_lens) <= usage.allocated == usage.blocks * block_size
    assert usage.internal == usage.allocated - usage.used and usage.reserved == usage.external == 0
    for n in seq_lens:
        assert 0 <= paged_usage([n], block_size).internal < block_size
    assert paged_usage(seq_lens, 1).internal == 0


@st.composite
def prefixed_seqs(draw):
    prefix_lens = draw(st.lists(st.integers(1, 100), min_size=1, max_size=3))
    seqs, prefixes = [], []
    for _ in range(draw(st.integers(0, 12))):
        which = draw(st.integers(-1, len(prefix_lens) - 1))
        base = prefix_lens[which] if which >= 0 else 0
        seqs.append(base + draw(st.integers(0, 60)))
        prefixes.append((which, base) if which >= 0 else None)
    return seqs, prefixes


@SETTINGS
@given(prefixed_seqs(), st.integers(1, 64))
def test_prefix_sharing_never_allocates_more(seqs_and_prefixes, block_size):
    seq_lens, prefixes = seqs_and_prefixes
    shared, plain = paged_usage(seq_lens, block_size, prefixes), paged_usage(seq_lens, block_size)
    assert shared.blocks <= plain.blocks and shared.used <= shared.allocated
    assert shared.internal == plain.internal  # shared blocks are full ones


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


# --- traces ----------------------------------------------------------------------------------------

def test_synthetic_trace_is_seeded_and_sharegpt_like():
    a, b = synthetic_trace(1000, seed=3), synthetic_trace(1000, seed=3)
    assert a == b and a != synthetic_trace(1000, seed=4)
    assert all(r.prompt_len + r.output_len <= 2048 for r in a)
    assert 100 <= statistics.median(r.prompt_len for r in a) <= 200
    assert 150 <= statistics.median(r.output_len for r in a) <= 250
    assert 300 < sum(r.prefix_id is not None for r in a) < 700
    assert all(r.prompt_len + r.output_len <= 64 for r in synthetic_trace(200, seed=0, max_model_len=64))


def test_load_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [{"arrival": 0, "prompt_len": 10, "output_len": 5},
             {"arrival": 2, "prompt_len": 40, "output_len": 3, "prefix_id": "sys", "prefix_len": 35, "id": "r2"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    trace = load_trace(path, max_model_len=2048)
    assert [r.prompt_len for r in trace] == [10, 40] and trace[1].prefix_id == "sys"


@pytest.mark.parametrize("line, message", [
    ('{"arrival": 0, "prompt_len": 0, "output_len": 5}', "line 2: prompt_len: Input should be greater than or equal to 1, got 0"),
    ('{"arrival": 0, "prompt_len": 5}', "line 2: output_len: required field is missing"),
    ('{"arrival": 0.5, "prompt_len": 5, "output_len": 5}', "line 2: arrival: Input should be a valid integer"),
    ('{"arrival": 0, "prompt": 5, "output_len": 5}', ("line 2: prompt: unknown field (valid fields: arrival, "
     "prompt_len, output_len, prefix_id, prefix_len, max_output_len, id); prompt_len: required field is missing")),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 5, "prefix_id": "a"}', "line 2: prefix_id and prefix_len go together"),
    ('{"arrival": 0, "prompt_len": 5, "output_len": 5, "prefix_id": "a", "prefix_len": 9}', "prefix_len (9) must be <= prompt_len (5)"),
    ('{"arrival": 0, "prompt_len": 2000, "output_len": 100}', "line 2: prompt_len + output_len = 2100 exceeds --max-model-len 2048"),
    ('{"arrival": 0, "prompt_len": 50, "output_len": 5, "prefix_id": "p", "prefix_len": 20}', "line 2: prefix_len: prefix_id 'p' has prefix_len 10 at"),
    ('{"arrival": 0, "prompt_len": 5,', "line 2: not valid JSON"),
    ('[1, 2]', "line 2: expected a JSON object"),
])
def test_trace_errors_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival": 0, "prompt_len": 10, "output_len": 5, "prefix_id": "p", "prefix_len": 10}\n' + line + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path, max_model_len=2048)
    assert message in str(info.value) and str(path) in str(info.value)


def test_trace_file_problems(tmp_path):
    with pytest.raises(TraceError, match="--trace: cannot read"):
        load_trace(tmp_path / "missing.jsonl", 2048)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(tmp_path / "empty.jsonl", 2048)


def test_compare_allocators_rows():
    results = compare_allocators(synthetic_trace(80, seed=1, max_model_len=512, arrival_rate=2.0),
                                 cache_tokens=4096, max_model_len=512, block_sizes=(1, 16))
    assert [r.allocator for r in results] == ["contiguous", "contiguous-oracle", "paged b=1", "paged b=16",
                                              "paged b=16 +prefix"]
    contiguous = results[0]
    assert contiguous.mean_concurrent == 8.0  # 4096 // 512, whenever requests wait
    assert results[2].totals.internal == 0 and results[3].totals.percent("waste") < contiguous.totals.percent("waste")


# --- docs/observability.md -------------------------------------------------------------------------

def doc_block(lang):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    section = text[text.index("## KV-cache fragmentation"):]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.DOTALL)


def test_docs_library_example_runs():
    import doctest

    (example,) = doc_block("python")
    test = doctest.DocTestParser().get_doctest(example, {}, "observability.md", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_docs_trace_example_loads(tmp_path):
    (example,) = doc_block("json")
    path = tmp_path / "requests.jsonl"
    path.write_text(example)
    trace = load_trace(path, max_model_len=2048)
    assert len(trace) == 3 and trace[1].prefix_len == 200 and trace[2].max_output_len == 1024
