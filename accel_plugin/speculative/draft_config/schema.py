"""The draft-model YAML file of the domain proposer: its pydantic models.

A user maps request domains to draft models and points ``ACCEL_DRAFT_CONFIG`` at
the file (reference: docs/speculative.md)::

    num_speculative_tokens: 5          # k_max
    domains:
      support:
        draft: ./drafts/support        # a local Hugging Face model dir (safetensors)
        match:
          keywords: [refund, order, delivery]
          regex: ['(?i)ticket #\\d+']
      repeat:
        lookup: {min: 2, max: 5}       # prompt lookup: no draft model (or beside one)
        match:
          keywords: [rewrite, rephrase]
    default:
      draft: ./drafts/general          # or null: no speculation for unmatched requests
    controller:
      adaptive: true
      min_acceptance: 0.5

This module owns the schema only: unknown keys and loose types are errors, and
every key's constraints are here. Reading a file into issues with file:line is
:mod:`.loading`; draft paths, :mod:`.paths`; the checks once the target is known,
:mod:`.target`.

Regexes run on every prompt, so they are compiled with RE2 (linear time in the
prompt's length, whatever the pattern: no catastrophic backtracking); a pattern
RE2 cannot compile is refused here, and one longer than :data:`MAX_REGEX_CHARS`
too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import re2
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

__all__ = [
    "DEFAULT_DOMAIN",
    "MAX_REGEX_CHARS",
    "ControllerConfig",
    "DefaultDraftConfig",
    "DomainConfig",
    "DraftConfig",
    "LookupConfig",
    "MatchConfig",
    "compile_regex",
]

#: Name under which requests that match no domain are counted.
DEFAULT_DOMAIN = "default"
#: The longest n-gram prompt lookup matches (``lookup.max``).
MAX_LOOKUP_N = 32
#: The largest ``lookup.spec_factor`` (drafts per matched token).
MAX_SPEC_FACTOR = 32.0
#: The longest ``match.regex`` pattern accepted, in characters.
MAX_REGEX_CHARS = 1000
#: What a pattern may use, for the message that refuses one.
_RE2_SYNTAX = (
    "patterns are compiled with RE2 (linear time, https://github.com/google/re2/wiki/Syntax): "
    "no backreferences (\\1, (?P=name)), lookarounds ((?=, (?!, (?<=, (?<!), atomic groups, "
    "possessive quantifiers or (?x); inline flags (?i) (?m) (?s) (?U), named groups (?P<name>...), "
    "\\pL-style Unicode classes and repetition counts up to 1000 are supported; write Python's \\Z as \\z"
)


def compile_regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (a ``re2._Regexp``: ``.search(text)`` as ``re``).

    Raises :class:`ValueError` naming the pattern, the reason and what RE2 supports.
    """
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(
            f"regex of {len(pattern)} characters is too long (at most {MAX_REGEX_CHARS}); "
            "list words under keywords instead of one long alternation"
        )
    options = re2.Options()
    options.log_errors = False  # the error is raised, with the pattern, not printed by RE2
    options.never_capture = True  # groups are not read: only whether a prompt matches
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"regex {pattern!r} cannot be used: {reason}; {_RE2_SYNTAX}") from None


def _checked_regex(pattern: str) -> str:
    compile_regex(pattern)
    return pattern


def _non_blank(word: str) -> str:
    if not word.strip():
        raise ValueError("keywords must not be empty strings")
    return word


class _Strict(BaseModel):
    """Unknown keys and loose types (``"5"`` for 5, ``1`` for true) are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MatchConfig(_Strict):
    """How a prompt is recognised as belonging to a domain (either rule suffices)."""

    #: whole words, matched case-insensitively anywhere in the prompt
    keywords: list[Annotated[str, AfterValidator(_non_blank)]] = Field(default_factory=list)
    #: RE2 regular expressions (:func:`compile_regex`), searched in the prompt
    regex: list[Annotated[str, AfterValidator(_checked_regex)]] = Field(default_factory=list)


class LookupConfig(_Strict):
    """Prompt lookup (:mod:`~accel_plugin.speculative.lookup`): drafts copied from the
    request's own context after its longest suffix n-gram of ``min..max`` tokens that
    occurred earlier (vLLM's ``prompt_lookup_min`` / ``prompt_lookup_max``)."""

    min: int = Field(default=2, ge=1, le=MAX_LOOKUP_N)
    max: int = Field(default=5, ge=1, le=MAX_LOOKUP_N)
    #: which earlier occurrence's continuation is proposed (vLLM: the earliest)
    occurrence: Literal["earliest", "latest"] = "earliest"
    #: at most ``spec_factor * n`` drafts for a match of ``n`` tokens (suffix decoding's
    #: ``max_spec_factor``); unset: k drafts whatever the match (vLLM's n-gram)
    spec_factor: float | None = Field(default=None, gt=0, le=MAX_SPEC_FACTOR)

    def describe(self) -> str:
        """``2-5``; ``1-8 latest x1``: n-gram sizes, the occurrence if not the earliest, spec_factor if set."""
        latest = " latest" if self.occurrence == "latest" else ""
        factor = "" if self.spec_factor is None else f" x{self.spec_factor:g}"
        return f"{self.min}-{self.max}{latest}{factor}"

    @model_validator(mode="after")
    def _min_within_max(self) -> LookupConfig:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max}): n-grams of min..max tokens are matched")
        return self


