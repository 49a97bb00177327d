"""The kinds of patch the TGI adapter makes: an import hook, rebound module globals, wrapped methods.

Each is a ledger entry (:class:`accel_plugin.adapters._ledger.Patch`) that also hears
of every ``text_generation_server`` module imported while it is applied
(:meth:`TGIPatch.on_import`), since TGI binds names at import time. The entries
themselves, with what they change and why, are in :mod:`._patches`. Standard
library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

from .._ledger import Patch
from . import _hook
from ._names import HOOK_OWNER, TGI_PACKAGE

__all__ = ["ImportHook", "RebindGlobals", "TGIPatch", "WrapMethods"]


class TGIPatch(Patch):
    """A ledger entry of the TGI adapter."""

    def on_import(self, module: ModuleType) -> None:
        """Called for each TGI module imported while applied (default: nothing)."""


class ImportHook(TGIPatch):
    """Patch 1: the post-import finder on ``sys.meta_path``; ``callback(module)`` gets every
    ``text_generation_server`` module imported while it is applied. It takes over from the
    ``.pth`` line's trigger (which applies it when TGI is first imported)."""

    def __init__(self, name: str, *, callback: Callable[[ModuleType], None], **ledger: str) -> None:
        super().__init__(name, **ledger)
        self.callback = callback

    def _apply(self) -> None:
        _hook.install_hook(TGI_PACKAGE, self.callback, HOOK_OWNER)
        _hook.remove_trigger(HOOK_OWNER)

    def _revert(self) -> None:
        _hook.remove_hook(HOOK_OWNER)
        _hook.remove_trigger(HOOK_OWNER)

    @property
    def present(self) -> bool:
        """The finder, or the ``.pth`` line's trigger that will apply it, is on ``sys.meta_path``."""
        return _hook.find_hook(HOOK_OWNER) is not None or _hook.find_trigger(HOOK_OWNER) is not None


class RebindGlobals(TGIPatch):
    """Patches 2 and 3 (generic): replace functions of ``package`` in every TGI module that binds them.

    ``replacements()`` returns ``{name: replacement}``; the originals are the package's
    attributes of those names when the patch is applied. A module's global is
    replaced when it *is* an original (``from package import name``, under any
    alias). The originals' home modules keep them.
    """

    def __init__(self, name: str, *, package: str, replacements: Callable[[], dict[str, Callable]],
                 **ledger: str) -> None:
        super().__init__(name, **ledger)
        self.package = package
        self._replacements = replacements
        self._pairs: dict[int, tuple[Callable, Callable]] = {}  # id(original or ours) -> (original, ours)
        self._homes: set[str] = set()
        self._records: list[tuple[str, str, Callable, Callable]] = []  # module, attr, original, ours
        self._recorded: set[tuple[str, str]] = set()

    def _apply(self) -> None:
        package = sys.modules[self.package]
        self._pairs.clear()
        self._homes.clear()
        for attr, ours in self._replacements().items():
            original = getattr(package, attr)
            if getattr(original, "__accel_replacement__", False):
                raise RuntimeError(f"{self.package}.{attr} is already replaced by accel-plugin")
            self._pairs[id(original)] = (original, ours)
            self._pairs[id(ours)] = (original, ours)
            self._homes.add(getattr(original, "__module__", "") or "")
        for module in list(sys.modules.values()):
            self._rebind(module)

    def on_import(self, module: ModuleType) -> None:
        self._rebind(module)

    def _rebind(self, module) -> None:
        """Bind ours where an original is; record every binding of ours (also those a
        module took from the already patched package), so that revert finds them all."""
        name = getattr(module, "__name__", None)
        if not isinstance(name, str) or name in self._homes:
            return
        if name != TGI_PACKAGE and not name.startswith(TGI_PACKAGE + "."):
            return
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            return
        for attr, value in list(namespace.items()):
            pair = self._pairs.get(id(value))
            if pair is None or (value is not pair[0] and value is not pair[1]):
                continue
            if (name, attr) in self._recorded:
                continue
            namespace[attr] = pair[1]
            self._recorded.add((name, attr))
            self._records.append((name, attr, pair[0], pair[1]))

    def _revert(self) -> None:
        for module_name, attr, original, ours in reversed(self._records):
            module = sys.modules.get(module_name)
            if module is not None and module.__dict__.get(attr) is ours:
                module.__dict__[attr] = original
        self._records.clear()
        self._recorded.clear()
        self._pairs.clear()
        self._homes.clear()

    def rebound_modules(self) -> list[str]:
        """Modules where one of our functions is bound now (the package first)."""
        names: list[str] = []
        for module_name, attr, _, ours in self._records:
            module = sys.modules.get(module_name)
            if module is not None and module.__dict__.get(attr) is ours and module_name not in names:
                names.append(module_name)
        return names


class WrapMethods(TGIPatch):
    """Patch 4 (generic): wrap methods of class ``owner`` of TGI module ``module``.

    ``wrappers()`` returns ``{name: make}``; ``make(original)`` returns the function
    that replaces the class attribute ``name``. The class is patched when the patch is
    applied (module imported already) or when the module is imported later
    (:meth:`on_import`). A wrapper carries ``__accel_wrapped__`` (the original), so
    a class is never wrapped twice.
    """

    def __init__(self, name: str, *, module: str, owner: str, wrappers: Callable[[], dict[str, Callable]],
                 **ledger: str) -> None:
        super().__init__(name, **ledger)
        self.module, self.owner = module, owner
        self._wrappers = wrappers
        self._records: list[tuple[type, str, Callable, Callable]] = []  # class, attr, original, wrapper

    def _apply(self) -> None:
        module = sys.modules.get(self.module)
        if module is not None:
            self._wrap(module)

    def on_import(self, module: ModuleType) -> None:
        if getattr(module, "__name__", None) == self.module:
            self._wrap(module)

    def _wrap(self, module: ModuleType) -> None:
        owner = getattr(module, self.owner)
        for attr, make in self._wrappers().items():
            original = owner.__dict__[attr]
            if getattr(original, "__accel_wrapped__", None) is not None:
                continue
            wrapper = make(original)
            wrapper.__accel_wrapped__ = original
            setattr(owner, attr, wrapper)
            self._records.append((owner, attr, original, wrapper))

    def _revert(self) -> None:
        for owner, attr, original, wrapper in reversed(self._records):
            if owner.__dict__.get(attr) is wrapper:
                setattr(owner, attr, original)
        self._records.clear()

    def wrapped(self) -> list[str]:
        """``Class.attr`` of every wrapper in place now."""
        return [f"{owner.__name__}.{attr}" for owner, attr, _, wrapper in self._records
                if owner.__dict__.get(attr) is wrapper]
