"""The draft-model YAML file of the domain proposer: pydantic models and a loader.

A user maps request domains to draft models and points ``ACCEL_DRAFT_CONFIG`` at
the file (reference: docs/speculative.md)::

    num_speculative_tokens: 5          # k_max
    domains:
      support:
        draft: ./drafts/support        # a local Hugging Face model dir (safetensors)
        match:
          keywords: [refund, order, delivery]
          regex: ['(?i)ticket #\\d+']
    default:
      draft: ./drafts/general          # or null: no speculation for unmatched requests
    controller:
      adaptive: true
      min_acceptance: 0.5

:func:`load_draft_config` reads and validates the file; every problem it finds
(unknown keys, wrong types, regexes RE2 cannot run, keys that would be ignored,
missing model directories, weights that are not safetensors) is collected into one
:class:`DraftConfigError` whose lines name the file, the line and the key.
:func:`check_against_target` is the second half of start-up validation, once the
target model is known: vocabulary and tokenizer compatibility, and
``num_speculative_tokens`` against the framework's.

``draft`` paths: ``~`` is expanded, a relative path is taken relative to the YAML
file's folder (not the server's working directory), and the result is resolved
once (symlinks, ``..``) into the absolute path that is loaded and logged.

Regexes run on every prompt, so they are compiled with RE2 (linear time in the
prompt's length, whatever the pattern: no catastrophic backtracking); a pattern
RE2 cannot compile is refused here, and one longer than :data:`MAX_REGEX_CHARS`
too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import re2
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ...models.dirs import SUPPORTED_ARCHITECTURES, ModelDirError, TargetVocabulary, check_draft_dir

__all__ = [
    "DEFAULT_DOMAIN",
    "MAX_REGEX_CHARS",
    "SUPPORTED_ARCHITECTURES",
    "ConfigIssue",
    "ControllerConfig",
    "DefaultDraftConfig",
    "DomainConfig",
    "DraftConfig",
    "DraftConfigError",
    "MatchConfig",
    "check_against_target",
    "compile_regex",
    "load_draft_config",
    "parse_draft_config",
]

#: Name under which requests that match no domain are counted.
DEFAULT_DOMAIN = "default"
#: The longest ``match.regex`` pattern accepted, in characters.
MAX_REGEX_CHARS = 1000
#: What a pattern may use, for the message that refuses one.
_RE2_SYNTAX = (
    "patterns are compiled with RE2 (linear time, https://github.com/google/re2/wiki/Syntax): "
    "no backreferences (\\1, (?P=name)), lookarounds ((?=, (?!, (?<=, (?<!), atomic groups, "
    "possessive quantifiers or (?x); inline flags (?i) (?m) (?s) (?U), named groups (?P<name>...), "
    "\\pL-style Unicode classes and repetition counts up to 1000 are supported; write Python's \\Z as \\z"
)

_logger = logging.getLogger(__name__)


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


class DomainConfig(_Strict):
    """One domain: its draft model and how its requests are recognised."""

    draft: str
    match: MatchConfig
    #: a smaller k_max for this domain (default: the top-level num_speculative_tokens)
    num_speculative_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _has_a_rule(self) -> DomainConfig:
        if not self.match.keywords and not self.match.regex:
            raise ValueError("match needs at least one keyword or regex, or no request would reach this domain")
        return self


class DefaultDraftConfig(_Strict):
    """Requests that match no domain: a draft, or ``null`` for no speculation."""

    draft: str | None = None
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

    @model_validator(mode="after")
    def _samples_fit_window(self) -> ControllerConfig:
        if self.min_samples > self.window:
            raise ValueError(
                f"min_samples ({self.min_samples}) must not exceed window ({self.window}): "
                "the estimate would never have enough samples and the controller would stay at k_max"
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
        return value

    def k_max(self, domain: str) -> int:
        """k_max of ``domain`` (a domain may lower, never raise, the global one: validated)."""
        entry = self.default if domain == DEFAULT_DOMAIN else self.domains[domain]
        return entry.num_speculative_tokens or self.num_speculative_tokens

    def drafts(self) -> dict[str, str | None]:
        """Domain name -> draft directory (``None``: no speculation), default last."""
        out: dict[str, str | None] = {name: d.draft for name, d in self.domains.items()}
        out[DEFAULT_DOMAIN] = self.default.draft
        return out


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: the key path (``domains.code.draft``), a message, where it is."""

    key: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.key or '(top level)'}: {self.message}"


