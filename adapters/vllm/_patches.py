"""Every change accel-plugin makes to vLLM's state, with its ledger.

:data:`LEDGER` lists them (a test checks each is undone by :func:`undo_all`).
:func:`accel_plugin.adapters.vllm.register` applies them; after a failed
``register()`` it calls :func:`undo_all`, which leaves vLLM choosing as before.

1. Backend names (``register_backend``, vLLM's public API)
----------------------------------------------------------
target
    ``AttentionBackendEnum`` gains the members ``ACCEL_FLASH`` and ``ACCEL_PAGED``
    (``_compat.register_backend_name``).
why
    so that ``--attention-backend ACCEL_FLASH`` parses and resolves to our class.
how it is undone
    vLLM has no way to remove an enum member, so the names stay; they resolve to
    our classes and are used only when requested by name (nothing selects them
    once the selector patch and the env choice are gone).
upstream change that would remove it
    none needed: this is vLLM's intended extension point.

2. The selector: the current platform's ``get_attn_backend_cls`` (a monkeypatch)
--------------------------------------------------------------------------------
target
    ``type(vllm.platforms.current_platform).get_attn_backend_cls``, a classmethod
    (see ``_compat.SELECTOR_METHOD``).
why
    1. ``ACCEL_ATTENTION_BACKEND`` must select our backend with no other flag. On
       CUDA, vLLM only ranks its built-in backends when nothing is requested; the
       patch passes our backend as the requested one, so vLLM's own CUDA code
       validates it (``validate_configuration``) and returns its class path.
    2. The CPU platform ignores the requested backend. For a request naming an
       accel backend (from the variable or ``--attention-backend ACCEL_FLASH``)
       the patch runs the same ``validate_configuration`` check and returns our
       class path; an unsupported configuration (MLA, fp8 KV cache, head size ...)
       raises at start-up with the reasons, as vLLM does on CUDA.
    Requests that name no accel backend go to vLLM's method unchanged.
how it is undone
    :func:`uninstall` restores the original attribute (and :func:`set_env_choice`
    with ``None`` forgets the variable's choice). Installing twice is a no-op.
upstream change that would remove it
    a platform-independent way for a general plugin to set the default attention
    backend, and the CPU platform honouring ``selected_backend`` for backends
    registered with ``register_backend`` (then only patch 1 is needed).

3. The CPU backend override (``register_backend(CPU_ATTN, ...)``, vLLM's public API)
------------------------------------------------------------------------------------
target
    ``AttentionBackendEnum.CPU_ATTN`` resolves to our backend class
    (``_compat.override_cpu_backend``); only on the CPU platform and only when
    ``ACCEL_ATTENTION_BACKEND`` selected a backend.
why
    parts of vLLM's CPU worker resolve ``CPU_ATTN`` directly, not through the
    selector; the override makes them see the backend the variable chose.
how it is undone
    ``override_cpu_backend(None)`` (vLLM's ``clear_override``), done by
    :func:`undo_all` when the override points at one of our classes.
upstream change that would remove it
    the CPU platform honouring ``selected_backend`` (as for patch 2).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from . import _compat
from .backend import BACKEND_CLASS_PATHS

__all__ = [
    "LEDGER", "Patch", "cpu_override_active", "install", "installed", "set_env_choice", "undo_all",
    "uninstall",
]


@dataclass(frozen=True)
class Patch:
    """One entry of the ledger (the module docstring has the details)."""

    name: str
    target: str
    undo: str


LEDGER = (
    Patch("backend names", "AttentionBackendEnum.ACCEL_FLASH / ACCEL_PAGED",
          "cannot be removed from vLLM's enum; inert once patches 2 and 3 are undone"),
    Patch("selector", f"<current platform>.{_compat.SELECTOR_METHOD}", "uninstall()"),
    Patch("CPU backend override", "AttentionBackendEnum.CPU_ATTN", "override_cpu_backend(None)"),
)

_ORIGINAL_ATTR = "__accel_original__"
_state: dict[str, object] = {"env_choice": None, "env_setting": None, "warned": set()}


def set_env_choice(backend: str | None, setting: str | None = None) -> None:
    """The accel backend that ``ACCEL_ATTENTION_BACKEND`` selected in this process (or None)."""
    _state["env_choice"] = backend
    _state["env_setting"] = setting


def _requested(selected_backend) -> str | None:
    """The accel backend this selection should return, or None to leave it to vLLM."""
    env_choice = _state["env_choice"]
    name = getattr(selected_backend, "name", None)
    if env_choice is not None:
        if name is not None and name != env_choice and name not in _state["warned"]:
            _state["warned"].add(name)  # type: ignore[attr-defined]
            _compat.logger.warning(
                "ACCEL_ATTENTION_BACKEND=%s selects %s; it takes precedence over the requested "
                "attention backend %s (unset the variable to use %s)",
                _state["env_setting"], env_choice, name, name,
            )
        return env_choice  # type: ignore[return-value]
    if name in BACKEND_CLASS_PATHS:
        return name
    return None


def _validate_here(name: str, attn_selector_config) -> str:
    """What vLLM's CUDA platform does for a selected backend, for platforms that skip it."""
    path = BACKEND_CLASS_PATHS[name]
    backend_cls = _compat.resolve_obj_by_qualname(path)
    reasons = backend_cls.validate_configuration(
        device_capability=None, **attn_selector_config._asdict()
    )
    if reasons:
        raise ValueError(
            f"Selected backend {name} is not valid for this configuration. Reason: {reasons}"
        )
    return path


