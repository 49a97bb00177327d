"""The domain of a request, from its prompt text.

Domains are tried in the order of the YAML file; the first whose keywords or
regular expressions match the prompt wins. A prompt that matches no domain belongs
to :data:`~accel_plugin.speculative.draft_config.schema.DEFAULT_DOMAIN`.

Keywords match as whole words, case-insensitively (``refund`` matches "Refund
please" and "my refund.", not "refunded"); regexes are searched as written (add
``(?i)`` for case-insensitive matching, ``^`` with ``(?m)`` for the start of any
line).

Routing runs on every new request, so its cost is bounded whatever the YAML says:
regexes run on RE2 (:func:`~accel_plugin.speculative.draft_config.schema.compile_regex`: linear time, no
backtracking; ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII there, ``\\pL`` is any
letter), keywords are escaped literals (no backtracking either), and only the
first :data:`MAX_ROUTED_CHARS` characters of a prompt are matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .draft_config.schema import DEFAULT_DOMAIN, DraftConfig, compile_regex

__all__ = ["MAX_ROUTED_CHARS", "DomainRouter", "DomainRule"]

#: Only this many characters at the start of a prompt are matched (about 16k tokens
#: of English): the domain shows early, and routing time stays bounded.
MAX_ROUTED_CHARS = 65536


@dataclass(frozen=True)
class DomainRule:
    """A domain and its compiled patterns (keywords become one alternation)."""

    domain: str
    #: ``re.Pattern`` (the keywords) and RE2 patterns: both have ``search(text)``
    patterns: tuple[Any, ...]

    @classmethod
    def build(cls, domain: str, keywords: Iterable[str] = (), regex: Iterable[str] = ()) -> DomainRule:
        """Raises :class:`ValueError` for a regex RE2 cannot run (the YAML loader has
        already refused those, with file and line)."""
        patterns = [compile_regex(p) for p in regex]
        words = [w.strip() for w in keywords if w.strip()]
        if words:
            # (?<!\w)/(?!\w) rather than \b: keywords may start or end with punctuation.
            # Python's re (RE2 has no lookarounds): literals only, so no backtracking.
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
        """The domain of a prompt, from its first :data:`MAX_ROUTED_CHARS` characters."""
        text = text[:MAX_ROUTED_CHARS]
        for rule in self.rules:
            if rule.matches(text):
                return rule.domain
        return self.default

    @property
    def domains(self) -> list[str]:
        """Every domain this router can return, the default last."""
        return [r.domain for r in self.rules] + [self.default]
