"""Every environment variable accel-plugin reads, read here and nowhere else.

:data:`ENV_VARS` is the one table of them: name, valid values, default, meaning and
getter. Everything else derives from it: :func:`check_all`, ``accel doctor``'s
report, the valid values named by an error. The user-facing documentation of these
variables is docs/configuration.md; a test checks that every name in the table
appears there.

Each getter takes an optional mapping (defaults to ``os.environ``) so callers and
tests can evaluate a configuration without touching the process environment.
A value that is set but invalid raises :class:`EnvVarError`, whose message names
the variable, the value received and the valid values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACCEL_ATTENTION_BACKEND",
    "ACCEL_DRAFT_CONFIG",
    "ACCEL_METRICS",
    "ACCEL_METRICS_DIR",
    "ACCEL_METRICS_LOG_INTERVAL",
    "ACCEL_MODELS_DIR",
    "ACCEL_PLUGINS",
    "ACCEL_TGI_PREPACK",
    "ACCEL_TRACE",
    "ACCEL_VLLM_PREPACK",
    "ATTENTION_BACKEND_CHOICES",
    "ENV_VARS",
    "EnvVar",
    "EnvVarError",
    "VLLM_PREPACK_AUTO",
    "attention_backend",
    "check_all",
    "draft_config_path",
    "metrics_dir",
    "metrics_enabled",
    "metrics_log_interval",
    "models_dir",
    "plugin_allowlist",
    "tgi_prepack",
    "trace_enabled",
    "vllm_prepack",
]

ACCEL_ATTENTION_BACKEND = "ACCEL_ATTENTION_BACKEND"
ACCEL_DRAFT_CONFIG = "ACCEL_DRAFT_CONFIG"
ACCEL_METRICS = "ACCEL_METRICS"
ACCEL_METRICS_DIR = "ACCEL_METRICS_DIR"
ACCEL_METRICS_LOG_INTERVAL = "ACCEL_METRICS_LOG_INTERVAL"
ACCEL_MODELS_DIR = "ACCEL_MODELS_DIR"
ACCEL_PLUGINS = "ACCEL_PLUGINS"
ACCEL_TGI_PREPACK = "ACCEL_TGI_PREPACK"
ACCEL_TRACE = "ACCEL_TRACE"
ACCEL_VLLM_PREPACK = "ACCEL_VLLM_PREPACK"

#: Valid values of ACCEL_ATTENTION_BACKEND (unset = leave the framework's default).
ATTENTION_BACKEND_CHOICES: tuple[str, ...] = ("flash", "paged", "auto")
_BOOL_TRUE = ("1", "true", "yes", "on")
_BOOL_FALSE = ("0", "false", "no", "off", "")
_BOOL_VALID = "1/0, true/false, yes/no, on/off"
#: seconds between two ``accel KV: ...`` log lines when ACCEL_METRICS_LOG_INTERVAL is unset
DEFAULT_METRICS_LOG_INTERVAL = 10.0


class EnvVarError(ValueError):
    """An environment variable is set to a value accel-plugin cannot use."""

    def __init__(self, name: str, value: str, valid: str):
        self.name, self.value, self.valid = name, value, valid
        super().__init__(f"{name}={value!r} is not valid; valid values: {valid}")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _invalid(name: str, raw: str, detail: str = "") -> EnvVarError:
    """The error for ``name=raw``, naming the valid values of the table (and ``detail``)."""
    return EnvVarError(name, raw, _BY_NAME[name].valid + detail)


def attention_backend(environ: Mapping[str, str] | None = None) -> str | None:
    """ACCEL_ATTENTION_BACKEND, normalised to lower case; ``None`` when unset or empty."""
    raw = _env(environ).get(ACCEL_ATTENTION_BACKEND)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value not in ATTENTION_BACKEND_CHOICES:
        raise _invalid(ACCEL_ATTENTION_BACKEND, raw)
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
        raise _invalid(name, raw, "; this one is a file")
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
        raise _invalid(ACCEL_PLUGINS, raw)
    return frozenset(n for n in names if n)


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise _invalid(name, raw)


def trace_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """ACCEL_TRACE: whether hook calls are traced to the log."""
    raw = _env(environ).get(ACCEL_TRACE)
    return False if raw is None else _bool(ACCEL_TRACE, raw)


def metrics_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """ACCEL_METRICS: whether live metrics are recorded; on when unset or empty."""
    raw = _env(environ).get(ACCEL_METRICS)
    return True if raw is None or raw.strip() == "" else _bool(ACCEL_METRICS, raw)


def tgi_prepack(environ: Mapping[str, str] | None = None) -> bool:
    """ACCEL_TGI_PREPACK: whether TGI's target matrices get packed copies (the native few-row
    product, or oneDNN's) while our drafts speculate (adapters/tgi/packed_linears.py); on when
    unset or empty."""
    raw = _env(environ).get(ACCEL_TGI_PREPACK)
    return True if raw is None or raw.strip() == "" else _bool(ACCEL_TGI_PREPACK, raw)


#: Valid values of ACCEL_VLLM_PREPACK besides the on/off words.
VLLM_PREPACK_AUTO = "auto"


def vllm_prepack(environ: Mapping[str, str] | None = None) -> str:
    """ACCEL_VLLM_PREPACK: whether vLLM's target matrices get native copies while our drafts
    speculate (adapters/vllm/packed_linears.py): ``"auto"`` (unset or empty: eager engines
    only), ``"on"`` (compiled engines too) or ``"off"``."""
    raw = _env(environ).get(ACCEL_VLLM_PREPACK)
    if raw is None or raw.strip() == "" or raw.strip().lower() == VLLM_PREPACK_AUTO:
        return VLLM_PREPACK_AUTO
    return "on" if _bool(ACCEL_VLLM_PREPACK, raw) else "off"


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
        raise _invalid(ACCEL_METRICS_LOG_INTERVAL, raw)
    return value


def metrics_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """ACCEL_METRICS_DIR: the directory of the metric files; ``None`` when unset or empty
    (accel_plugin.observability.metrics_files then makes one)."""
    return _directory(ACCEL_METRICS_DIR, _env(environ).get(ACCEL_METRICS_DIR), expand=True)


@dataclass(frozen=True)
class EnvVar:
    """One row of :data:`ENV_VARS` (the columns of docs/configuration.md's table)."""

    name: str
    #: the valid values, in words (an error names them)
    valid: str
    #: what applies when it is unset
    default: str
    meaning: str
    #: ``getter(environ=None)``: the effective value; raises :class:`EnvVarError`
    getter: Callable[[Mapping[str, str] | None], Any]


_DIRECTORY = "a directory path (it may not exist yet)"

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(ACCEL_ATTENTION_BACKEND, ", ".join(ATTENTION_BACKEND_CHOICES) + " (or unset)", "the framework's default",
           "attention backend", attention_backend),
    EnvVar(ACCEL_DRAFT_CONFIG, "a file path (checked when the YAML is loaded)", "no domain proposer",
           "path of the draft-model YAML file for the domain proposer", draft_config_path),
    EnvVar(ACCEL_MODELS_DIR, _DIRECTORY, "~/.cache/accel-plugin/models",
           "cache of models fetched by `accel models get`", models_dir),
    EnvVar(ACCEL_PLUGINS, "a comma-separated list of plugin names without empty items", "all installed",
           "allowlist of third-party accel plugins (entry-point names)", plugin_allowlist),
    EnvVar(ACCEL_TRACE, _BOOL_VALID, "off", "log every hook call of the plugin manager at DEBUG level",
           trace_enabled),
    EnvVar(ACCEL_METRICS, _BOOL_VALID, "on", "live metrics (Prometheus accel_* metrics, periodic log line)",
           metrics_enabled),
    EnvVar(ACCEL_METRICS_LOG_INTERVAL, "a number of seconds >= 0 (0 = no log line)",
           f"{DEFAULT_METRICS_LOG_INTERVAL:g}", "seconds between two metrics log lines", metrics_log_interval),
    EnvVar(ACCEL_METRICS_DIR, _DIRECTORY, "a temporary one per server", "directory of the worker's metric files",
           metrics_dir),
    EnvVar(ACCEL_TGI_PREPACK, _BOOL_VALID, "on",
           "TGI, CPU, float32: packed copies of the target's matrices while our drafts speculate "
           "(faster multi-row verification; the matrices' bytes again in host memory)", tgi_prepack),
    EnvVar(ACCEL_VLLM_PREPACK, f"{VLLM_PREPACK_AUTO}, or {_BOOL_VALID}", VLLM_PREPACK_AUTO,
           "vLLM, CPU, float32: native copies of the target's matrices while our drafts speculate "
           "(faster eager steps of one to 64 rows; the matrices' bytes again in host memory); auto: in "
           "eager engines only (in a compiled one, vLLM's default, they measured slower), on: in "
           "compiled ones too", vllm_prepack),
)
_BY_NAME = {var.name: var for var in ENV_VARS}


def check_all(environ: Mapping[str, str] | None = None) -> list[EnvVarError]:
    """Validate every variable; returns the errors (empty when all are fine)."""
    errors: list[EnvVarError] = []
    for var in ENV_VARS:
        try:
            var.getter(environ)
        except EnvVarError as exc:
            errors.append(exc)
    return errors
