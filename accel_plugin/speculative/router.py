"""The domain of a request, from its prompt text.

Domains are tried in the order of the YAML file; the first whose keywords or
regular expressions match the prompt wins. A prompt that matches no domain belongs
to :data:`~accel_plugin.config.DEFAULT_DOMAIN`.

Keywords match as whole words, case-insensitively (``refund`` matches "Refund
please" and "my refund.", not "refunded"); regexes are searched with ``re.search``
as written (add ``(?i)`` for case-insensitive matching, ``^`` with ``(?m)`` for the
start of any line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..config import DEFAULT_DOMAIN, DraftConfig

__all__ = ["DomainRouter", "DomainRule"]


@dataclass(frozen=True)
class DomainRule:
    """A domain and its compiled patterns (keywords become one alternation)."""

    domain: str
    patterns: tuple[re.Pattern[str], ...]

    @classmethod
    def build(cls, domain: str, keywords: Iterable[str] = (), regex: Iterable[str] = ()) -> DomainRule:
        patterns = [re.compile(p) for p in regex]
        words = [w.strip() for w in keywords if w.strip()]
        if words:
            # (?<!\w)/(?!\w) rather than \b: keywords may start or end with punctuation.
            alternation = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
            patterns.insert(0, re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE))
        return cls(domain, tuple(patterns))

    def matches(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns)


class DomainRouter:
    """``router.route(prompt) -> domain``; first matching rule wins, else the default."""

    def __init__(self, rules: Iterable[DomainRule], default: str = DEFAULT_DOMAIN):
        self.rules = tuple(rules)
        self.default = default

    @classmethod
    def from_config(cls, config: DraftConfig) -> DomainRouter:
        return cls(
            DomainRule.build(name, d.match.keywords, d.match.regex) for name, d in config.domains.items()
        )

    def route(self, text: str) -> str:
        for rule in self.rules:
            if rule.matches(text):
                return rule.domain
        return self.default

    @property
    def domains(self) -> list[str]:
        """Every domain this router can return, the default last."""
        return [r.domain for r in self.rules] + [self.default]