_NEEDS_A_DRAFTER = ("needs a draft (a draft model directory), a lookup (prompt lookup, e.g. "
                    "lookup: {min: 2, max: 5}), or both")


class DomainConfig(_Strict):
    """One domain: its draft model and/or prompt lookup, and how its requests are recognised."""

    match: MatchConfig
    draft: str | None = None
    #: prompt lookup; with a draft too, rows whose context has a match use the lookup
    lookup: LookupConfig | None = None
    #: a smaller k_max for this domain (default: the top-level num_speculative_tokens)
    num_speculative_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _has_a_rule(self) -> DomainConfig:
        if not self.match.keywords and not self.match.regex:
            raise ValueError("match needs at least one keyword or regex, or no request would reach this domain")
        if self.draft is None and self.lookup is None:
            raise ValueError(_NEEDS_A_DRAFTER)
        return self


class DefaultDraftConfig(_Strict):
    """Requests that match no domain: a draft and/or prompt lookup, or neither (no speculation)."""

    draft: str | None = None
    lookup: LookupConfig | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1)


class ControllerConfig(_Strict):
    """The acceptance controller (see docs/speculative.md, "How k is chosen")."""

    #: false: always draft k_max tokens (a fixed-k baseline)
    adaptive: bool = True
    #: a domain whose windowed acceptance falls below this drafts nothing (0 = the
    #: speedup formula alone decides)
    min_acceptance: float = Field(default=0.0, ge=0.0, le=1.0)
    #: how many recent (request, step) observations the acceptance estimate uses
    window: int = Field(default=256, ge=1)
    #: observations needed before the controller leaves warm-up for its own choice
    min_samples: int = Field(default=16, ge=1)
    #: tokens drafted per request during warm-up (at most the domain's k_max): low, so
    #: that a poor draft costs little before it is found out
    warmup_k: int = Field(default=2, ge=1)
    #: a switched-off domain drafts ``probe_k`` tokens for one request once every ``probe_interval`` steps
    probe_interval: int = Field(default=32, ge=1)
    probe_k: int = Field(default=1, ge=1)
    #: a fixed draft/target cost ratio c instead of the measured one
    draft_cost: float | None = Field(default=None, gt=0.0)
    #: a fixed verification overhead v (extra time of a target step that verifies
    #: drafts, as a fraction of a plain step) instead of the measured one
    verify_overhead: float | None = Field(default=None, ge=0.0)
    #: k is kept only when its predicted speedup is at least this (1.0 = break-even;
    #: below 1.0 would mean speculating when it is predicted to be slower)
    min_speedup: float = Field(default=1.0, ge=1.0)
    #: an off domain goes on only when its predicted speedup reaches
    #: ``min_speedup * (1 + hysteresis)``; an on one goes off below ``min_speedup``
    hysteresis: float = Field(default=0.05, ge=0.0)
    #: consecutive decisions that must agree before a domain is switched on or off
    switch_after: int = Field(default=8, ge=1)
    #: one target step in this many is run without drafts (per batch size) to time a
    #: plain step next to verifying ones, when none happens by itself (0 = never)
    calibration_interval: int = Field(default=64, ge=0)
    #: seconds between two log lines with the per-domain counters (0 = never)
    log_interval_s: float = Field(default=30.0, ge=0.0)
    #: the measured step gate (docs/speculative.md, "The step gate"): per batch size,
    #: tokens/s of drafting cycles against adjacent plain ones; false = per-domain decisions alone
    step_gate: bool = True
    #: samples of the measured step speedup kept per batch size and domain mix (the gate reads their
    #: mean token gain times their median time ratio)
    gate_window: int = Field(default=16, ge=1)
    #: samples a batch size and domain mix need before the gate gives a verdict there
    gate_min_samples: int = Field(default=4, ge=1)
    #: consecutive samples that must agree before the gate switches a batch size and mix on or off
    gate_switch_after: int = Field(default=2, ge=1)
    #: a batch size the gate switched off drafts again (two steps: catch-up, then measured)
    #: after this many of its steps times its batch bucket (at most 8); doubled after each
    #: probe that left it off, at most 4x (4x at once after a whole batch switched it off)
    gate_probe_interval: int = Field(default=16, ge=3)

    @model_validator(mode="after")
    def _samples_fit_window(self) -> ControllerConfig:
        if self.min_samples > self.window:
            raise ValueError(
                f"min_samples ({self.min_samples}) must not exceed window ({self.window}): "
                "the estimate would never have enough samples and the controller would stay at k_max"
            )
        if self.gate_min_samples > self.gate_window:
            raise ValueError(
                f"gate_min_samples ({self.gate_min_samples}) must not exceed gate_window ({self.gate_window}): "
                "the step gate would never have enough samples for a verdict"
            )
        return self

    @field_validator("calibration_interval")
    @classmethod
    def _calibration_leaves_room(cls, value: int) -> int:
        if value == 1:
            raise ValueError("must be 0 (never) or at least 2 (1 would make every step a plain one)")
        return value


