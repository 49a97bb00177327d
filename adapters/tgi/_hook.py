"""A post-import hook: call a function on every module of one package as it is imported.

:class:`PostImportFinder` sits first on ``sys.meta_path``. For a module named
``prefix`` or ``prefix.*`` it asks the other finders for the spec and wraps the
loader, so that after the module's code has run, ``callback(module)`` is called.
The module's ``__loader__`` and ``__spec__.loader`` are then set back to the
original loader, so nothing else sees the wrapper. Modules outside the prefix are
not touched, and a failing module import is not reported to the callback.

:func:`find_trigger` and :func:`remove_trigger` find the other finder of ours on
``sys.meta_path``: the trigger the ``.pth`` line installs (:mod:`._startup`), which
waits for TGI's first import. Standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from types import ModuleType

from ._startup import TRIGGER_CLASS

__all__ = ["PostImportFinder", "find_hook", "find_trigger", "install_hook", "remove_hook", "remove_trigger"]


class _CallbackLoader:
    """Delegates to ``loader``; calls ``callback(module)`` once the module has executed."""

    def __init__(self, loader, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._callback(module)

    def __getattr__(self, name: str):  # get_source, is_package, get_resource_reader ...
        return getattr(self._loader, name)


class PostImportFinder(MetaPathFinder):
    """Finds nothing itself; wraps the loader other finders return for ``prefix`` modules."""

    def __init__(self, prefix: str, callback: Callable[[ModuleType], None], owner: str) -> None:
        self.prefix = prefix
        self.callback = callback
        #: who installed it (so that :func:`find_hook` never touches another's finder)
        self.owner = owner

    def _wanted(self, fullname: str) -> bool:
        return fullname == self.prefix or fullname.startswith(self.prefix + ".")

    def find_spec(self, fullname, path, target=None):
        if not self._wanted(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # namespace package or legacy loader: leave it alone
        spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec

    def __repr__(self) -> str:
        return f"<PostImportFinder {self.prefix}.* for {self.owner}>"


def find_hook(owner: str) -> PostImportFinder | None:
    for finder in sys.meta_path:
        if isinstance(finder, PostImportFinder) and finder.owner == owner:
            return finder
    # A finder installed by another copy of this module (reloaded in tests) is still ours.
    for finder in sys.meta_path:
        if type(finder).__name__ == "PostImportFinder" and getattr(finder, "owner", None) == owner:
            return finder  # type: ignore[return-value]
    return None


def install_hook(prefix: str, callback: Callable[[ModuleType], None], owner: str) -> PostImportFinder:
    """Put a finder for ``prefix`` first on ``sys.meta_path`` (once per ``owner``)."""
    existing = find_hook(owner)
    if existing is not None:
        return existing
    finder = PostImportFinder(prefix, callback, owner)
    sys.meta_path.insert(0, finder)
    return finder


def remove_hook(owner: str) -> bool:
    """Take ``owner``'s finder off ``sys.meta_path``; True when there was one."""
    finder = find_hook(owner)
    if finder is None:
        return False
    sys.meta_path.remove(finder)
    return True


def find_trigger(owner: str) -> object | None:
    """``owner``'s trigger from the ``.pth`` line (:data:`._startup.TRIGGER_SOURCE`), while it waits."""
    for finder in sys.meta_path:
        if type(finder).__name__ == TRIGGER_CLASS and getattr(finder, "owner", None) == owner:
            return finder
    return None


def remove_trigger(owner: str) -> bool:
    """Take ``owner``'s waiting trigger off ``sys.meta_path``; True when there was one."""
    finder = find_trigger(owner)
    if finder is None:
        return False
    sys.meta_path.remove(finder)
    return True
