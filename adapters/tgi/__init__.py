"""TGI adapter (installed as ``accel_plugin.adapters.tgi``): our attention and draft models inside TGI.

TGI (text-generation-inference v3.3.7) loads no plugins, so activation needs no
change to TGI or its launcher but an import hook:

1. The wheel installs ``accel_plugin_tgi.pth`` into site-packages (an editable
   install does not: run ``python -m accel_plugin.adapters.tgi install-hook``).
   While ``ACCEL_ATTENTION_BACKEND`` and ``ACCEL_DRAFT_CONFIG`` are unset it does
   nothing at all; when one is set, it puts a post-import hook for
   ``text_generation_server.*`` on ``sys.meta_path`` (:mod:`._startup`, :mod:`._hook`).
2. When TGI imports ``text_generation_server.layers.attention``, the hook calls
   :func:`activate`: it validates the variable (:mod:`accel_plugin.envs`), TGI's
   ``ATTENTION`` (``paged`` or ``flashdecoding-ipex``) and TGI's function signatures,
   builds the process's accel plugins once (:func:`accel_plugin.plugins.manager.process_plugins`),
   asks them what they offer to ``"tgi"`` and selects the backend
   (:func:`accel_plugin.plugins.selection.select_attention_backend`). A refusal raises, so
   TGI does not start with an attention it was not asked for; the message names the
   supported values and the way back (unset the variable).
3. It then applies :data:`._patches.ATTENTION_PATCHES` (the ledger is in
   :mod:`._patches`): ``attention``/``paged_attention`` are rebound in the package and
   in every ``text_generation_server`` module that holds them by name, including
   modules imported later. The first call logs one INFO line through TGI's loguru
   logger (backend, ATTENTION, module count, kernel mode).
4. When TGI imports ``text_generation_server.models.flash_causal_lm`` with
   ``ACCEL_DRAFT_CONFIG`` set, :func:`activate_speculation` wraps
   ``FlashCausalLM.__init__`` and ``.generate_token`` (:data:`._patches.SPECULATION_PATCHES`):
   each model built afterwards validates the draft YAML against itself and TGI's
   ``--speculate``, and drafts with the domain proposer (:mod:`.speculative`);
   :func:`speculation_stats` reads its per-domain counters.

:func:`uninstall` restores every original. Importing this package imports neither
torch nor TGI.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "FRAMEWORK",
    "activate",
    "activate_speculation",
    "hook_file",
    "install_hook_file",
    "install_import_hook",
    "is_active",
    "remove_hook_file",
    "speculation_stats",
    "status",
    "uninstall",
]

#: The name this adapter asks the accel plugins about (``AdapterComponents.framework``).
FRAMEWORK = "tgi"


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

    from . import _compat, _patches, attention

    package = sys.modules.get(_patches.ATTENTION_PACKAGE)
    if package is None:
        raise RuntimeError(f"import {_patches.ATTENTION_PACKAGE} before activating accel-plugin's TGI adapter "
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
    from . import _compat, _patches

    _compat.check_version()

    _patches.apply(_patches.SPECULATION_PATCHES)
    return True


def speculation_stats(model=None) -> dict[str, dict]:
    """Per-domain counters of the domain proposer (``model``'s, or of every model in this
    process): state, k, drafted, accepted, alpha, costs; the vLLM adapter's format."""
    from . import speculative

    return speculative.collect_stats(model)


def is_active() -> bool:
    from . import _patches

    return _patches.ATTENTION_FUNCTIONS.applied


def uninstall() -> None:
    """Undo every patch of the ledger (TGI's functions back everywhere, hook removed) and
    close the models' draft proposers."""
    from . import _patches, attention

    _patches.uninstall()
    attention.configure(None)
    if "accel_plugin.adapters.tgi.speculative" in sys.modules:
        sys.modules["accel_plugin.adapters.tgi.speculative"].detach_all()


def install_import_hook() -> None:
    """What the ``.pth`` file does (use it where the file is not installed, before TGI is
    imported); activates at once if TGI's attention package is already imported."""
    from . import _patches

    _patches.install_import_hook()


def hook_file(site_dir: str | os.PathLike | None = None) -> Path:
    """Where the ``.pth`` file goes: this interpreter's site-packages (purelib) by default."""
    from ._startup import PTH_NAME

    return Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME


def install_hook_file(site_dir: str | os.PathLike | None = None) -> Path:
    """Write the ``.pth`` file (for editable installs, which do not carry it)."""
    from ._startup import PTH_LINE

    path = hook_file(site_dir)
    path.write_text(PTH_LINE, encoding="utf-8")
    return path


def remove_hook_file(site_dir: str | os.PathLike | None = None) -> bool:
    path = hook_file(site_dir)
    if path.exists():
        path.unlink()
        return True
    return False


def status(site_dir: str | os.PathLike | None = None, environ=None) -> dict:
    """Whether the adapter can attach in this environment (plain data; imports torch, not TGI).

    ``hook_file``: the ``.pth`` path and whether it is there with our line;
    ``hook_in_process`` / ``active``: this process; ``attention_env``: TGI's
    ``ATTENTION`` variable in ``environ`` (default ``os.environ``; TGI's launcher sets
    it for its server), and whether the adapter supports it; ``draft_config_env``:
    ACCEL_DRAFT_CONFIG; ``speculation_patched``: this process wraps FlashCausalLM.
    """
    from . import _compat, _patches
    from ._startup import PTH_LINE

    path = hook_file(site_dir)
    content = path.read_text(encoding="utf-8") if path.exists() else None
    env = os.environ if environ is None else environ
    mode = env.get("ATTENTION")
    supported = _compat.SUPPORTED_ATTENTION
    return {
        "hook_file": str(path),
        "hook_file_installed": content == PTH_LINE,
        "hook_file_stale": content is not None and content != PTH_LINE,
        "hook_in_process": _patches.IMPORT_HOOK.present,
        "active": _patches.ATTENTION_FUNCTIONS.applied,
        "attention_env": mode,
        "attention_env_supported": None if mode is None else mode in supported,
        "supported_attention": list(supported),
        "draft_config_env": env.get("ACCEL_DRAFT_CONFIG") or None,
        "speculation_patched": _patches.DRAFT_SPECULATION.applied,
    }
