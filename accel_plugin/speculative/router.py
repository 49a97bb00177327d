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

A prompt given as token ids (:meth:`DomainRouter.route_tokens`, what the proposer
calls) is detokenized only as far as that cut needs, never whole: a token decodes
to at least one UTF-8 byte (special tokens, which tokenizers skip, aside) and a
character takes at most four, so :data:`MAX_ROUTED_TOKENS` tokens always give more
than :data:`MAX_ROUTED_CHARS` characters. The router decodes
:data:`FIRST_ROUTED_TOKENS` tokens first and doubles that until the text passes
the cut (with a few characters to spare, so that a character split between two
tokens at the end of the prefix is never matched) or the prompt or the bound
ends. So one decode suffices for text of two characters a token or more, in all
it decodes fewer than four times the tokens the cut needs, and never more than
:data:`MAX_ROUTED_TOKENS` tokens in one decode, whatever the prompt's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .draft_config.schema import DEFAULT_DOMAIN, DraftConfig, compile_regex

__all__ = ["FIRST_ROUTED_TOKENS", "MAX_ROUTED_CHARS", "MAX_ROUTED_TOKENS", "DomainRouter", "DomainRule"]

#: Only this many characters at the start of a prompt are matched (about 16k tokens
#: of English): the domain shows early, and routing time stays bounded.
MAX_ROUTED_CHARS = 65536
#: characters decoded past the cut: a partly decoded last character stays beyond it
_SPARE_CHARS = 4
#: A token carries at least one UTF-8 byte and a character at most four: this many
#: tokens without special ones decode to more than ``MAX_ROUTED_CHARS + 4`` characters.
MAX_ROUTED_TOKENS = 4 * (MAX_ROUTED_CHARS + _SPARE_CHARS) + 4
#: tokens decoded in the first try: enough for text of 2 characters a token or more
#: (English is about 4), and doubled once, for 1 character a token
FIRST_ROUTED_TOKENS = (MAX_ROUTED_CHARS + _SPARE_CHARS) // 2


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

    def route_tokens(self, token_ids: Sequence[int], detokenize: Callable[[Sequence[int]], str]) -> str:
        """The domain of a prompt given as token ids, decoding no more of it than the
        :data:`MAX_ROUTED_CHARS` cut needs (see the module docstring).

        ``token_ids`` supports ``len`` and slicing (a list, a numpy array);
        ``detokenize`` gets a list of ints.
        """
        total = len(token_ids)
        take = min(total, FIRST_ROUTED_TOKENS, MAX_ROUTED_TOKENS)
        while True:
            prefix = token_ids[:take]
            text = detokenize(prefix.tolist() if hasattr(prefix, "tolist") else list(prefix))
            if take >= total or take >= MAX_ROUTED_TOKENS or len(text) >= MAX_ROUTED_CHARS + _SPARE_CHARS:
                return self.route(text)
            take = min(total, 2 * take, MAX_ROUTED_TOKENS)

    @property
    def domains(self) -> list[str]:
        """Every domain this router can return, the default last."""
        return [r.domain for r in self.rules] + [self.default]
