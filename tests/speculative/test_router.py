"""Domain routing: keywords (whole words, any case), regexes, order, default."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from accel_plugin.speculative.draft_config import DEFAULT_DOMAIN, parse_draft_config
from accel_plugin.speculative.router import DomainRouter, DomainRule

CONFIG = r"""
num_speculative_tokens: 3
domains:
  support:
    draft: /x
    match:
      keywords: [refund, order, delivery, "c++"]
      regex: ['(?i)ticket #\d+']
  code:
    draft: /y
    match: {regex: ['(?m)^\s*(def|class|import)\b']}
"""


def router() -> DomainRouter:
    return DomainRouter.from_config(parse_draft_config(CONFIG, check_paths=False))


def test_keywords_are_whole_words_case_insensitive():
    r = router()
    assert r.route("I want a Refund now") == "support"
    assert r.route("REFUND!") == "support"
    assert r.route("refunded yesterday") == DEFAULT_DOMAIN
    assert r.route("my order.") == "support"
    assert r.route("preorder it") == DEFAULT_DOMAIN


def test_keyword_with_punctuation():
    assert router().route("I write c++ daily") == "support"


def test_regex_domains():
    r = router()
    assert r.route("see Ticket #123") == "support"
    assert r.route("ticket #abc") == DEFAULT_DOMAIN
    assert r.route("def foo(x):") == "code"
    assert r.route("text first\n  import os") == "code"
    assert r.route("we define things") == DEFAULT_DOMAIN


def test_first_match_wins_in_file_order():
    r = router()
    assert r.route("def refund(order):") == "support"
    reordered = DomainRouter([r.rules[1], r.rules[0]])
    assert reordered.route("def refund(order):") == "code"


def test_default_and_domains_listing():
    r = router()
    assert r.route("") == DEFAULT_DOMAIN
    assert r.domains == ["support", "code", DEFAULT_DOMAIN]


@settings(deadline=None)  # no timing: the machine may be loaded
@given(st.text(max_size=60), st.sampled_from(["refund", "delivery", "ORDER"]))
def test_a_keyword_surrounded_by_spaces_always_routes(text, word):
    # support comes first in the file, so it wins even where code's regex matches too
    assert router().route(f"{text} {word} {text}") == "support"


@settings(deadline=None)
@given(st.lists(st.text(alphabet="abcdefgh ", min_size=1, max_size=8), min_size=1, max_size=4), st.text(max_size=40))
def test_rule_agrees_with_a_plain_reference(words, text):
    rule = DomainRule.build("d", keywords=words)
    words = [w.strip() for w in words if w.strip()]
    expected = any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text, re.IGNORECASE) for w in words)
    assert rule.matches(text) == expected
