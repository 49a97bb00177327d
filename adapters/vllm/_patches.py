"""Every change accel-plugin makes to vLLM's state, with its ledger.

:data:`LEDGER` lists them, in the mechanism both adapters share
(:mod:`accel_plugin.adapters._ledger`; a test checks each is undone by :func:`undo_all`).
Each entry reads its state from vLLM (a ``ProbedPatch``):
:func:`accel_plugin.adapters.vllm.register` applies them through the functions of this
module; after a failed ``register()`` it calls :func:`undo_all`, which leaves vLLM
choosing as before.

1. Backend names (``register_backend``, vLLM's public API)
----------------------------------------------------------
target
    ``AttentionBackendEnum`` gains the members ``ACCEL_FLASH`` and ``ACCEL_PAGED``
    (``_compat.register_backend_name``). vLLM 0.32 adds new names itself
    (``register_backend("NAME", path)``); 0.30 and 0.31 cannot, and the adapter
    adds the members exactly as 0.32's ``AttentionBackendEnum.register`` does.
why
    so that ``--attention-backend ACCEL_FLASH`` parses and resolves to our class.
how it is undone
    vLLM has no way to remove an enum member, so the names stay; they resolve to
    our classes and are used only when requested by name (nothing selects them
    once the selector patch and the env choice are gone).
upstream change that would remove it
    none needed: this is vLLM's intended extension point (from 0.32 on).

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

4. The CPU rejection sampler's ``expand_batch_to_tokens`` (a monkeypatch, CPU only)
------------------------------------------------------------------------------------
target
    ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens``, replaced by
    :func:`expand_batch_to_tokens_torch` (the same result with
    ``repeat_interleave``), only when a probe on this process finds vLLM's own
    function wrong (:func:`expand_batch_to_tokens_broken`).
why
    it spreads each request's temperature (top-k, top-p) over its draft tokens
    before verification. vLLM CPU 0.32's C++ shim writes into an int64 copy of
    the output and never copies it back, so at temperature > 0 the drafts are
    verified against target probabilities from uninitialised memory: speculative
    sampling stops being lossless, for every proposer (greedy is unaffected).
    ``integration/test_vllm_speculative_sampling.py`` measures the distribution.
how it is undone
    :func:`uninstall_sampler_fix` puts vLLM's function back (``undo_all`` does).
upstream change that would remove it
    a fixed CPU ``expand_batch_to_tokens`` (vllm-project/vllm PR #42638 was
    closed unmerged); the probe then finds it correct and nothing is patched.
"""

from __future__ import annotations

import inspect

from .._ledger import Ledger, ProbedPatch
from . import _compat
from .backend import BACKEND_CLASS_PATHS

__all__ = [
    "LEDGER", "cpu_override_active", "expand_batch_to_tokens_broken", "expand_batch_to_tokens_torch",
    "install", "install_sampler_fix", "installed", "sampler_fix_installed", "set_env_choice", "undo_all",
    "uninstall", "uninstall_sampler_fix",
]

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


