"""Reading the draft YAML into a :class:`~.schema.DraftConfig`, or into every problem
found at once.

:func:`load_draft_config` reads and validates the file; every problem it finds
(unknown keys, wrong types, regexes RE2 cannot run, keys that would be ignored,
missing model directories, weights that are not safetensors) is collected into one
:class:`~.issues.DraftConfigError` whose lines name the file, the line and the key.
Draft paths are resolved by :mod:`.paths`; the checks that need the target are
:mod:`.target`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .issues import ConfigIssue, DraftConfigError, key_lines, line_of
from .paths import resolve_draft_dir
from .schema import ControllerConfig, DefaultDraftConfig, DomainConfig, DraftConfig, LookupConfig, MatchConfig

__all__ = ["load_draft_config", "parse_draft_config"]

_logger = logging.getLogger("accel_plugin.speculative.draft_config")


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
        issues.append(ConfigIssue(".".join(path), message, file, line_of(lines, path)))
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
    if path == ("default", "lookup") or len(path) == 3 and path[0] == "domains" and path[2] == "lookup":
        return LookupConfig
    return None


# ------------------------------------------------------------------ ignored keys

#: controller keys read only by the adaptive controller (``adaptive: false`` drafts k_max)
_ADAPTIVE_ONLY = (
    "min_acceptance", "min_samples", "warmup_k", "probe_interval", "probe_k", "draft_cost",
    "verify_overhead", "min_speedup", "hysteresis", "switch_after", "calibration_interval",
    "step_gate", "gate_window", "gate_min_samples", "gate_switch_after", "gate_probe_interval",
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
    if (config.default.draft is None and config.default.lookup is None
            and "num_speculative_tokens" in config.default.model_fields_set):
        why = ("has no effect with default.draft: null and no default.lookup (unmatched requests are not "
               "speculated); remove it, or give default a draft or a lookup")
        out.append((("default", "num_speculative_tokens"), why))
    return out

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
        lines = key_lines(text)
        config = DraftConfig.model_validate(data)
    except ValidationError as exc:
        raise DraftConfigError(_issues_from_validation(exc, file_name, lines)) from None
    except RecursionError:
        raise DraftConfigError([ConfigIssue("", "the YAML is nested too deeply", file_name)]) from None
    issues = [ConfigIssue(".".join(path), why, file_name, line_of(lines, path)) for path, why in _ignored_keys(config)]
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
        model_dir, problem = resolve_draft_dir(raw, base, config.trust_remote_code)
        if problem:
            issues.append(ConfigIssue(".".join(path), problem, file_name, line_of(lines, path)))
        else:
            resolved[path] = str(model_dir)
            if resolved[path] != raw:
                _logger.info("draft config %s: %s %r is %s", file_name or "<config>", ".".join(path), raw, model_dir)
    if issues:
        raise DraftConfigError(issues)

    domains = {
        name: d if d.draft is None else d.model_copy(update={"draft": resolved[("domains", name, "draft")]})
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
