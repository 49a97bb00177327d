"""The TGI adapter in an environment: its ``.pth`` file, and whether it can attach (:func:`status`).

Importing this module imports neither torch nor TGI.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from . import _patches

__all__ = ["hook_file", "install_hook_file", "remove_hook_file", "status"]


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
    from accel_plugin import envs

    from . import _compat
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
        "draft_config_env": envs.draft_config_path(env),
        "speculation_patched": _patches.DRAFT_SPECULATION.applied,
    }
