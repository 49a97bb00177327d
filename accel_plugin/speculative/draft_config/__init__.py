"""The draft YAML (``ACCEL_DRAFT_CONFIG``): its schema, loading with file:line issues, path resolution and checks against the target.

The public names are re-exported here (``from accel_plugin.speculative.draft_config
import load_draft_config``); each is defined in one submodule: :mod:`.schema`,
:mod:`.issues`, :mod:`.loading`, :mod:`.paths`, :mod:`.target`.
"""

from __future__ import annotations

from .issues import ConfigIssue, DraftConfigError
from .loading import load_draft_config, parse_draft_config
from .schema import (
    DEFAULT_DOMAIN,
    MAX_REGEX_CHARS,
    ControllerConfig,
    DefaultDraftConfig,
    DomainConfig,
    DraftConfig,
    MatchConfig,
    compile_regex,
)
from .target import DraftTarget, check_against_target

__all__ = [
    "DEFAULT_DOMAIN",
    "MAX_REGEX_CHARS",
    "ConfigIssue",
    "ControllerConfig",
    "DefaultDraftConfig",
    "DomainConfig",
    "DraftConfig",
    "DraftConfigError",
    "DraftTarget",
    "MatchConfig",
    "check_against_target",
    "compile_regex",
    "load_draft_config",
    "parse_draft_config",
]
