"""Every change accel-plugin makes to vLLM's state and to the process it runs in, with its ledger.

:data:`LEDGER` lists them, in the mechanism both adapters share
(:mod:`accel_plugin.adapters._ledger`; tests/adapters/test_ledger.py applies and undoes
every entry). None is applied while no accel variable is set. Each entry reads its
state from vLLM or the process (a ``ProbedPatch``):
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
    ``repeat_interleave``; :mod:`._sampler_fix`), only when ``ACCEL_DRAFT_CONFIG``
    asks for speculation and a probe on this process finds vLLM's own function
    wrong (:func:`expand_batch_to_tokens_broken`).
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

5. to 7. Live metrics: ``ACCEL_METRICS_DIR``, a collector, an ``atexit`` hook
-----------------------------------------------------------------------------
target
    5: ``os.environ["ACCEL_METRICS_DIR"]``, set to a temporary directory made here
    (only when the variable is unset); 6: ``prometheus_client.REGISTRY`` gains a
    ``FileCollector`` of that directory; 7: an ``atexit`` handler that removes the
    temporary directory. The steps are the core's
    (:class:`accel_plugin.observability.metrics_files.ProcessSetup`), applied here by
    :func:`accel_plugin.adapters.vllm.metrics.setup` (:mod:`._process_state`).
why
    the worker writes the metric files, the API server's ``/metrics`` serves
    ``prometheus_client.REGISTRY``; the children find the directory in the variable.
how it is undone
    7: ``atexit.unregister``; 6: ``REGISTRY.unregister``; 5: the variable unset and
    the directory removed (a directory the user named stays).
upstream change that would remove it
    a metrics hook for general plugins in vLLM.

8. vLLM's Ray prefix list (``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``)
------------------------------------------------------------------------
target
    ``os.environ["VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"]`` gains ``ACCEL_``
    (``_compat.carry_settings_to_ray_workers``), only when a setting asks for something.
why
    vLLM's Ray executor copies only the variables it lists to its workers (other
    nodes included); the multiprocess executor's children inherit them anyway.
how it is undone
    the variable's previous value is put back (unset if it was).
upstream change that would remove it
    vLLM copying the variables of general plugins to Ray workers.

9. The rejection sampler on steps with no draft (a monkeypatch, ``ACCEL_DRAFT_CONFIG`` only)
---------------------------------------------------------------------------------------------
target
    ``vllm.v1.sample.rejection_sampler.RejectionSampler.forward``, wrapped
    (:mod:`._no_draft_sampling`), only when ``ACCEL_DRAFT_CONFIG`` asks for speculation
    and vLLM's signatures are the ones the wrapper is written for.
why
    when the step gate switches drafting off, vLLM still sends every step through the
    rejection sampler, which copies the whole logits twice more than plain sampling:
    0.46 ms against 0.14 ms at batch 8 and 8.2 ms against 1.4 ms at batch 64 on the
    2-core CPU (SmolLM2's 49152-token vocabulary; ``python -m benchmarks.no_draft_sampling``). A step with no draft for any row and
    no logprobs requested gets the sampler's own output, the bonus token the rejection
    sampler would return (the same call, the same generators); every other step runs
    vLLM's method unchanged.
how it is undone
    :func:`uninstall_no_draft_sampling` puts vLLM's method back (``undo_all`` does).
upstream change that would remove it
    vLLM's model runner using its plain sampler for a speculative step with no drafts.

10. The CPU linear dispatch while our proposer's target loads (a monkeypatch, :mod:`.packed_linears`)
----------------------------------------------------------------------------------------------------
target
    ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``, wrapped by our proposer's constructor
    (CPU, float32, ``ACCEL_VLLM_PREPACK`` not off), put back by its ``load_model``: that engine's
    layers get a ``cpu_linear`` choosing by row count between vLLM's product and a native copy.
why
    verifying drafts multiplies 1 to 64 rows per matrix, where the native product beats oneDNN's.
how it is undone
    :func:`.packed_linears.disarm` puts vLLM's function back (``undo_all`` does); loaded layers keep theirs.
upstream change that would remove it
    a few-row float32 product in vLLM's CPU build as fast as the native one.
"""

from __future__ import annotations

import inspect

from .._ledger import Ledger, ProbedPatch
from . import _compat, _process_state, packed_linears
from ._no_draft_sampling import (
    install_no_draft_sampling,
    no_draft_sampling_installed,
    rejection_forward,
    uninstall_no_draft_sampling,
)
from ._sampler_fix import (
    expand_batch_to_tokens_broken,
    expand_batch_to_tokens_torch,
    install_sampler_fix,
    sampler_fix_installed,
    sampler_function,
    uninstall_sampler_fix,
)
from .backend import BACKEND_CLASS_PATHS

