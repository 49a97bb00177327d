"""The plugin manager: default plugins, third-party entry points, the registries.

Nothing is built at import. :func:`get_plugin_manager` builds a
``pluggy.PluginManager`` with

1. the hook specifications of :mod:`accel_plugin.plugins.hookspecs`,
2. the default plugins (:data:`DEFAULT_PLUGINS`: our own backends and proposers,
   which register through the same hooks as anyone else),
3. the entry points of group ``accel_plugin``. Those of accel-plugin's own
   distribution (the framework adapters' hook modules, e.g. ``accel.vllm`` ->
   ``accel_plugin.adapters.vllm.hooks``) always load; third-party ones are
   filtered by the ``ACCEL_PLUGINS`` allowlist (unset = all; a listed name that
   is not installed is an error),

then checks that every hook implementation matches a specification
(``check_pending``). ``ACCEL_TRACE=1`` logs every hook call at DEBUG level.

One process builds its plugins once: :func:`process_plugins` returns the same
:class:`Plugins` (manager + registries) on every call, so entry points load once
per process however many parts of an adapter ask. Tools that take an explicit
environment (``accel doctor``, tests) call :func:`load_plugins` instead.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from .. import envs
from . import hookspecs
from .hookspecs import AdapterComponents
from .registry import BackendRegistry, ProposerRegistry

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "OWN_DISTRIBUTION",
    "NoProposerError",
    "PluginLoadError",
    "Plugins",
    "Registries",
    "get_plugin_manager",
    "get_registries",
    "load_plugins",
    "process_plugins",
    "reset_process_plugins",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "accel_plugin"
#: Entry points of this distribution are ours (adapter hook modules): never filtered.
OWN_DISTRIBUTION = "accel-plugin"

#: Modules holding our own hook implementations, registered under these names.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("accel.builtin", "accel_plugin.plugins.builtin"),
)


class NoProposerError(RuntimeError):
    """No plugin offers a speculative proposer to a framework's adapter."""


class PluginLoadError(RuntimeError):
    """A third-party plugin could not be loaded, or the allowlist names a missing one."""


@dataclass
class Registries:
    backends: BackendRegistry
    proposers: ProposerRegistry


def _installed_entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _is_own(ep) -> bool:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) or ""
    return re.sub(r"[-_.]+", "-", name).lower() == OWN_DISTRIBUTION


def get_plugin_manager(environ: Mapping[str, str] | None = None) -> pluggy.PluginManager:
    """Build a fresh plugin manager (see the module docstring)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name, module_path in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_path), name=name)

    allow = envs.plugin_allowlist(environ)
    installed = _installed_entry_points()
    third_party = sorted(name for name, ep in installed.items() if not _is_own(ep))
    if allow is not None:
        missing = sorted(allow - set(third_party))
        if missing:
            available = ", ".join(third_party) or "(none installed)"
            raise PluginLoadError(
                f"{envs.ACCEL_PLUGINS} names plugins that are not installed: {', '.join(missing)}; "
                f"installed accel plugins: {available}"
            )
    for name, ep in sorted(installed.items()):
        if allow is not None and name not in allow and not _is_own(ep):
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


@dataclass
class Plugins:
    """A plugin manager with the registries its plugins filled."""

    pm: pluggy.PluginManager
    registries: Registries
    _components: dict[str, AdapterComponents] = field(default_factory=dict, repr=False)

    def components(self, framework: str) -> AdapterComponents:
        """What plugins offer the adapter of ``framework`` (asked once, then kept).

        Every name must be registered, and a proposer must list ``framework`` among
        its ``frameworks``; otherwise this raises with the registered choices.
        """
        if framework not in self._components:
            components = AdapterComponents(framework=framework)
            self.pm.hook.accel_adapter_components(components=components)
            for name in components.attention_backends:
                self.registries.backends.get(name)  # UnknownNameError lists the known ones
            for name in components.proposers:
                spec = self.registries.proposers.get(name)
                if framework not in spec.frameworks:
                    raise ValueError(
                        f"proposer {name!r} is offered to {framework} but declares frameworks "
                        f"{', '.join(spec.frameworks) or '(none)'}"
                    )
            self._components[framework] = components
        return self._components[framework]

    def proposer(self, framework: str, *, display: str | None = None) -> tuple[str, type]:
        """(name, class) of the proposer an adapter of ``framework`` drives: the first one
        offered to it, loaded from the registry. Raises :class:`NoProposerError` when
        none is offered (``display`` names the framework in the message)."""
        offered = self.components(framework).proposers
        if not offered:
            known = ", ".join(self.registries.proposers.names()) or "(none registered)"
            raise NoProposerError(
                f"no accel plugin offers a speculative proposer to {display or framework} "
                f"(accel_adapter_components); registered proposers: {known}; see `accel doctor`"
            )
        name = offered[0]
        return name, self.registries.proposers.get(name).load()


def load_plugins(environ: Mapping[str, str] | None = None) -> Plugins:
    """Build a plugin manager and its registries (a fresh pair on every call)."""
    pm = get_plugin_manager(environ)
    plugins = Plugins(pm, get_registries(pm))
    logger.debug(
        "accel plugins loaded in process %d: %s", os.getpid(), ", ".join(plugin_names(pm))
    )
    return plugins


_process: Plugins | None = None


def process_plugins() -> Plugins:
    """This process's plugins, built from ``os.environ`` on the first call only."""
    global _process
    if _process is None:
        _process = load_plugins()
    return _process


def reset_process_plugins() -> None:
    """Forget this process's plugins (tests; the next call builds them again)."""
    global _process
    _process = None