class DraftConfigError(ValueError):
    """The draft YAML cannot be used; ``issues`` lists every problem found."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = issues
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"invalid draft config ({len(issues)} problem(s)):\n{lines}")


# ------------------------------------------------------------------ line numbers


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line, from the YAML node tree (best effort)."""
    lines: dict[tuple[str, ...], int] = {}
    walked: set[int] = set()  # an alias is walked once (nested aliases would be exponential)

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in walked:
            return
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = (*path, str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?")
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, str(i)))
                lines[(*path, str(i))] = item.start_mark.line + 1

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def _line_of(lines: dict[tuple[str, ...], int], path: tuple[str, ...]) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _issues_from_validation(exc: ValidationError, file: str | None, lines: dict) -> list[ConfigIssue]:
    issues = []
    for err in exc.errors():
        # pydantic puts the union member / validator name in loc for some errors
        path = tuple(str(p) for p in err["loc"] if not str(p).startswith(("function-", "union[")))
        path = tuple(p for p in path if p not in ("str", "none", "int"))
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
            parent = _model_for(path[:-1])
            if parent is not None:
                message += f"; valid keys here: {', '.join(parent.model_fields)}"
        elif err["type"] == "missing":
            message = "required key is missing"
        elif isinstance(err.get("input"), (str, int, float, bool)) and repr(err["input"]) not in message:
            got = repr(err["input"])
            message += f"; got {got}" if len(got) <= 80 else f"; got {got[:60]}... ({len(got)} characters)"
        issues.append(ConfigIssue(".".join(path), message, file, _line_of(lines, path)))
    return issues