__all__ = [
    "CPU_OVERRIDE", "LEDGER", "METRICS_PATCHES", "NO_DRAFT_SAMPLING", "RAY_ENVIRONMENT", "SAMPLER_FIX", "TARGET_COPIES",
    "cpu_override_active", "expand_batch_to_tokens_broken", "expand_batch_to_tokens_torch", "install",
    "install_no_draft_sampling", "install_sampler_fix", "installed", "no_draft_sampling_installed",
    "sampler_fix_installed", "set_env_choice", "undo_all", "uninstall", "uninstall_no_draft_sampling",
    "uninstall_sampler_fix",
]

_ORIGINAL_ATTR = "__accel_original__"
#: the platform class's own attribute before the patch (None: it inherited the method)
_OWN_ATTR = "__accel_original_own__"
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


def _wrap(original_func, own_attr):
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
    setattr(get_attn_backend_cls, _OWN_ATTR, own_attr)
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
    own = platform_cls.__dict__.get(_compat.SELECTOR_METHOD)
    setattr(platform_cls, _compat.SELECTOR_METHOD, classmethod(_wrap(attr.__func__, own)))
    return platform_cls


def uninstall(platform_cls=None) -> None:
    """Restore vLLM's selector on ``platform_cls`` (default: the current platform)."""
    platform_cls = platform_cls or type(_compat.current_platform())
    attr = platform_cls.__dict__.get(_compat.SELECTOR_METHOD)
    wrapper = getattr(attr, "__func__", None)
    if not hasattr(wrapper, _ORIGINAL_ATTR):
        return
    own = getattr(wrapper, _OWN_ATTR)
    if own is None:  # it was inherited: inherit it again
        delattr(platform_cls, _compat.SELECTOR_METHOD)
    else:  # the identical object that was there
        setattr(platform_cls, _compat.SELECTOR_METHOD, own)


def cpu_override_active() -> bool:
    """``CPU_ATTN`` currently resolves to one of our backend classes (patch 3)."""
    return _compat.AttentionBackendEnum.CPU_ATTN.get_path() in BACKEND_CLASS_PATHS.values()


def _register_backend_names() -> None:
    for name, class_path in BACKEND_CLASS_PATHS.items():
        _compat.register_backend_name(name, class_path)


def _names_registered() -> bool:
    return all(_compat.backend_member(name) is not None for name in BACKEND_CLASS_PATHS)


def _selector_installed() -> bool:
    return installed(type(_compat.current_platform()))


def _selector_state():
    return type(_compat.current_platform()).__dict__.get(_compat.SELECTOR_METHOD)


def _override_cpu_backend() -> None:
    """Point ``CPU_ATTN`` at the backend ``ACCEL_ATTENTION_BACKEND`` chose (:func:`set_env_choice`)."""
    if _state["env_choice"] is None:
        raise ValueError("no accel backend is chosen (set_env_choice) to override CPU_ATTN with")
    _compat.override_cpu_backend(BACKEND_CLASS_PATHS[_state["env_choice"]])


def _clear_cpu_override() -> None:
    _compat.override_cpu_backend(None)


#: Every change of this adapter to vLLM and to the process, in ledger order (the module
#: docstring has the details). Each entry reads its state from vLLM or the process;
#: ``register()`` applies them (:func:`accel_plugin.adapters.vllm.register`), :func:`undo_all`
#: reverts them.
BACKEND_NAMES = ProbedPatch(
    "backend names", probe=_names_registered, apply=_register_backend_names,
    state=lambda: tuple(_compat.backend_member(name) for name in BACKEND_CLASS_PATHS),
    target="AttentionBackendEnum.ACCEL_FLASH / ACCEL_PAGED",
    why="so that --attention-backend ACCEL_FLASH parses and resolves to our class",
    undo="cannot be removed from vLLM's enum; inert once patches 2 and 3 are undone",
    upstream="none needed: vLLM's register_backend (0.32 on) is the intended extension point")
SELECTOR = ProbedPatch(
    "selector", probe=_selector_installed, apply=install, revert=uninstall, state=_selector_state,
    target=f"<current platform>.{_compat.SELECTOR_METHOD}",
    why="ACCEL_ATTENTION_BACKEND selects our backend with no other flag; the CPU platform ignores the "
        "requested backend",
    undo="uninstall(): the platform class's own attribute back, or none (inherited)",
    upstream="a platform-independent default backend for general plugins; the CPU platform honouring "
             "selected_backend")
CPU_OVERRIDE = ProbedPatch(
    "CPU backend override", probe=cpu_override_active, apply=_override_cpu_backend, revert=_clear_cpu_override,
    state=lambda: _compat.AttentionBackendEnum.CPU_ATTN.get_path(),
    target="AttentionBackendEnum.CPU_ATTN",
    why="parts of vLLM's CPU worker resolve CPU_ATTN directly, not through the selector",
    undo="override_cpu_backend(None)",
    upstream="the CPU platform honouring selected_backend")
