"""The patch ledger: the one mechanism both adapters record their changes to a framework with.

An adapter that changes its framework's state (a monkeypatch, a registration the
framework offers no way to remove) lists each change as a :class:`Patch` in one
:class:`Ledger`, in its ``_patches`` module, whose docstring has one section per
entry. An entry says four things:

target
    what it changes (module, class, attribute);
why
    why the framework needs it (the missing seam, or the bug it works around);
undo
    how it is undone;
upstream
    the change in the framework that would make the entry unnecessary.

An entry may also read its target (``state=``, a function returning what the target
holds now): the ledger test (tests/adapters/test_ledger.py) applies and undoes every
entry of both adapters and checks that the target holds the identical objects again.

:meth:`Patch.apply` and :meth:`Patch.revert` are idempotent. An entry knows whether
it is applied from its own flag (:class:`Patch`: applied and reverted through the
entry) or by asking the framework (:class:`ProbedPatch`: state the adapter changes
through other functions too). :meth:`Ledger.apply` applies entries in order and
undoes the ones it applied when one fails; :meth:`Ledger.undo_all` reverts every
applied entry, last first.

Standard library only (a TGI ``.pth`` file imports it at interpreter start-up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

__all__ = ["Ledger", "Patch", "ProbedPatch"]


class Patch:
    """One entry of a ledger: what it changes, why, how it is undone, what would remove it.

    Subclasses implement :meth:`_apply` and :meth:`_revert`; :attr:`applied` is set by
    :meth:`apply` and cleared by :meth:`revert`, so each runs its body at most once in a row.
    """

    def __init__(self, name: str, *, target: str, why: str, undo: str, upstream: str,
                 state: Callable[[], object] | None = None) -> None:
        self.name, self.target, self.why, self.undo, self.upstream = name, target, why, undo, upstream
        self._applied = False
        self._state = state

    #: whether :meth:`revert` restores the target (False: the framework offers no way back)
    undoable = True

    def state(self) -> object:
        """What the target holds now (the objects :meth:`revert` must put back)."""
        if self._state is None:
            raise NotImplementedError(f"ledger entry {self.name!r} has no state reader (pass state=...)")
        return self._state()

    @property
    def applied(self) -> bool:
        return self._applied

    def apply(self) -> None:
        if not self.applied:
            self._apply()
            self._applied = True

    def revert(self) -> None:
        if self.applied:
            self._revert()
            self._applied = False

    def _apply(self) -> None:
        raise NotImplementedError

    def _revert(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Patch {self.name!r}: {self.target}{' (applied)' if self.applied else ''}>"


class ProbedPatch(Patch):
    """An entry whose state is read from the framework: ``probe()`` says whether it is applied.

    ``apply`` and ``revert`` are the functions that change it (``revert=None``: the
    framework offers no way back, and :meth:`revert` does nothing; the ``undo`` text
    says why that is harmless). The adapter may also call those functions directly:
    the probe sees the result either way.
    """

    def __init__(self, name: str, *, probe: Callable[[], bool], apply: Callable[[], object] | None = None,
                 revert: Callable[[], object] | None = None, state: Callable[[], object] | None = None,
                 **ledger: str) -> None:
        super().__init__(name, state=state, **ledger)
        self._probe, self._apply_function, self._revert_function = probe, apply, revert
        self.undoable = revert is not None

    @property
    def applied(self) -> bool:
        return bool(self._probe())

    def apply(self) -> None:
        if self._apply_function is None:
            raise RuntimeError(f"ledger entry {self.name!r} is applied by its adapter only")
        if not self.applied:
            self._apply_function()

    def revert(self) -> None:
        if self._revert_function is not None and self.applied:
            self._revert_function()


class Ledger:
    """An adapter's patches, in the order they stack (applied first to last, undone last first)."""

    def __init__(self, *patches: Patch) -> None:
        self.patches: tuple[Patch, ...] = patches

    def __iter__(self) -> Iterator[Patch]:
        return iter(self.patches)

    def __len__(self) -> int:
        return len(self.patches)

    def __getitem__(self, index: int) -> Patch:
        return self.patches[index]

    def apply(self, patches: Iterable[Patch]) -> None:
        """Apply ``patches`` (entries of this ledger) in order; on failure, undo the ones this
        call applied and raise."""
        done = []
        try:
            for patch in patches:
                if patch not in self.patches:
                    raise ValueError(f"{patch!r} is not an entry of this ledger")
                if not patch.applied:
                    patch.apply()
                    done.append(patch)
        except BaseException:
            for patch in reversed(done):
                patch.revert()
            raise

    def applied(self) -> list[Patch]:
        """The entries applied now, in ledger order."""
        return [patch for patch in self.patches if patch.applied]

    def undo_all(self) -> None:
        """Revert every applied entry, last first (entries that cannot be undone stay)."""
        for patch in reversed(self.patches):
            patch.revert()
