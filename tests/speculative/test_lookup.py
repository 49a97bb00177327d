"""Prompt lookup (accel_plugin.speculative.lookup): the incremental n-gram index against a
brute-force search over the whole context, and against vLLM's own n-gram search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.speculative.lookup import NgramIndex, lookup_entry


def brute_force_match(tokens: list[int], min_n: int, max_n: int,
                      occurrence: str = "earliest") -> tuple[int, int] | None:
    """The definition: the longest suffix n-gram that occurred earlier (starting before the
    suffix, one token at least after it); ``(where the tokens after its earliest/latest
    occurrence start, n)``."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if length < n + 1:
            continue
        suffix = tokens[length - n:]
        starts = [s for s in range(length - n) if tokens[s: s + n] == suffix]
        if starts:
            return (starts[0] if occurrence == "earliest" else starts[-1]) + n, n
    return None


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int, occurrence: str = "earliest",
                spec_factor: float | None = None) -> list[int]:
    """The k tokens after :func:`brute_force_match` (at most ``spec_factor * n``, 1 at least)."""
    found = brute_force_match(tokens, min_n, max_n, occurrence)
    if found is None:
        return []
    start, n = found
    most = k if spec_factor is None else min(k, max(1, int(spec_factor * n)))
    return tokens[start: start + most]


contexts = st.lists(st.integers(0, 3), min_size=0, max_size=120)  # a small vocabulary: many matches
sizes = st.tuples(st.integers(1, 4), st.integers(0, 3)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=300, deadline=None)
@given(tokens=contexts, size=sizes, k=st.integers(1, 6), occurrence=st.sampled_from(["earliest", "latest"]),
       cuts=st.lists(st.integers(0, 120), max_size=6))
def test_incremental_index_proposes_what_a_whole_context_search_does(tokens, size, k, occurrence, cuts):
    """Fed in steps (cuts: where a step ends, the prompt first), the index proposes after
    every step what the brute-force search over the whole context does."""
    min_n, max_n = size
    index = NgramIndex(min_n, max_n, occurrence)
    context = np.asarray(tokens, dtype=np.int64)
    for end in sorted({*(c for c in cuts if c <= len(tokens)), len(tokens)}):
        got = index.propose(context[:end], k)
        assert got == brute_force(tokens[:end], min_n, max_n, k, occurrence), (tokens[:end], size, k)
        assert index.find(context[:end]) == brute_force_match(tokens[:end], min_n, max_n, occurrence)
        assert index.indexed == end


def test_a_step_indexes_only_the_new_tokens():
    index = NgramIndex(2, 4)
    context = np.arange(1000, dtype=np.int64) % 50
    index.update(context[:990])
    before = {n: len(d) for n, d in index._follow.items()}
    index.update(context)
    assert index.indexed == 1000
    # the n-grams of 10 new positions, at most: nothing of the first 990 was visited again
    assert all(len(d) - before[n] <= 10 for n, d in index._follow.items())


def test_examples():
    index = NgramIndex(2, 3)
    #             0  1  2  3  4  5  6  7  8
    context = np.array([5, 6, 7, 8, 9, 5, 6, 7], dtype=np.int64)
    assert index.propose(context, 3) == [8, 9, 5]  # "5 6 7" occurred at 0, followed by 8 9 5
    assert index.propose(np.array([1, 2, 3], dtype=np.int64), 3) == []
    assert NgramIndex(1, 1).propose(np.array([4, 4], dtype=np.int64), 5) == [4]  # up to the context's end
    assert lookup_entry("support") == "support/lookup"


@pytest.mark.parametrize("min_n, max_n, occurrence, match", [
    (0, 3, "earliest", "min_n"), (3, 2, "earliest", "min_n"), (1, 2, "first", "'earliest' or 'latest'"),
])
def test_bad_arguments(min_n, max_n, occurrence, match):
    with pytest.raises(ValueError, match=match):
        NgramIndex(min_n, max_n, occurrence)


def test_same_proposals_as_vllms_ngram_search():
    """vLLM's own search (KMP over the reversed context) on random contexts: equal proposals."""
    ngram = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer", reason="needs vLLM")
    rng = np.random.default_rng(0)
    for trial in range(300):
        tokens = rng.integers(0, 4, size=int(rng.integers(1, 80))).astype(np.int64)
        min_n = int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 3))
        k = int(rng.integers(1, 6))
        want = ngram._find_longest_matched_ngram_and_propose_tokens(tokens, min_n, max_n, 10_000, k).tolist()
        assert NgramIndex(min_n, max_n).propose(tokens, k) == want, (tokens.tolist(), min_n, max_n, k)


