"""KV-cache accounting: exact numbers of the pure functions, their properties, the docs' library example."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.observability.kv_accounting import Usage, contiguous_usage, paged_usage

SETTINGS = settings(max_examples=40, deadline=None, database=None)


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