def _model_for(path: tuple[str, ...]) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path`` (for 'valid keys')."""
    if path == ():
        return DraftConfig
    if path == ("default",):
        return DefaultDraftConfig
    if path == ("controller",):
        return ControllerConfig
    if len(path) == 2 and path[0] == "domains":
        return DomainConfig
    if len(path) == 3 and path[0] == "domains" and path[2] == "match":
        return MatchConfig
    return None


# ------------------------------------------------------------------ ignored keys

#: controller keys read only by the adaptive controller (``adaptive: false`` drafts k_max)
_ADAPTIVE_ONLY = (
    "min_acceptance", "min_samples", "warmup_k", "probe_interval", "probe_k", "draft_cost",
    "verify_overhead", "min_speedup", "hysteresis", "switch_after", "calibration_interval",
)


def _ignored_keys(config: DraftConfig) -> list[tuple[tuple[str, ...], str]]:
    """Keys given in the file that another setting makes ineffective: (key path, why and fix)."""
    out: list[tuple[tuple[str, ...], str]] = []
    controller, given = config.controller, config.controller.model_fields_set
    if not controller.adaptive:
        why = ("has no effect with controller.adaptive: false (every domain drafts its k_max at every step); "
               "remove it, or set adaptive: true")
        out.extend((("controller", key), why) for key in _ADAPTIVE_ONLY if key in given)
    elif "calibration_interval" in given and controller.verify_overhead is not None:
        why = ("has no effect with controller.verify_overhead set (calibration steps only measure the verify "
               "overhead); remove one of the two")
        out.append((("controller", "calibration_interval"), why))
    if config.default.draft is None and "num_speculative_tokens" in config.default.model_fields_set:
        why = ("has no effect with default.draft: null (unmatched requests are not speculated); "
               "remove it, or give default a draft")
        out.append((("default", "num_speculative_tokens"), why))
    return out


# --------------------------------------------------------------------- model dirs


def _check_draft_dir(raw: str, base: Path, trust_remote_code: bool) -> tuple[Path | None, str | None]:
    """``raw`` as a draft directory: ``~`` expanded, relative to ``base``, resolved
    (symlinks, ``..``) once. Returns (path, None) or (None, problem)."""
    try:
        given = Path(raw).expanduser()
        lexical = given if given.is_absolute() else base / given
        path = lexical.resolve()
        return check_draft_dir(path, trust_remote_code=trust_remote_code), None
    except ModelDirError as exc:
        if path.is_dir():
            return None, str(exc)
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, ~unknown-user
        return None, f"draft {raw!r:.200} is not a usable path: {exc}"
    tried = str(path) if path == lexical else f"{path} (resolved from {lexical})"
    problem = f"draft model directory {raw!r} does not exist: tried {tried}"
    if not given.is_absolute():
        problem += f"; relative paths are resolved against the YAML file's folder {base}"
        in_cwd = Path.cwd() / given
        try:
            elsewhere = in_cwd.resolve() != path and in_cwd.is_dir()
        except OSError:
            elsewhere = False
        if elsewhere:
            problem += f", not the current directory (where {in_cwd} exists): write that path instead"
    return None, problem


def parse_draft_config(text: str, *, file: str | Path | None = None, check_paths: bool = True) -> DraftConfig:
    """Validate YAML ``text``; draft paths become absolute (relative to ``file``'s folder).

    Raises :class:`DraftConfigError` listing every problem found.
    """
    file_name = str(file) if file is not None else None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise DraftConfigError([ConfigIssue("", f"not valid YAML: {exc}", file_name, line)]) from None
    except ValueError as exc:  # a value PyYAML cannot build: 2024-13-01, an int of 5000 digits
        raise DraftConfigError([ConfigIssue("", f"a value cannot be read: {exc!s:.200}", file_name)]) from None
    except RecursionError:
        raise DraftConfigError([ConfigIssue("", "the YAML is nested too deeply", file_name)]) from None
    if not isinstance(data, dict):
        raise DraftConfigError([ConfigIssue("", "the file must be a YAML mapping with at least num_speculative_tokens", file_name, 1)])
    try:
        lines = _key_lines(text)
        config = DraftConfig.model_validate(data)
    except ValidationError as exc:
        raise DraftConfigError(_issues_from_validation(exc, file_name, lines)) from None
    except RecursionError:
        raise DraftConfigError([ConfigIssue("", "the YAML is nested too deeply", file_name)]) from None
    issues = [ConfigIssue(".".join(path), why, file_name, _line_of(lines, path)) for path, why in _ignored_keys(config)]
    if not check_paths:
        if issues:
            raise DraftConfigError(issues)
        config._file, config._lines = file_name, lines
        return config

    base = Path(file).resolve().parent if file is not None else Path.cwd()
    resolved: dict[str, Any] = {}
    entries: list[tuple[tuple[str, ...], str | None]] = [
        (("domains", name, "draft"), d.draft) for name, d in config.domains.items()
    ]
    entries.append((("default", "draft"), config.default.draft))
    for path, raw in entries:
        if raw is None:
            continue
        model_dir, problem = _check_draft_dir(raw, base, config.trust_remote_code)
        if problem:
            issues.append(ConfigIssue(".".join(path), problem, file_name, _line_of(lines, path)))
        else:
            resolved[path] = str(model_dir)
            if resolved[path] != raw:
                _logger.info("draft config %s: %s %r is %s", file_name or "<config>", ".".join(path), raw, model_dir)
    if issues:
        raise DraftConfigError(issues)

    domains = {
        name: d.model_copy(update={"draft": resolved[("domains", name, "draft")]})
        for name, d in config.domains.items()
    }
    default = config.default
    if default.draft is not None:
        default = default.model_copy(update={"draft": resolved[("default", "draft")]})
    config = config.model_copy(update={"domains": domains, "default": default})
    config._file, config._lines = file_name, lines
    return config


def load_draft_config(path: str | Path) -> DraftConfig:
    """Read and validate the draft YAML at ``path`` (e.g. ``envs.draft_config_path()``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DraftConfigError([ConfigIssue("", f"cannot read the draft config: {exc.strerror}", str(path))]) from None
    return parse_draft_config(text, file=path)


# -------------------------------------------------------------- against a target


def check_against_target(
    config: DraftConfig,
    target_dir: str | Path,
    *,
    framework_k: int | None = None,
    tokenizer_dir: str | Path | None = None,
    target_trust_remote_code: bool = False,
) -> None:
    """Start-up checks that need the target: vocabulary, tokenizer, k_max.

    ``framework_k`` is the framework's num_speculative_tokens (the most tokens it
    verifies per step); ``tokenizer_dir`` defaults to ``target_dir``.
    ``target_trust_remote_code`` is the framework's own setting for the target (vLLM:
    ``model_config.trust_remote_code``): the YAML's ``trust_remote_code`` applies to
    drafts only. Raises :class:`DraftConfigError`.
    """
    file_name, lines = config._file, config._lines
    issues: list[ConfigIssue] = []
    if framework_k is not None and config.num_speculative_tokens > framework_k:
        issues.append(ConfigIssue(
            "num_speculative_tokens",
            f"{config.num_speculative_tokens} exceeds the framework's num_speculative_tokens={framework_k}; "
            f"lower it here or raise it in speculative_config",
            file_name, _line_of(lines, ("num_speculative_tokens",)),
        ))
    target = TargetVocabulary(target_dir, tokenizer_dir=tokenizer_dir, trust_remote_code=target_trust_remote_code)
    seen: set[str] = set()
    for domain, draft in config.drafts().items():
        if draft is None or draft in seen:
            continue
        if not seen:
            # TargetVocabulary uses one flag for both sides: read the target's tokenizer
            # now, with the framework's flag (cached), then switch to the drafts' one.
            target.tokens  # noqa: B018 - the property reads and caches
            target.trust_remote_code = config.trust_remote_code
        seen.add(draft)
        path = ("default", "draft") if domain == DEFAULT_DOMAIN else ("domains", domain, "draft")
        problem = target.mismatch(draft)
        if problem:
            issues.append(ConfigIssue(".".join(path), problem, file_name, _line_of(lines, path)))
    if issues:
        raise DraftConfigError(issues)