# ------------------------------------------------------------------ in the proposer

def _verifier():
    import importlib.util
    import sys
    from pathlib import Path

    name = "accel_tests_verifier"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("verifier.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _served(make_config, tokenizer, target, yaml_text, texts, domains, max_tokens=20):
    from accel_plugin.speculative import DomainProposer

    v = _verifier()
    proposer = DomainProposer(make_config(yaml_text), lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                              max_len=v.MAX_LEN)
    requests = [v.Request(tokenizer(t).input_ids, max_tokens, d) for t, d in zip(texts, domains)]
    trace = v.serve(proposer, target, requests, shuffle=3)
    v.assert_lossless(target, requests)
    return proposer, requests, trace


def _expected_by_entry(trace, entry_of_proposal) -> dict[str, tuple[int, int, int]]:
    """(steps, drafted, accepted) per controller entry: a request's verifications in order
    are those of its proposals with drafts, in order."""
    proposals: dict[int, list] = {}
    for p in trace.proposals:
        if p.sampled and p.drafts:
            proposals.setdefault(id(p.request), []).append(p)
    seen: dict[int, int] = {}
    out: dict[str, tuple[int, int, int]] = {}
    for v in trace.verifications:
        j = seen.get(id(v.request), 0)
        seen[id(v.request)] = j + 1
        if v.seen:
            entry = entry_of_proposal(proposals[id(v.request)][j])
            steps, drafted, accepted = out.get(entry, (0, 0, 0))
            out[entry] = (steps + 1, drafted + v.drafted, accepted + v.accepted)
    return out


REPEAT = ["Rewrite this: the cat sat on the mat and the cat sat on the mat", "Rewrite: a b c a b c a b"]


def test_a_lookup_only_domain_drafts_the_lookup_proposals(make_config, tokenizer, target):
    proposer, _, trace = _served(make_config, tokenizer, target, """
        num_speculative_tokens: 4
        domains:
          repeat:
            lookup: {min: 1, max: 3}
            match: {keywords: [rewrite]}
        controller: {adaptive: false}
    """, REPEAT + ["no match here"], ["repeat", "repeat", "default"])
    v = _verifier()
    drafted = 0
    for p in trace.proposals:
        if not p.sampled or p.request.domain != "repeat":
            assert p.drafts == [] or not p.sampled
            continue
        want = brute_force(p.context, 1, 3, min(4, v.MAX_LEN - len(p.context)))
        assert p.drafts == want, (p.context, p.drafts, want)
        drafted += bool(want)
    assert drafted > 5
    stats = proposer.stats()
    assert set(stats) == {"repeat", "repeat/lookup", "default"}
    assert stats["repeat/lookup"].draft == "lookup" and stats["repeat"].drafted == 0
    expected = _expected_by_entry(trace, lambda p: "repeat/lookup")
    assert (stats["repeat/lookup"].steps, stats["repeat/lookup"].drafted, stats["repeat/lookup"].accepted) \
        == expected["repeat/lookup"]
    assert stats["repeat/lookup"].draft_forward_ms is not None  # its cost is measured (c of its own)
    assert not any(proposer.controller._domains["repeat/lookup"].window.offered)  # no spec_factor: k for all


def test_spec_factor_drafts_at_most_that_many_tokens_per_matched_token(make_config, tokenizer, target):
    """``lookup.spec_factor``: a match of n tokens drafts at most ``spec_factor * n`` (1 at
    least), k at most; the matched length is the longest suffix n-gram's."""
    import time

    began = time.perf_counter()
    proposer, _, trace = _served(make_config, tokenizer, target, """
        num_speculative_tokens: 5
        domains:
          repeat:
            lookup: {min: 1, max: 4, occurrence: latest, spec_factor: 1.5}
            match: {keywords: [rewrite]}
        controller: {adaptive: false}
    """, REPEAT, ["repeat", "repeat"], max_tokens=24)
    assert 0 < proposer.propose_seconds < time.perf_counter() - began  # its own time, not a clock reading
    v = _verifier()
    capped = 0
    for p in trace.proposals:
        if p.sampled:
            k = min(5, v.MAX_LEN - len(p.context))
            want = brute_force(p.context, 1, 4, k, "latest", spec_factor=1.5)
            assert p.drafts == want, (p.context, p.drafts, want)
            capped += len(brute_force(p.context, 1, 4, k, "latest")) > len(want)
    assert capped > 5, capped  # the random target's 1-token matches: 1 draft, not 5
    window = proposer.controller._domains["repeat/lookup"].window  # every row's offer read with it
    assert sum(window.offered) == len(window) > 5 and window.offered[0]  # 1-token matches: offered 1


@pytest.mark.parametrize("spec_factor, mosts", [(None, [None, None, None]), (1.5, [1, 3, 6]), (0.4, [1, 1, 1])])
def test_match_rows_gives_the_most_tokens_per_match_length(make_config, spec_factor, mosts):
    from types import SimpleNamespace

    from accel_plugin.speculative.lookup import PromptLookup

    factor = "null" if spec_factor is None else spec_factor
    cfg = make_config(f"""
        num_speculative_tokens: 5
        domains:
          repeat: {{lookup: {{min: 1, max: 4, spec_factor: {factor}}}, match: {{keywords: [rewrite]}}}}
    """)
    lookup = PromptLookup(cfg.lookups())
    #            a match of 1 token,   of 2,                of 4 (the longest of 1..4)
    contexts = [[7, 1, 2, 3, 7], [7, 8, 1, 2, 7, 8], [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]]
    rows = [(i, SimpleNamespace(domain="repeat", lookup=None, context=np.array(c, dtype=np.int64)))
            for i, c in enumerate(contexts)]
    assert lookup.match_rows(rows) == {0: (1, mosts[0]), 1: (2, mosts[1]), 2: (4, mosts[2])}


def test_draft_and_lookup_rows_draft_with_lookup_on_a_match_else_the_draft(make_config, tokenizer, target,
                                                                          target_dir):
    proposer, _, trace = _served(make_config, tokenizer, target, f"""
        num_speculative_tokens: 3
        domains:
          support:
            draft: {target_dir}
            lookup: {{min: 2, max: 2}}
            match: {{keywords: [rewrite, order]}}
        controller: {{adaptive: false}}
    """, REPEAT + ["my order 12345 please", "order status for 987"], ["support"] * 4, max_tokens=24)
    v = _verifier()
    kinds = {"lookup": 0, "draft": 0}

    def entry_of(p):
        return "support/lookup" if brute_force(p.context, 2, 2, 3) else "support"

    for p in trace.proposals:
        if not p.sampled:
            continue
        k = min(3, v.MAX_LEN - len(p.context))
        lookup = brute_force(p.context, 2, 2, k)
        if lookup:
            assert p.drafts == lookup, (p.context, p.drafts)
            kinds["lookup"] += 1
        else:
            assert len(p.drafts) == k  # the draft model's (the target itself: checked by acceptance below)
            kinds["draft"] += 1
    assert kinds["lookup"] and kinds["draft"], kinds
    stats = proposer.stats()
    expected = _expected_by_entry(trace, entry_of)
    for entry in ("support", "support/lookup"):
        s = stats[entry]
        assert (s.steps, s.drafted, s.accepted) == expected.get(entry, (0, 0, 0)), entry
    # the draft is the target: all its drafts are accepted (so acceptance was not mixed up)
    assert stats["support"].accepted == stats["support"].drafted > 0


def test_an_off_lookup_entry_beside_a_draft_still_probes(make_config, tokenizer, target, target_dir):
    """Rows whose lookup entry is off draft with the draft model; the lookup entry's steps
    still count towards its probe, or it could never be measured, and switched on, again."""
    from accel_plugin.speculative import DomainProposer
    from accel_plugin.speculative.controller import DomainState
    from accel_plugin.speculative.entries import Choice

    v = _verifier()
    proposer = DomainProposer(make_config(f"""
        num_speculative_tokens: 3
        domains:
          support:
            draft: {target_dir}
            lookup: {{min: 1, max: 2}}
            match: {{keywords: [rewrite]}}
        controller: {{probe_interval: 2, step_gate: false, min_acceptance: 1.0}}
    """), lambda ids: tokenizer.decode(ids, skip_special_tokens=True), max_len=v.MAX_LEN)
    proposer.controller._domains["support/lookup"].choices[1] = Choice(DomainState.OFF, 0)
    requests = [v.Request(tokenizer(REPEAT[0]).input_ids, 24, "support")]
    v.serve(proposer, target, requests)
    v.assert_lossless(target, requests)
    stats = proposer.stats()
    assert stats["support/lookup"].drafted > 0, stats["support/lookup"]  # its probes
    assert stats["support"].drafted > 0  # the draft serves the other steps