class DraftConfig(_Strict):
    """The whole YAML file."""

    num_speculative_tokens: int = Field(ge=1)
    domains: dict[str, DomainConfig] = Field(default_factory=dict)
    default: DefaultDraftConfig = Field(default_factory=DefaultDraftConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    #: drafts only: allows a draft with custom code (auto_map), passed to transformers
    #: when a draft's tokenizer is loaded; never applies to the target (the framework's
    #: own setting does)
    trust_remote_code: bool = False
    #: dtype of the draft forward; auto = the target's dtype
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"

    # Where the YAML came from, for messages of later checks (check_against_target).
    _file: str | None = PrivateAttr(default=None)
    _lines: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _ks_within_k_max(self) -> DraftConfig:
        k_max = self.num_speculative_tokens
        entries = [(f"domains.{n}.num_speculative_tokens", d.num_speculative_tokens) for n, d in self.domains.items()]
        entries.append(("default.num_speculative_tokens", self.default.num_speculative_tokens))
        entries.append(("controller.probe_k", self.controller.probe_k))
        for key, value in entries:
            if value is not None and value > k_max:
                raise ValueError(f"{key} ({value}) must not exceed num_speculative_tokens ({k_max})")
        return self

    @field_validator("domains")
    @classmethod
    def _domain_names(cls, value: dict[str, DomainConfig]) -> dict[str, DomainConfig]:
        if DEFAULT_DOMAIN in value:
            raise ValueError(f"{DEFAULT_DOMAIN!r} is reserved for unmatched requests; use the top-level 'default' key")
        for name in value:
            if name.endswith("/lookup"):
                raise ValueError(f"domain name {name!r}: names ending in '/lookup' are reserved for the "
                                 "prompt-lookup entries of the per-domain counters; rename it")
        return value

    def k_max(self, domain: str) -> int:
        """k_max of ``domain`` (a domain may lower, never raise, the global one: validated)."""
        entry = self.default if domain == DEFAULT_DOMAIN else self.domains[domain]
        return entry.num_speculative_tokens or self.num_speculative_tokens

    def lookups(self) -> dict[str, LookupConfig]:
        """Domain name -> its prompt lookup, for the domains (and default) that have one."""
        out = {name: d.lookup for name, d in self.domains.items() if d.lookup is not None}
        if self.default.lookup is not None:
            out[DEFAULT_DOMAIN] = self.default.lookup
        return out

    def describe(self) -> str:
        """One line for the start-up log: ``support->/path+lookup(2-5), default->none``."""
        lookups = self.lookups()
        parts = []
        for name, draft in self.drafts().items():
            lookup = lookups.get(name)
            drafter = "+".join(filter(None, [draft, lookup and f"lookup({lookup.describe()})"]))
            parts.append(f"{name}->{drafter or 'none'}")
        return ", ".join(parts)

    def drafts(self) -> dict[str, str | None]:
        """Domain name -> draft directory (``None``: no speculation), default last."""
        out: dict[str, str | None] = {name: d.draft for name, d in self.domains.items()}
        out[DEFAULT_DOMAIN] = self.default.draft
        return out
