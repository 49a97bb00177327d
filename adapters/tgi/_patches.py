"""Every change accel-plugin makes to TGI's state, with its ledger.

TGI has no plugin entry point and imports its attention functions by name, so the
adapter works by import hook and monkeypatch. :data:`LEDGER` lists the patches, in
the order they stack, in the mechanism both adapters share
(:mod:`accel_plugin.adapters._ledger`; the kinds of patch are in :mod:`._patch_kinds`,
the functions patches 3 and 4 put into TGI in :mod:`._wrappers`); a contract test
applies and undoes each. :func:`accel_plugin.adapters.tgi.activate` installs
:data:`ATTENTION_PATCHES` (ACCEL_ATTENTION_BACKEND),
:func:`accel_plugin.adapters.tgi.activate_speculation` :data:`SPECULATION_PATCHES`
(ACCEL_DRAFT_CONFIG), and a model that starts speculating while TGI's own attention
is in use applies patch 3. :func:`uninstall` undoes every applied patch, in reverse
ledger order. Installing an applied patch again is a no-op.

The bodies of patches 1 and 4 call the adapter's lifecycle (activation, attaching a
model's proposer), which applies entries of this ledger: the package connects those
functions when it is imported (:func:`connect`), so that this module imports nothing
above it.

1. The import hook (``sys.meta_path``)
--------------------------------------
target
    ``sys.meta_path`` gains a :class:`._hook.PostImportFinder` for
    ``text_generation_server.*``; it changes no module itself. Before it, while
    ACCEL_ATTENTION_BACKEND or ACCEL_DRAFT_CONFIG is set, the ``.pth`` line puts
    its trigger first on ``sys.meta_path`` (:data:`._startup.TRIGGER_SOURCE`:
    standard library only, it imports nothing until TGI is imported).
why
    TGI's launcher starts ``text-generation-server`` from PATH and TGI loads no
    plugins; its ~20 modeling modules bind ``attention``/``paged_attention`` by name
    when they are imported. The trigger waits in every process of the environment,
    at the cost of one string comparison per import; when ``text_generation_server``
    is imported (or found imported) it removes itself and applies this entry
    (:func:`install_import_hook`). The hook then activates the attention when TGI
    imports ``text_generation_server.layers.attention``, the speculation when it
    imports ``text_generation_server.models.flash_causal_lm``, and hands every later
    TGI module to the applied patches (:func:`on_import`).
how it is undone
    :func:`uninstall` takes the finder, and a trigger that never fired, off
    ``sys.meta_path``; the trigger removes itself when it fires; ``pip uninstall
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
    :func:`._wrappers.with_full_max_k`: ``seqlen.max_k = max(seqlen.max_k, max_s)``
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
    inherit the wrappers), wrapped by :func:`._wrappers.wrap_init` and
    :func:`._wrappers.wrap_generate_token`. Applied when TGI imports that module
    while ACCEL_DRAFT_CONFIG is set (:func:`accel_plugin.adapters.tgi.activate_speculation`).
why
    TGI proposes only n-gram, Medusa or MLP-speculator tokens, and has no seam for a
    proposer: it fills ``batch.speculative_ids`` inside ``generate_token``. The
    ``__init__`` wrapper builds and validates the domain proposer of each model
    (:func:`.speculative.attach`); the ``generate_token`` wrapper replaces the ids
    TGI just proposed for the next step with the proposer's drafts (``None`` after
    a prefill, or when no request drafts: a plain step), and before a decode step
    widens ``all_input_ids_tensor`` where ``concatenate`` sized it by a narrower
    draft width than ``--speculate``. On a CPU in float32, ``attach`` also prepacks
    the model's ``FastLinear`` matrices for oneDNN (:mod:`.packed_linears`: torch's
    ``F.linear`` repacks the weights for every multi-row product, so verifying one
    draft token cost 40% of a step at batch 1).
how it is undone
    :func:`revert` sets the original functions back on the class where our wrapper
    is still there; models keep their proposer attribute, unused (``uninstall()``
    also detaches them: proposers closed, packed matrices unpacked bit for bit and
    TGI's ``FastLinear.forward`` back).
upstream change that would remove it
    a proposer interface in TGI (e.g. ``--speculate N --speculator-class module:Class``
    called with the next batch after each step), as vLLM's ``custom_class``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from .._ledger import Ledger
from . import _hook, _wrappers
from ._names import ATTENTION_PACKAGE, HOOK_OWNER, SPECULATION_MODULE, TGI_PACKAGE
from ._patch_kinds import ImportHook, RebindGlobals, TGIPatch, WrapMethods

__all__ = [
    "ATTENTION_FUNCTIONS",
    "ATTENTION_PATCHES",
    "DRAFT_SPECULATION",
    "IMPORT_HOOK",
    "LEDGER",
    "SEQLEN_MAX_K",
    "SPECULATION_PATCHES",
    "applied",
    "apply",
    "connect",
    "install_import_hook",
    "on_import",
    "uninstall",
]

#: The adapter's lifecycle functions that the bodies of patches 1 and 4 call (they apply
#: entries of this ledger, so they live above it); set by :func:`connect`.
_lifecycle: dict[str, Callable] = {}


def connect(*, activate: Callable[[], object], activate_speculation: Callable[[], object],
            attach: Callable[[Any], object]) -> None:
    """Give the ledger the functions its patch bodies call: ``activate()`` and
    ``activate_speculation()`` (the import hook, when TGI imports the attention package or
    the module of FlashCausalLM) and ``attach(model)`` (after ``FlashCausalLM.__init__``).
    The package :mod:`accel_plugin.adapters.tgi` calls this when it is imported."""
    _lifecycle.update(activate=activate, activate_speculation=activate_speculation, attach=attach)


def _call(name: str, *args: Any) -> object:
    try:
        function = _lifecycle[name]
    except KeyError:
        raise RuntimeError(f"the TGI patch ledger is not connected to the adapter ({name}): "
                           "import accel_plugin.adapters.tgi") from None
    return function(*args)


def _attention_replacements() -> dict[str, Callable]:
    from . import attention

    return {"attention": attention.attention, "paged_attention": attention.paged_attention}


def _max_k_replacements() -> dict[str, Callable]:
    return {"paged_attention": _wrappers.with_full_max_k(sys.modules[ATTENTION_PACKAGE].paged_attention)}


def _speculation_wrappers() -> dict[str, Callable]:
    return {"__init__": lambda original: _wrappers.wrap_init(original, lambda model: _call("attach", model)),
            "generate_token": _wrappers.wrap_generate_token}


def _dispatch(module: ModuleType) -> None:
    """The import hook's callback: activation when the attention package or the
    module of FlashCausalLM arrives; every module to the applied patches."""
    if module.__name__ == ATTENTION_PACKAGE and not ATTENTION_FUNCTIONS.applied:
        _call("activate")  # reads ACCEL_ATTENTION_BACKEND; unset = nothing happens
        return
    if module.__name__ == SPECULATION_MODULE and not DRAFT_SPECULATION.applied:
        _call("activate_speculation")  # reads ACCEL_DRAFT_CONFIG; unset = nothing happens
    on_import(module)


IMPORT_HOOK = ImportHook(
    "import hook",
    callback=_dispatch,
    target=f"sys.meta_path (the .pth line's trigger until TGI is imported, then a post-import finder "
           f"for {TGI_PACKAGE}.*)",
    why="TGI loads no plugins and binds its attention functions by name at import time",
    undo="uninstall() removes the finder (and a .pth trigger that never fired; one that fired removed itself); "
         "pip uninstall (or `uninstall-hook`) removes the .pth file",
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
LEDGER = Ledger(IMPORT_HOOK, ATTENTION_FUNCTIONS, SEQLEN_MAX_K, DRAFT_SPECULATION)
#: What ACCEL_ATTENTION_BACKEND activates.
ATTENTION_PATCHES: tuple[TGIPatch, ...] = (IMPORT_HOOK, ATTENTION_FUNCTIONS)
#: What ACCEL_DRAFT_CONFIG activates (SEQLEN_MAX_K follows per model, see speculative.attach).
SPECULATION_PATCHES: tuple[TGIPatch, ...] = (IMPORT_HOOK, DRAFT_SPECULATION)


def apply(patches: Iterable[TGIPatch]) -> None:
    """Apply ``patches`` in order; on failure, undo the ones this call applied."""
    LEDGER.apply(patches)


def applied() -> list[TGIPatch]:
    return LEDGER.applied()  # type: ignore[return-value]


def uninstall() -> None:
    """Undo every applied patch, last applied first (also the ``.pth`` line's trigger, or a
    hook installed by another copy of this module)."""
    LEDGER.undo_all()
    _hook.remove_hook(HOOK_OWNER)
    _hook.remove_trigger(HOOK_OWNER)


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
            patch.on_import(module)  # type: ignore[attr-defined]
