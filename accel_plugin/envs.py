"""Every environment variable accel-plugin reads, read here and nowhere else.

The user-facing documentation of these variables is docs/configuration.md; a test
checks that every name in :data:`ENV_VARS` appears there.

Each getter takes an optional mapping (defaults to ``os.environ``) so callers and
tests can evaluate a configuration without touching the process environment.
A value that is set but invalid raises :class:`EnvVarError`, whose message names
the variable, the value received and the valid values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACCEL_ATTENTION_BACKEND",
    "ACCEL_DRAFT_CONFIG",
    "ACCEL_METRICS",
    "ACCEL_METRICS_DIR",
    "ACCEL_METRICS_LOG_INTERVAL",
    "ACCEL_MODELS_DIR",
    "ACCEL_PLUGINS",
    "ACCEL_TRACE",
    "ATTENTION_BACKEND_CHOICES",
    "ENV_VARS",
    "EnvVarError",
    "attention_backend",
    "draft_config_path",
    "metrics_dir",
    "metrics_enabled",
    "metrics_log_interval",
    "models_dir",
    "plugin_allowlist",
    "trace_enabled",
]

ACCEL_ATTENTION_BACKEND = "ACCEL_ATTENTION_BACKEND"
ACCEL_DRAFT_CONFIG = "ACCEL_DRAFT_CONFIG"
ACCEL_METRICS = "ACCEL_METRICS"
ACCEL_METRICS_DIR = "ACCEL_METRICS_DIR"
ACCEL_METRICS_LOG_INTERVAL = "ACCEL_METRICS_LOG_INTERVAL"
ACCEL_MODELS_DIR = "ACCEL_MODELS_DIR"
ACCEL_PLUGINS = "ACCEL_PLUGINS"
ACCEL_TRACE = "ACCEL_TRACE"

#: Valid values of ACCEL_ATTENTION_BACKEND (unset = leave the framework's default).
ATTENTION_BACKEND_CHOICES: tuple[str, ...] = ("flash", "paged", "auto")
_BOOL_TRUE = ("1", "true", "yes", "on")
_BOOL_FALSE = ("0", "false", "no", "off", "")
_BOOL_VALID = "1/0, true/false, yes/no, on/off"
#: seconds between two ``accel KV: ...`` log lines when ACCEL_METRICS_LOG_INTERVAL is unset
DEFAULT_METRICS_LOG_INTERVAL = 10.0


@dataclass(frozen=True)
class EnvVar:
    name: str
    summary: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(ACCEL_ATTENTION_BACKEND, "attention backend: flash, paged, auto; unset = framework default"),
    EnvVar(ACCEL_DRAFT_CONFIG, "path of the draft-model YAML file for the domain proposer"),
    EnvVar(ACCEL_MODELS_DIR, "cache of models fetched by `accel models get`; unset = ~/.cache/accel-plugin/models"),
    EnvVar(ACCEL_PLUGINS, "comma-separated allowlist of third-party accel plugins (entry-point names)"),
    EnvVar(ACCEL_TRACE, "1 = log every hook call of the plugin manager at DEBUG level"),
    EnvVar(ACCEL_METRICS, "0 = no live metrics (Prometheus accel_* metrics, periodic log line); default on"),
    EnvVar(ACCEL_METRICS_LOG_INTERVAL, "seconds between two metrics log lines; 0 = none; default 10"),
    EnvVar(ACCEL_METRICS_DIR, "directory of the worker's metric files; unset = a temporary one per server"),
)


class EnvVarError(ValueError):
    """An environment variable is set to a value accel-plugin cannot use."""

    def __init__(self, name: str, value: str, valid: str):
        self.name, self.value, self.valid = name, value, valid
        super().__init__(f"{name}={value!r} is not valid; valid values: {valid}")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def attention_backend(environ: Mapping[str, str] | None = None) -> str | None:
    """ACCEL_ATTENTION_BACKEND, normalised to lower case; ``None`` when unset or empty."""
    raw = _env(environ).get(ACCEL_ATTENTION_BACKEND)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value not in ATTENTION_BACKEND_CHOICES:
        raise EnvVarError(
            ACCEL_ATTENTION_BACKEND, raw, ", ".join(ATTENTION_BACKEND_CHOICES) + " (or unset)"
        )
    return value


def draft_config_path(environ: Mapping[str, str] | None = None) -> str | None:
    """ACCEL_DRAFT_CONFIG: path of the draft YAML; ``None`` when unset.

    Existence is checked by the config loader, which reports the path it tried.
    """
    raw = _env(environ).get(ACCEL_DRAFT_CONFIG)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def _directory(name: str, raw: str | None, expand: bool = False) -> str | None:
    """A directory path setting: ``None`` when unset or empty; a path to something that
    exists but is not a directory is refused (a directory that does not exist yet is
    made by whoever uses it)."""
    if raw is None or raw.strip() == "":
        return None
    value = os.path.expanduser(raw.strip()) if expand else raw.strip()
    if os.path.exists(os.path.expanduser(value)) and not os.path.isdir(os.path.expanduser(value)):
        raise EnvVarError(name, raw, "a directory path (it may not exist yet); this one is a file")
    return value


def models_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """ACCEL_MODELS_DIR: the cache of ``accel models get``; ``None`` when unset or empty.

    The default location is chosen by :func:`accel_plugin.models.store.models_dir`.
    """
    return _directory(ACCEL_MODELS_DIR, _env(environ).get(ACCEL_MODELS_DIR))


def plugin_allowlist(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """ACCEL_PLUGINS: names of third-party plugins allowed to load; ``None`` = all."""
    raw = _env(environ).get(ACCEL_PLUGINS)
    if raw is None:
        return None
    names = [part.strip() for part in raw.split(",")]
    if any(not n for n in names) and raw.strip() != "":
        raise EnvVarError(ACCEL_PLUGINS, raw, "a comma-separated list of plugin names without empty items")
    return frozenset(n for n in names if n)


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise EnvVarError(name, raw, _BOOL_VALID)


def trace_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """ACCEL_TRACE: whether hook calls are traced to the log."""
    raw = _env(environ).get(ACCEL_TRACE)
    return False if raw is None else _bool(ACCEL_TRACE, raw)


def metrics_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """ACCEL_METRICS: whether live metrics are recorded; on when unset or empty."""
    raw = _env(environ).get(ACCEL_METRICS)
    return True if raw is None or raw.strip() == "" else _bool(ACCEL_METRICS, raw)


def metrics_log_interval(environ: Mapping[str, str] | None = None) -> float:
    """ACCEL_METRICS_LOG_INTERVAL: seconds between two metrics log lines (0 = none)."""
    raw = _env(environ).get(ACCEL_METRICS_LOG_INTERVAL)
    if raw is None or raw.strip() == "":
        return DEFAULT_METRICS_LOG_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise EnvVarError(ACCEL_METRICS_LOG_INTERVAL, raw, "a number of seconds >= 0 (0 = no log line)")
    return value


def metrics_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """ACCEL_METRICS_DIR: the directory of the metric files; ``None`` when unset or empty
    (accel_plugin.observability.metrics then makes one)."""
    return _directory(ACCEL_METRICS_DIR, _env(environ).get(ACCEL_METRICS_DIR), expand=True)


def check_all(environ: Mapping[str, str] | None = None) -> list[EnvVarError]:
    """Validate every variable; returns the errors (empty when all are fine)."""
    errors: list[EnvVarError] = []
    for getter in (attention_backend, draft_config_path, models_dir, plugin_allowlist, trace_enabled,
                   metrics_enabled, metrics_log_interval, metrics_dir):
        try:
            getter(environ)
        except EnvVarError as exc:
            errors.append(exc)
    return errors