def expand_batch_to_tokens_torch(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """What vLLM's ``expand_batch_to_tokens`` computes: ``x[i]`` repeated for request
    ``i``'s tokens (``cu_num_tokens`` is cumulative), ``replace_from`` -> ``replace_to``."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def expand_batch_to_tokens_broken(function=None) -> bool:
    """Whether ``function`` (default: vLLM's, as installed) spreads float values wrongly."""
    import torch

    function = function or getattr(_compat.rejection_sampler_module(), _EXPAND, None)
    if function is None:
        return False
    x = torch.tensor([0.25, 0.0, 0.75], dtype=torch.float32)
    cu = torch.tensor([2, 3, 6], dtype=torch.int32)
    want = expand_batch_to_tokens_torch(x, cu, 6, replace_from=0, replace_to=1)
    try:
        return not torch.equal(function(x, cu, 6, replace_from=0, replace_to=1), want)
    except Exception:  # noqa: BLE001 - a function that cannot run this is broken too
        return True


_EXPAND = "expand_batch_to_tokens"


def sampler_fix_installed() -> bool:
    module = _compat.rejection_sampler_module()
    return hasattr(getattr(module, _EXPAND, None), _ORIGINAL_ATTR)


def install_sampler_fix(platform_cls=None) -> bool:
    """Patch 4: on the CPU platform, replace a broken ``expand_batch_to_tokens``.
    Returns True when the fix is in place (now or before)."""
    platform_cls = platform_cls or type(_compat.current_platform())
    if sampler_fix_installed():
        return True
    if not _compat.platform_ignores_selected_backend(platform_cls):  # the CPU platform only
        return False
    module = _compat.rejection_sampler_module()
    original = getattr(module, _EXPAND, None)
    if original is None or not expand_batch_to_tokens_broken(original):
        return False

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        return expand_batch_to_tokens_torch(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    expand_batch_to_tokens.__doc__ = (original.__doc__ or "") + "\n\n(replaced by accel-plugin: CPU fix)"
    setattr(expand_batch_to_tokens, _ORIGINAL_ATTR, original)
    setattr(module, _EXPAND, expand_batch_to_tokens)
    return True


def uninstall_sampler_fix() -> None:
    module = _compat.rejection_sampler_module()
    original = getattr(getattr(module, _EXPAND, None), _ORIGINAL_ATTR, None)
    if original is not None:
        setattr(module, _EXPAND, original)


def _register_backend_names() -> None:
    for name, class_path in BACKEND_CLASS_PATHS.items():
        _compat.register_backend_name(name, class_path)


def _names_registered() -> bool:
    return all(_compat.backend_member(name) is not None for name in BACKEND_CLASS_PATHS)


def _selector_installed() -> bool:
    return installed(type(_compat.current_platform()))


def _clear_cpu_override() -> None:
    _compat.override_cpu_backend(None)


#: Every change of this adapter to vLLM, in ledger order (the module docstring has the
#: details). Each entry reads its state from vLLM (``register()`` applies them through the
#: functions above); :func:`undo_all` reverts them.
LEDGER = Ledger(
    ProbedPatch(
        "backend names", probe=_names_registered, apply=_register_backend_names,
        target="AttentionBackendEnum.ACCEL_FLASH / ACCEL_PAGED",
        why="so that --attention-backend ACCEL_FLASH parses and resolves to our class",
        undo="cannot be removed from vLLM's enum; inert once patches 2 and 3 are undone",
        upstream="none needed: vLLM's register_backend (0.32 on) is the intended extension point"),
    ProbedPatch(
        "selector", probe=_selector_installed, apply=install, revert=uninstall,
        target=f"<current platform>.{_compat.SELECTOR_METHOD}",
        why="ACCEL_ATTENTION_BACKEND selects our backend with no other flag; the CPU platform ignores the "
            "requested backend",
        undo="uninstall()",
        upstream="a platform-independent default backend for general plugins; the CPU platform honouring "
                 "selected_backend"),
    ProbedPatch(
        "CPU backend override", probe=cpu_override_active, revert=_clear_cpu_override,
        target="AttentionBackendEnum.CPU_ATTN",
        why="parts of vLLM's CPU worker resolve CPU_ATTN directly, not through the selector",
        undo="override_cpu_backend(None)",
        upstream="the CPU platform honouring selected_backend"),
    ProbedPatch(
        "CPU sampler fix", probe=sampler_fix_installed, apply=install_sampler_fix, revert=uninstall_sampler_fix,
        target="vllm.v1.sample.rejection_sampler.expand_batch_to_tokens",
        why="vLLM CPU 0.32's expand_batch_to_tokens leaves the drafts' temperatures unset: sampling stops "
            "being lossless",
        undo="uninstall_sampler_fix()",
        upstream="a fixed CPU expand_batch_to_tokens (vllm-project/vllm PR #42638 was closed unmerged)"),
)


def undo_all(platform_cls=None) -> None:
    """Undo patches 2, 3 and 4 (patch 1 cannot be undone, see the ledger); ``platform_cls``:
    a platform class whose selector is patched besides the current platform's."""
    set_env_choice(None)
    if platform_cls is not None:
        uninstall(platform_cls)
    LEDGER.undo_all()
