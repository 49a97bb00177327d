"""The plugin manager: default plugins, third-party entry points, the registries.

Nothing is built at import. :func:`get_plugin_manager` builds a
``pluggy.PluginManager`` with

1. the hook specifications of :mod:`accel_plugin.hookspecs`,
2. the default plugins (:data:`DEFAULT_PLUGINS`: our own backends and proposers,
   which register through the same hooks as anyone else),
3. the entry points of group ``accel_plugin``, filtered by the ``ACCEL_PLUGINS``
   allowlist (unset = all; a listed name that is not installed is an error),

then checks that every hook implementation matches a specification
(``check_pending``). ``ACCEL_TRACE=1`` logs every hook call at DEBUG level.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points

import pluggy

from . import envs, hookspecs
from .registry import BackendRegistry, ProposerRegistry

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PluginLoadError",
    "Registries",
    "get_plugin_manager",
    "get_registries",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "accel_plugin"

#: Modules holding our own hook implementations, registered under these names.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("accel.builtin", "accel_plugin.builtin"),
)


class PluginLoadError(RuntimeError):
    """A third-party plugin could not be loaded, or the allowlist names a missing one."""


@dataclass
class Registries:
    backends: BackendRegistry
    proposers: ProposerRegistry


def _installed_entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_plugin_manager(environ: Mapping[str, str] | None = None) -> pluggy.PluginManager:
    """Build a fresh plugin manager (see the module docstring)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name, module_path in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_path), name=name)

    allow = envs.plugin_allowlist(environ)
    installed = _installed_entry_points()
    if allow is not None:
        missing = sorted(allow - set(installed))
        if missing:
            available = ", ".join(sorted(installed)) or "(none installed)"
            raise PluginLoadError(
                f"{envs.ACCEL_PLUGINS} names plugins that are not installed: {', '.join(missing)}; "
                f"installed accel plugins: {available}"
            )
    for name, ep in sorted(installed.items()):
        if allow is not None and name not in allow:
            logger.debug("accel plugin %r skipped: not in %s", name, envs.ACCEL_PLUGINS)
            continue
        try:
            plugin = ep.load()  # type: ignore[attr-defined]
        except Exception as exc:
            raise PluginLoadError(
                f"accel plugin {name!r} ({ep.value}) failed to import: {exc!r}; "  # type: ignore[attr-defined]
                f"uninstall it or leave it out of {envs.ACCEL_PLUGINS}"
            ) from exc
        pm.register(plugin, name=name)
        logger.debug("accel plugin %r loaded from %s", name, ep.value)  # type: ignore[attr-defined]

    pm.check_pending()
    if envs.trace_enabled(environ):
        pm.trace.root.setwriter(logger.debug)
        pm.enable_tracing()
    return pm


def get_registries(pm: pluggy.PluginManager) -> Registries:
    """Ask every plugin to register its backends and proposers; return the registries."""
    backends = BackendRegistry()
    proposers = ProposerRegistry()
    pm.hook.accel_register_attention_backends(registry=backends)
    pm.hook.accel_register_proposers(registry=proposers)
    return Registries(backends=backends, proposers=proposers)


def plugin_names(pm: pluggy.PluginManager) -> list[str]:
    """Names of the registered plugins, default ones first."""
    return [name for name, _ in pm.list_name_plugin() if name is not None]