SAMPLER_FIX = ProbedPatch(
    "CPU sampler fix", probe=sampler_fix_installed, apply=install_sampler_fix, revert=uninstall_sampler_fix,
    state=sampler_function,
    target="vllm.v1.sample.rejection_sampler.expand_batch_to_tokens (only with ACCEL_DRAFT_CONFIG set)",
    why="vLLM CPU 0.32's expand_batch_to_tokens leaves the drafts' temperatures unset: sampling stops "
        "being lossless",
    undo="uninstall_sampler_fix()",
    upstream="a fixed CPU expand_batch_to_tokens (vllm-project/vllm PR #42638 was closed unmerged)")
METRICS_DIR = ProbedPatch(
    "metrics directory", probe=_process_state.metrics_dir_exported, apply=_process_state.export_metrics_dir,
    revert=_process_state.unexport_metrics_dir, state=_process_state.metrics_dir_state,
    target="os.environ['ACCEL_METRICS_DIR'] and the temporary directory it names",
    why="vLLM's worker writes the metric files its API server's /metrics serves; children inherit the variable",
    undo="ProcessSetup.unexport_dir(): the variable unset and the directory removed (only one it made)",
    upstream="a metrics hook for general plugins in vLLM (then vLLM's own multiprocess registry carries them)")
METRICS_COLLECTOR = ProbedPatch(
    "metrics collector", probe=_process_state.collector_registered, apply=_process_state.register_collector,
    revert=_process_state.unregister_collector, state=_process_state.registry_state,
    target="prometheus_client.REGISTRY (a FileCollector of the metrics directory)",
    why="vllm serve's /metrics serves prometheus_client.REGISTRY; the collector adds the accel files",
    undo="REGISTRY.unregister(collector)",
    upstream="as for the metrics directory")
METRICS_CLEANUP = ProbedPatch(
    "metrics directory cleanup", probe=_process_state.cleanup_registered, apply=_process_state.register_cleanup,
    revert=_process_state.unregister_cleanup, state=_process_state.atexit_state,
    target="atexit (a handler removing the temporary metrics directory)",
    why="the temporary directory would outlive the server",
    undo="atexit.unregister(handler)",
    upstream="as for the metrics directory")
RAY_ENVIRONMENT = ProbedPatch(
    "Ray worker environment", probe=_process_state.ray_prefix_added, apply=_process_state.add_ray_prefix,
    revert=_process_state.restore_ray_prefixes, state=_process_state.ray_prefixes_state,
    target=f"os.environ['{_compat.RAY_PREFIXES_SETTING}'] gains {_compat.ACCEL_PREFIX} (only with a setting "
           "that asks for something)",
    why="vLLM's Ray executor copies only the listed variables to its workers",
    undo="the variable's previous value back (or unset)",
    upstream="vLLM copying the variables of general plugins to Ray workers")

NO_DRAFT_SAMPLING = ProbedPatch(
    "no-draft sampling", probe=no_draft_sampling_installed, apply=install_no_draft_sampling,
    revert=uninstall_no_draft_sampling, state=rejection_forward,
    target="vllm.v1.sample.rejection_sampler.RejectionSampler.forward (only with ACCEL_DRAFT_CONFIG set)",
    why="a speculative step with no draft for any row still pays the rejection sampler's logits copies "
        "(0.46 vs 0.14 ms at batch 8, 8.2 vs 1.4 ms at 64 on a 2-core CPU, medians); it gets the plain "
        "sampler's identical result",
    undo="uninstall_no_draft_sampling()",
    upstream="vLLM's model runner using its plain sampler for a speculative step with no drafts")

TARGET_COPIES = ProbedPatch(
    "target native copies", probe=packed_linears.armed, apply=packed_linears.arm, revert=packed_linears.disarm,
    state=packed_linears.dispatch, target="vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm "
    "(while our proposer's target loads)", why="1 to 64 rows per matrix multiply faster by the native product",
    undo="packed_linears.disarm()", upstream="a few-row float32 product in vLLM's CPU build as fast as the native one")
LEDGER = Ledger(BACKEND_NAMES, SELECTOR, CPU_OVERRIDE, SAMPLER_FIX, METRICS_DIR, METRICS_COLLECTOR,
                METRICS_CLEANUP, RAY_ENVIRONMENT, NO_DRAFT_SAMPLING, TARGET_COPIES)
#: what live metrics change in this process (:func:`accel_plugin.adapters.vllm.metrics.setup`)
METRICS_PATCHES = (METRICS_DIR, METRICS_COLLECTOR, METRICS_CLEANUP)


def undo_all(platform_cls=None) -> None:
    """Undo every entry that can be undone (patch 1 cannot, see the ledger); ``platform_cls``:
    a platform class whose selector is patched besides the current platform's."""
    set_env_choice(None)
    if platform_cls is not None:
        uninstall(platform_cls)
    LEDGER.undo_all()