def _wrap(original_func):
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, *args, **kwargs):
        name = _requested(selected_backend)
        if name is None:
            return original_func(cls, selected_backend, attn_selector_config, *args, **kwargs)
        if _compat.platform_ignores_selected_backend(cls):
            return _validate_here(name, attn_selector_config)
        member = _compat.backend_member(name)
        return original_func(cls, member, attn_selector_config, *args, **kwargs)

    get_attn_backend_cls.__doc__ = (original_func.__doc__ or "") + "\n\n(wrapped by accel-plugin)"
    setattr(get_attn_backend_cls, _ORIGINAL_ATTR, original_func)
    return get_attn_backend_cls


def installed(platform_cls) -> bool:
    attr = inspect.getattr_static(platform_cls, _compat.SELECTOR_METHOD)
    return hasattr(getattr(attr, "__func__", None), _ORIGINAL_ATTR)


def install(platform_cls=None) -> type:
    """Wrap the selector of ``platform_cls`` (default: vLLM's current platform)."""
    platform_cls = platform_cls or type(_compat.current_platform())
    if installed(platform_cls):
        return platform_cls
    attr = inspect.getattr_static(platform_cls, _compat.SELECTOR_METHOD)
    if not isinstance(attr, classmethod):
        raise TypeError(
            f"{platform_cls.__name__}.{_compat.SELECTOR_METHOD} is not a classmethod in this "
            f"vLLM version ({_compat.VLLM_VERSION}); accel-plugin's selector patch needs updating"
        )
    setattr(platform_cls, _compat.SELECTOR_METHOD, classmethod(_wrap(attr.__func__)))
    return platform_cls


def uninstall(platform_cls=None) -> None:
    """Restore vLLM's selector on ``platform_cls`` (default: the current platform)."""
    platform_cls = platform_cls or type(_compat.current_platform())
    attr = platform_cls.__dict__.get(_compat.SELECTOR_METHOD)
    original = getattr(getattr(attr, "__func__", None), _ORIGINAL_ATTR, None)
    if original is None:
        return
    # Put back exactly what was there: the class's own classmethod, or nothing (inherited).
    base = inspect.getattr_static(platform_cls.__mro__[1], _compat.SELECTOR_METHOD, None)
    if base is not None and getattr(base, "__func__", None) is original:
        delattr(platform_cls, _compat.SELECTOR_METHOD)
    else:
        setattr(platform_cls, _compat.SELECTOR_METHOD, classmethod(original))


def cpu_override_active() -> bool:
    """``CPU_ATTN`` currently resolves to one of our backend classes (patch 3)."""
    return _compat.AttentionBackendEnum.CPU_ATTN.get_path() in BACKEND_CLASS_PATHS.values()


def undo_all(platform_cls=None) -> None:
    """Undo patches 2 and 3 (patch 1 cannot be undone, see the ledger)."""
    set_env_choice(None)
    uninstall(platform_cls)
    if cpu_override_active():
        _compat.override_cpu_backend(None)
