"""Routing cost is bounded whatever the YAML says: RE2 regexes, a scan limit, and a
prompt given as token ids decoded only as far as that limit needs."""

from __future__ import annotations

import numpy as np
import pytest

from accel_plugin.speculative.draft_config import DEFAULT_DOMAIN, DraftConfigError, parse_draft_config
from accel_plugin.speculative.router import (
    FIRST_ROUTED_TOKENS,
    MAX_ROUTED_CHARS,
    MAX_ROUTED_TOKENS,
    DomainRouter,
    DomainRule,
)


def router_for(*regexes: str, keywords: tuple[str, ...] = ("refund",)) -> DomainRouter:
    listed = ", ".join(f"'{r}'" for r in regexes)
    config = parse_draft_config(
        "num_speculative_tokens: 3\n"
        "domains:\n"
        f"  evil: {{draft: /x, match: {{regex: [{listed}]}}}}\n"
        f"  support: {{draft: /y, match: {{keywords: [{', '.join(keywords)}]}}}}\n",
        check_paths=False,
    )
    return DomainRouter.from_config(config)


# Python's re needs about 2**n steps for these on n adversarial characters: minutes
# at n = 30, and far more here. RE2 is linear; no timing is asserted, only that the
# calls return and route as the patterns say.
@pytest.mark.parametrize(
    ("pattern", "adversarial", "matching"),
    [
        ("(a+)+$", "a" * 20_000 + "!", "x " + "a" * 20_000),
        ("^(a|aa)+$", "a" * 20_000 + "b", "a" * 20_000),
        ("(x+x+)+y", "x" * 20_000, "x" * 20_000 + "y"),
        ("(\\w+\\s?)+\\.$", "word " * 5_000 + "!", "word " * 5_000 + "end."),
        ("(.*a){20}", "a" * 19 + "b" * 30_000, "ba" * 20),
    ],
)
def test_catastrophic_patterns_finish_and_route(pattern, adversarial, matching):
    r = router_for(pattern)
    assert r.route(adversarial) == DEFAULT_DOMAIN
    assert r.route(matching) == "evil"
    assert r.route("refund " + adversarial) == "support"


def test_many_adversarial_prompts_in_a_row():
    r = router_for("(a+)+$", "^(a|a?)+$")
    prompt = ("a" * 60 + "!") * 1_000  # 61k characters, each run a fresh backtracking trap
    for _ in range(20):
        assert r.route(prompt) == DEFAULT_DOMAIN


def test_only_the_first_max_routed_chars_are_matched():
    r = router_for("never")
    padding = "z" * (MAX_ROUTED_CHARS - len(" refund"))
    assert r.route(padding + " refund") == "support"
    assert r.route(padding + "z refund") == DEFAULT_DOMAIN


@pytest.mark.parametrize(
    ("pattern", "hit", "miss"),
    [
        ("(?i)ticket #\\d+", "TICKET #42", "ticket #x"),
        ("(?m)^def ", "text\ndef f():", "text def f():"),
        ("^def ", "def f():", "text\ndef f():"),
        ("(?s)begin.*end", "begin\n\nend", "begin only"),
        ("(?i)straße", "STRASSE? no: STRAßE", "strasse"),
        ("(?i)émile", "ÉMILE", "emile"),
        ("\\pL+ \\d{4}", "année 2024", "!!! 2024"),
        ("(?U)a+b", "aaab", "aaa"),
    ],
)
def test_flags_and_unicode_still_work(pattern, hit, miss):
    rule = DomainRule.build("d", regex=[pattern])
    assert rule.matches(hit)
    assert not rule.matches(miss)


def test_backreference_refused_by_the_loader_and_by_the_rule():
    with pytest.raises(DraftConfigError) as info:
        router_for("(ab)\\1")
    (issue,) = info.value.issues
    assert issue.key == "domains.evil.match.regex.0" and issue.line == 3
    assert "regex '(ab)\\\\1' cannot be used: invalid escape sequence: \\1" in issue.message
    assert "no backreferences" in issue.message
    with pytest.raises(ValueError, match="cannot be used"):
        DomainRule.build("d", regex=["(?<=a)b"])


class SpyDetokenize:
    """Decodes token ``t`` to ``chars[t]``; records how many tokens each call decoded."""

    def __init__(self, chars: dict[int, str]):
        self.chars, self.calls = chars, []

    def __call__(self, ids):
        assert isinstance(ids, list)
        self.calls.append(len(ids))
        return "".join(self.chars[t] for t in ids)


def test_token_prompts_decode_only_the_prefix_the_cut_needs():
    r = router_for("never")
    spy = SpyDetokenize({1: "abcd", 2: " refund "})
    total = 1_000_000  # 4M characters: the cut needs 16k tokens of them, the first try has 32k
    ids = np.ones(total, dtype=np.int64)
    assert r.route_tokens(ids, spy) == DEFAULT_DOMAIN
    assert spy.calls == [FIRST_ROUTED_TOKENS]
    assert max(spy.calls) * 4 >= MAX_ROUTED_CHARS
    ids[100] = 2
    assert r.route_tokens(ids, spy) == "support"


def test_token_prompts_route_like_their_text_at_the_cut():
    r = router_for("never")
    spy = SpyDetokenize({1: "z", 2: " refund", 3: "é"})
    # one character a token: the first try is too short, the second (twice as long) passes the cut
    before = [1] * (MAX_ROUTED_CHARS - len(" refund")) + [2] + [1] * 10
    after = [1] * (MAX_ROUTED_CHARS - len(" refund") + 1) + [2] + [1] * 10
    for ids in (before, after):
        text = spy(ids)
        spy.calls.clear()
        assert r.route_tokens(ids, spy) == r.route(text)
        assert spy.calls == [FIRST_ROUTED_TOKENS, 2 * FIRST_ROUTED_TOKENS]
    assert r.route_tokens(before, spy) == "support" and r.route_tokens(after, spy) == DEFAULT_DOMAIN
    spy.calls.clear()
    short = [3] * 50 + [2]  # a short prompt is decoded whole, once
    assert r.route_tokens(short, spy) == "support" and spy.calls == [51]


def test_tokens_that_decode_to_nothing_stop_at_the_bound():
    r = router_for("never")
    spy = SpyDetokenize({0: "", 2: " refund"})
    ids = [0] * (2 * MAX_ROUTED_TOKENS) + [2]  # special tokens only, then the keyword
    assert r.route_tokens(ids, spy) == DEFAULT_DOMAIN
    assert max(spy.calls) == MAX_ROUTED_TOKENS
    assert sum(spy.calls) < 3 * MAX_ROUTED_TOKENS  # doubling up to the bound
