"""The TGI adapter's life in a process: activation when TGI imports its modules, uninstall.

The import hook (patch 1 of :mod:`._patches`, applied by :func:`install_import_hook`, which
the ``.pth`` line's trigger calls when TGI is first imported) calls :func:`activate` when TGI imports
its attention package and :func:`activate_speculation` when it imports the module of
``FlashCausalLM``; each validates its variable and applies its entries of the ledger.
:func:`attach_model` is what a wrapped ``FlashCausalLM.__init__`` calls (the
proposer's lifecycle is in :mod:`.speculative`). Importing this module imports
neither torch nor TGI.
"""

from __future__ import annotations

import sys

from . import _patches
from ._names import ATTENTION_PACKAGE, FRAMEWORK

__all__ = [
    "activate",
    "activate_speculation",
    "attach_model",
    "install_import_hook",
    "is_active",
    "speculation_stats",
    "uninstall",
]


def activate(setting: str | None = None) -> str | None:
    """Replace TGI's attention in this process; returns the backend name, or None.

    ``setting`` (``flash``, ``paged``, ``auto``) overrides ACCEL_ATTENTION_BACKEND;
    with neither, nothing happens. TGI's attention package must be imported (the
    import hook calls this at that moment). Activating again with the same choice
    is a no-op; another choice switches the backend. Raises
    :class:`accel_plugin.envs.EnvVarError` for a bad value and
    :class:`accel_plugin.attention.UnsupportedAttentionConfig` for a refusal.
    """
    from accel_plugin import envs
    from accel_plugin.attention import UnsupportedAttentionConfig
    from accel_plugin.plugins.manager import process_plugins
    from accel_plugin.plugins.selection import SelectionContext, select_attention_backend

    if setting is None:
        setting = envs.attention_backend()
    elif setting.strip().lower() not in envs.ATTENTION_BACKEND_CHOICES:
        raise envs.EnvVarError(envs.ACCEL_ATTENTION_BACKEND, setting, ", ".join(envs.ATTENTION_BACKEND_CHOICES))
    else:
        setting = setting.strip().lower()
    if setting is None:
        return None

    from . import _compat, attention

    package = sys.modules.get(ATTENTION_PACKAGE)
    if package is None:
        raise RuntimeError(f"import {ATTENTION_PACKAGE} before activating accel-plugin's TGI adapter "
                           "(or use install_import_hook())")
    _compat.check_version()
    mode = _compat.check_attention_mode()
    _compat.check_signatures(package)
    plugins = process_plugins()
    components = plugins.components(FRAMEWORK)
    device, capability = _compat.device()
    selection = select_attention_backend(
        SelectionContext(framework=FRAMEWORK, device=device, requested=setting,
                         block_size=_compat.block_size(), cuda_capability=capability),
        pm=plugins.pm,
        registries=plugins.registries,
        allowed=components.attention_backends,
    )
    if selection.backend is None:
        raise UnsupportedAttentionConfig(f"{selection.describe()}; {_compat.FALLBACK_HINT}")
    settings = attention.current()
    if settings is not None and settings.backend == selection.backend and _patches.ATTENTION_FUNCTIONS.applied:
        return selection.backend
    _patches.SEQLEN_MAX_K.revert()  # our functions never read Seqlen.max_k (the ledger, patch 3)
    attention.configure(attention.Settings(
        backend=selection.backend, setting=setting, attention_mode=mode, block_size=_compat.block_size(),
        rebound_modules=_patches.ATTENTION_FUNCTIONS.rebound_modules,
    ))
    try:
        _patches.apply(_patches.ATTENTION_PATCHES)
    except BaseException:
        attention.configure(None)
        raise
    _compat.logger().debug(
        f"accel-plugin: {selection.describe()}; ATTENTION={mode}; TGI {_compat.TGI_VERSION}; "
        f"rebound in {len(_patches.ATTENTION_FUNCTIONS.rebound_modules())} modules so far"
    )
    return selection.backend


def activate_speculation() -> bool:
    """Wrap TGI's ``FlashCausalLM`` so that models built from now on draft with the domain
    proposer (ACCEL_DRAFT_CONFIG; unset = nothing happens, returns False).

    The import hook calls this when TGI imports ``models.flash_causal_lm``; the YAML is
    read and checked when a model is built (:func:`.speculative.attach`), since the
    checks need the target and TGI's ``--speculate``.
    """
    from accel_plugin import envs

    if envs.draft_config_path() is None:
        return False
    from . import _compat

    _compat.check_version()

    _patches.apply(_patches.SPECULATION_PATCHES)
    return True


def attach_model(model) -> object:
    """A ``FlashCausalLM`` was built: attach its domain proposer (:func:`.speculative.attach`)."""
    from . import speculative

    return speculative.attach(model)


def speculation_stats(model=None) -> dict[str, dict]:
    """Per-domain counters of the domain proposer (``model``'s, or of every model in this
    process): state, k, drafted, accepted, alpha, costs; the vLLM adapter's format."""
    from . import speculative

    return speculative.collect_stats(model)


def is_active() -> bool:
    return _patches.ATTENTION_FUNCTIONS.applied


def uninstall() -> None:
    """Undo every patch of the ledger (TGI's functions back everywhere, hook removed) and
    close the models' draft proposers."""
    from . import attention

    _patches.uninstall()
    attention.configure(None)
    if "accel_plugin.adapters.tgi.speculative" in sys.modules:
        sys.modules["accel_plugin.adapters.tgi.speculative"].detach_all()


def install_import_hook() -> None:
    """Apply entry 1 of the ledger, the post-import finder: what the ``.pth`` line's trigger
    calls when TGI is first imported (call it yourself where the file is not installed,
    before TGI is imported); activates at once if TGI's attention package is already imported."""
    _patches.install_import_hook()
