"""Every change accel-plugin makes to TGI's state, with its ledger.

TGI has no plugin entry point and imports its attention functions by name, so the
adapter works by import hook and monkeypatch. :data:`LEDGER` lists the patches, in
the order they stack; a contract test applies and undoes each.
:func:`accel_plugin.adapters.tgi.activate` installs :data:`ATTENTION_PATCHES`
(ACCEL_ATTENTION_BACKEND), :func:`accel_plugin.adapters.tgi.activate_speculation`
:data:`SPECULATION_PATCHES` (ACCEL_DRAFT_CONFIG), and a model that starts
speculating while TGI's own attention is in use applies patch 3. :func:`uninstall`
undoes every applied patch, in reverse ledger order. Installing an applied patch
again is a no-op.

1. The import hook (``sys.meta_path``)
--------------------------------------
target
    ``sys.meta_path`` gains a :class:`._hook.PostImportFinder` for
    ``text_generation_server.*``; it changes no module itself.
why
    TGI's launcher starts ``text-generation-server`` from PATH and TGI loads no
    plugins; its ~20 modeling modules bind ``attention``/``paged_attention`` by name
    when they are imported. The hook (installed by the ``.pth`` file while
    ACCEL_ATTENTION_BACKEND or ACCEL_DRAFT_CONFIG is set) activates the attention
    when TGI imports ``text_generation_server.layers.attention``, the speculation
    when it imports ``text_generation_server.models.flash_causal_lm``, and hands
    every later TGI module to the applied patches (:func:`on_import`).
how it is undone
    :func:`uninstall` takes the finder off ``sys.meta_path``; ``pip uninstall
    accel-plugin`` removes the ``.pth`` file (``python -m accel_plugin.adapters.tgi
    uninstall-hook`` one written by ``install-hook``).
upstream change that would remove it
    a plugin entry point in TGI's server (e.g. an ``entry_points`` group loaded by
    ``text_generation_server.cli``) or an attention-backend registry.

2. The attention functions (rebinding module globals)
-----------------------------------------------------
target
    ``text_generation_server.layers.attention.attention`` and ``.paged_attention``,
    and every global of a ``text_generation_server.*`` module that *is* one of those
    two functions (the by-name copies in ``custom_modeling/flash_*_modeling.py``,
    ``transformers_flash_causal_lm.py``, ``transformers_flash_vlm.py`` ...), now and
    in modules imported later. The functions' home module (``layers/attention/ipex.py``
    on CPU) keeps TGI's own.
why
    TGI has one implementation per platform (``cuda.py``, ``rocm.py``, ``ipex.py``)
    chosen at import; there is no seam to select another attention. Our functions
    (:mod:`.attention`) read TGI's KV cache as it is and replace only the
    read/compute; TGI keeps writing the cache (``KVCache.store``).
how it is undone
    every rebinding is recorded (module, name, original); :func:`uninstall` puts the
    original back wherever our function is still bound.
upstream change that would remove it
    TGI calling attention through its package (``attention_module.attention(...)``)
    or a registry keyed by ``ATTENTION``, so that one assignment (or a registered
    backend) replaces it everywhere.

3. The Seqlen.max_k workaround (TGI's own ``paged_attention`` with speculation)
--------------------------------------------------------------------------------
target
    ``text_generation_server.layers.attention.paged_attention`` and its by-name
    copies (the same rebinding as patch 2), wrapped by
    :func:`.speculative.with_full_max_k`: ``seqlen.max_k = max(seqlen.max_k, max_s)``
    before TGI's function runs. Applied when a model starts draft-model speculation
    while TGI's own attention is in use; never together with patch 2 (our
    functions never read ``max_k``; :func:`accel_plugin.adapters.tgi.activate`
    reverts this one first).
why
    a TGI bug: in its speculative branch ``FlashCausalLM.forward`` raises ``max_s`` by
    the speculative width but builds ``Seqlen(max_k=batch.max_current_length)``; IPEX's
    ``flash_attn_varlen_func`` (``ATTENTION=flashdecoding-ipex``) then reads keys past
    ``max_k`` and crashes (SIGSEGV), with n-gram speculation as with ours.
    ``max_s`` is the longest key length of the step, so the fix is exact in every mode.
how it is undone
    like patch 2: every rebinding is recorded and the original put back.
upstream change that would remove it
    ``Seqlen(..., max_k=max_s)`` in the speculative branch of ``FlashCausalLM.forward``.

4. The draft-model speculation (``FlashCausalLM.__init__`` and ``.generate_token``)
-----------------------------------------------------------------------------------
target
    ``text_generation_server.models.flash_causal_lm.FlashCausalLM.__init__`` and
    ``.generate_token`` (class attributes; subclasses that do not override them
    inherit the wrappers), wrapped by :func:`.speculative.wrap_init` and
    :func:`.speculative.wrap_generate_token`. Applied when TGI imports that module
    while ACCEL_DRAFT_CONFIG is set (:func:`accel_plugin.adapters.tgi.activate_speculation`).
why
    TGI proposes only n-gram, Medusa or MLP-speculator tokens, and has no seam for a
    proposer: it fills ``batch.speculative_ids`` inside ``generate_token``. The
    ``__init__`` wrapper builds and validates the domain proposer of each model
    (:func:`.speculative.attach`); the ``generate_token`` wrapper replaces the ids
    TGI just proposed for the next step with the proposer's drafts (``None`` after
    a prefill, or when no request drafts: a plain step), and before a decode step
    widens ``all_input_ids_tensor`` where ``concatenate`` sized it by a narrower
    draft width than ``--speculate``.
how it is undone
    :func:`revert` sets the original functions back on the class where our wrapper
    is still there; models keep their proposer attribute, unused (``uninstall()``
    also closes them).
upstream change that would remove it
    a proposer interface in TGI (e.g. ``--speculate N --speculator-class module:Class``
    called with the next batch after each step), as vLLM's ``custom_class``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import ModuleType

from . import _hook

__all__ = [
    "ATTENTION_FUNCTIONS",
    "ATTENTION_PACKAGE",
    "ATTENTION_PATCHES",
    "DRAFT_SPECULATION",
    "HOOK_OWNER",
    "IMPORT_HOOK",
    "LEDGER",
    "SEQLEN_MAX_K",
    "SPECULATION_MODULE",
    "SPECULATION_PATCHES",
    "TGI_PACKAGE",
    "Patch",
    "RebindGlobals",
    "WrapMethods",
    "applied",
    "apply",
    "install_import_hook",
    "on_import",
    "uninstall",
]

TGI_PACKAGE = "text_generation_server"
ATTENTION_PACKAGE = f"{TGI_PACKAGE}.layers.attention"
#: The module whose FlashCausalLM the speculation wraps (patch 4).
SPECULATION_MODULE = f"{TGI_PACKAGE}.models.flash_causal_lm"
#: Marks our finder on sys.meta_path.
HOOK_OWNER = "accel-plugin-tgi"


class Patch:
    """One entry of the ledger: what it changes, why, how it is undone, what would remove it.

    Subclasses implement :meth:`_apply` and :meth:`_revert`; :meth:`on_import` gets
    every ``text_generation_server`` module imported while the patch is applied.
    """

    def __init__(self, name: str, *, target: str, why: str, undo: str, upstream: str) -> None:
        self.name, self.target, self.why, self.undo, self.upstream = name, target, why, undo, upstream
        self.applied = False

    def apply(self) -> None:
        if not self.applied:
            self._apply()
            self.applied = True

    def revert(self) -> None:
        if self.applied:
            self._revert()
            self.applied = False

    def on_import(self, module: ModuleType) -> None:
        """Called for each TGI module imported while applied (default: nothing)."""

    def _apply(self) -> None:
        raise NotImplementedError

    def _revert(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Patch {self.name!r}: {self.target}{' (applied)' if self.applied else ''}>"


class ImportHook(Patch):
    """Patch 1: the post-import finder on ``sys.meta_path``."""

    def _apply(self) -> None:
        _hook.install_hook(TGI_PACKAGE, _dispatch, HOOK_OWNER)

    def _revert(self) -> None:
        _hook.remove_hook(HOOK_OWNER)

    @property
    def present(self) -> bool:
        return _hook.find_hook(HOOK_OWNER) is not None


class RebindGlobals(Patch):
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


class WrapMethods(Patch):
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


def _attention_replacements() -> dict[str, Callable]:
    from . import attention

    return {"attention": attention.attention, "paged_attention": attention.paged_attention}


IMPORT_HOOK = ImportHook(
    "import hook",
    target=f"sys.meta_path (a post-import finder for {TGI_PACKAGE}.*)",
    why="TGI loads no plugins and binds its attention functions by name at import time",
    undo="uninstall() removes the finder; pip uninstall (or `uninstall-hook`) removes the .pth file",
    upstream="a plugin entry point or an attention-backend registry in TGI's server",
)
ATTENTION_FUNCTIONS = RebindGlobals(
    "attention functions",
    package=ATTENTION_PACKAGE,
    replacements=_attention_replacements,
    target=f"{ATTENTION_PACKAGE}.attention / .paged_attention and every by-name copy in {TGI_PACKAGE}.*",
    why="TGI picks one attention implementation per platform at import; there is no seam to select another",
    undo="uninstall() puts each recorded original back where our function is still bound",
    upstream="TGI calling attention through its package or a registry keyed by ATTENTION",
)


def _max_k_replacements() -> dict[str, Callable]:
    from . import speculative

    return {"paged_attention": speculative.with_full_max_k(sys.modules[ATTENTION_PACKAGE].paged_attention)}


def _speculation_wrappers() -> dict[str, Callable]:
    from . import speculative

    return {"__init__": speculative.wrap_init, "generate_token": speculative.wrap_generate_token}


SEQLEN_MAX_K = RebindGlobals(
    "Seqlen.max_k workaround",
    package=ATTENTION_PACKAGE,
    replacements=_max_k_replacements,
    target=f"{ATTENTION_PACKAGE}.paged_attention and its by-name copies (TGI's own, wrapped)",
    why="FlashCausalLM.forward leaves Seqlen.max_k short of the speculative tokens; IPEX flashdecoding crashes",
    undo="uninstall() puts each recorded original back where the wrapper is still bound",
    upstream="Seqlen(max_k=max_s) in the speculative branch of FlashCausalLM.forward",
)
DRAFT_SPECULATION = WrapMethods(
    "draft-model speculation",
    module=SPECULATION_MODULE,
    owner="FlashCausalLM",
    wrappers=_speculation_wrappers,
    target=f"{SPECULATION_MODULE}.FlashCausalLM.__init__ / .generate_token (class attributes)",
    why="TGI has no proposer interface; it fills batch.speculative_ids inside generate_token",
    undo="uninstall() sets the original methods back on the class and closes the proposers",
    upstream="a proposer interface in TGI (like vLLM's custom_class proposer)",
)

#: Every patch of this adapter, in the order they are applied (reverted last first).
LEDGER: tuple[Patch, ...] = (IMPORT_HOOK, ATTENTION_FUNCTIONS, SEQLEN_MAX_K, DRAFT_SPECULATION)
#: What ACCEL_ATTENTION_BACKEND activates.
ATTENTION_PATCHES: tuple[Patch, ...] = (IMPORT_HOOK, ATTENTION_FUNCTIONS)
#: What ACCEL_DRAFT_CONFIG activates (SEQLEN_MAX_K follows per model, see speculative.attach).
SPECULATION_PATCHES: tuple[Patch, ...] = (IMPORT_HOOK, DRAFT_SPECULATION)


def apply(patches: Iterable[Patch]) -> None:
    """Apply ``patches`` in order; on failure, undo the ones this call applied."""
    done = []
    try:
        for patch in patches:
            if not patch.applied:
                patch.apply()
                done.append(patch)
    except BaseException:
        for patch in reversed(done):
            patch.revert()
        raise


def applied() -> list[Patch]:
    return [p for p in LEDGER if p.applied]


def uninstall() -> None:
    """Undo every applied patch, last applied first (also a hook left by the ``.pth``)."""
    for patch in reversed(LEDGER):
        patch.revert()
    _hook.remove_hook(HOOK_OWNER)


def install_import_hook() -> None:
    """Patch 1, and activation at once for the TGI modules already imported."""
    IMPORT_HOOK.apply()
    for name in (ATTENTION_PACKAGE, SPECULATION_MODULE):
        module = sys.modules.get(name)
        if module is not None:
            _dispatch(module)


def on_import(module: ModuleType) -> None:
    """A TGI module was imported: hand it to every applied patch."""
    for patch in LEDGER:
        if patch.applied:
            patch.on_import(module)


def _dispatch(module: ModuleType) -> None:
    """The import hook's callback: activation when the attention package or the
    module of FlashCausalLM arrives; every module to the applied patches."""
    if module.__name__ == ATTENTION_PACKAGE and not ATTENTION_FUNCTIONS.applied:
        from . import activate

        activate()  # reads ACCEL_ATTENTION_BACKEND; unset = nothing happens
        return
    if module.__name__ == SPECULATION_MODULE and not DRAFT_SPECULATION.applied:
        from . import activate_speculation

        activate_speculation()  # reads ACCEL_DRAFT_CONFIG; unset = nothing happens
    on_import(module)
