"""Routing cost is bounded whatever the YAML says: RE2 regexes, a scan limit."""

from __future__ import annotations

import pytest

from accel_plugin.speculative.draft_config import DEFAULT_DOMAIN, DraftConfigError, parse_draft_config
from accel_plugin.speculative.router import MAX_ROUTED_CHARS, DomainRouter, DomainRule


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
