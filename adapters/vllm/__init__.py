"""vLLM adapter (installed as ``accel_plugin.adapters.vllm``).

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point, once in
every process it starts (API server, engine core, workers). vLLM is imported lazily,
inside the functions, so importing this module stays cheap.

:func:`register` changes nothing while no accel variable is set (no name of
:data:`accel_plugin.envs.ENV_VARS` in the environment): it checks the vLLM version,
logs one line and returns. With one set, it builds the process's accel plugins once
(:func:`accel_plugin.plugins.manager.process_plugins`); the backend classes and the
proposer reuse them. It asks them what to install for ``vllm``
(``accel_adapter_components``) and applies, in the order of the patch ledger
(:mod:`._patches`, every entry with its undo; docs/vllm.md has the user's view):

1. the names ``ACCEL_FLASH`` and ``ACCEL_PAGED`` in vLLM's backend registry, so
   ``--attention-backend ACCEL_FLASH`` parses and resolves to our classes;
2. the selector patch, so that a request for an accel backend is validated and
   honoured on every platform, including CPU;
3. when ``ACCEL_ATTENTION_BACKEND`` is set (and accel-plugin's selection accepts
   this device), the choice itself; on the CPU platform also as an override of
   ``CPU_ATTN``, vLLM's own mechanism for replacing the CPU backend;
4. when ``ACCEL_DRAFT_CONFIG`` is set, on CPU, the rejection sampler fix;
5. to 7. the live metrics' directory, collector and exit hook;
8. when a setting asks for something, ``ACCEL_`` in vLLM's list of variables its
   Ray executor copies to workers.

The live metrics (:mod:`.metrics`): ``register()`` runs in the API
server before vLLM starts its engine core, so the metric files' directory it sets up
there reaches the worker, and ``/metrics`` serves what the worker records.

A wrong accel setting stops vLLM's start-up, as vLLM's own bad settings do: vLLM
calls ``register()`` without catching what it raises, so :class:`AccelStartupError`
ends ``vllm serve`` and ``LLM(...)`` with a message naming the variable, the value
and the valid values. Nothing asked of accel-plugin is silently dropped: a refused
``ACCEL_ATTENTION_BACKEND`` and an internal failure while installing what a setting
asks for stop start-up too. Only when no setting asks for anything (``_ASKING``) does
a failure leave vLLM as it would be without the plugin, with a warning.
"""

from __future__ import annotations

import os

from ._names import FRAMEWORK

__all__ = ["AccelStartupError", "DomainDraftProposer", "SpeculationStatsExtension", "register"]

#: Names re-exported lazily from .proposer, so that vLLM's
#: speculative_config={"model": "accel_plugin.adapters.vllm.DomainDraftProposer"}
#: resolves while importing this module stays cheap.
_LAZY = {"DomainDraftProposer": "proposer", "SpeculationStatsExtension": "proposer"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_REGISTERED = False
#: The settings that ask this adapter to install something (:func:`_asked`).
_ASKING = ("ACCEL_ATTENTION_BACKEND", "ACCEL_DRAFT_CONFIG", "ACCEL_PLUGINS")
#: What every start-up refusal ends with.
_WAY_OUT = "vLLM was not started: fix the setting, or unset it to run vLLM without accel-plugin"


class AccelStartupError(RuntimeError):
    """An accel setting cannot be honoured here; raised from :func:`register` so that
    vLLM does not start with something other than what the user asked for."""

    def __init__(self, problem: str):
        super().__init__(f"accel-plugin: {problem}. {_WAY_OUT}")


def _logger():
    from vllm.logger import init_logger

    # A child of the "vllm" logger, so our lines use vLLM's handler and format.
    return init_logger("vllm.accel_plugin")


def _env_choice(logger, plugins, installable: list[str]) -> tuple[str | None, str | None]:
    """(setting, backend) that ACCEL_ATTENTION_BACKEND selects on this device.

    ``auto`` only considers ``installable``: backends this adapter has vLLM classes for.
    """
    from accel_plugin.plugins.selection import SelectionContext, select_attention_backend

    from . import _compat

    platform = _compat.current_platform()
    device = "cpu" if platform.is_cpu() else platform.device_type
    capability = None
    if device == "cuda":
        cap = platform.get_device_capability()
        capability = (cap.major, cap.minor) if cap is not None else None
    selection = select_attention_backend(
        SelectionContext(framework="vllm", device=device, cuda_capability=capability),
        pm=plugins.pm,
        registries=plugins.registries,
        allowed=installable,
    )
    if selection.refused:
        raise AccelStartupError(f"{selection.describe()} (on {device})")
    return selection.setting, selection.backend


def _install(logger, plugins, names: list[str]) -> str:
    """Register names, the selector patch, the sampler fix and the no-draft sampling (with
    ``ACCEL_DRAFT_CONFIG``) and the env choice (the patches of :mod:`._patches`, in ledger order); returns a summary."""
    from accel_plugin import envs

    from . import _compat, _patches
    from .backend import BACKEND_CLASS_PATHS

    installable = []
    for name in names:
        if name in BACKEND_CLASS_PATHS:
            _compat.register_backend_name(name, BACKEND_CLASS_PATHS[name])
            installable.append(name)
        else:
            logger.debug("accel-plugin: backend %s has no vLLM adapter class; not registered", name)
    platform_cls = _patches.install()
    if envs.draft_config_path() is not None and _patches.install_sampler_fix(platform_cls):
        logger.info("accel-plugin: vLLM CPU's expand_batch_to_tokens is broken here (temperatures of "
                    "speculative tokens unset); replaced with a torch version (patch ledger entry 4)")
    if envs.draft_config_path() is not None:
        if _patches.install_no_draft_sampling():
            logger.debug("accel-plugin: speculative steps with no draft use vLLM's plain sampler (patch ledger "
                         "entry 9)")
        else:
            logger.warning("accel-plugin: this vLLM's RejectionSampler.forward takes other arguments than "
                           "0.30-0.32's; steps with no draft keep the rejection sampler (patch ledger entry 9 "
                           "not applied)")
    setting, backend = _env_choice(logger, plugins, installable)
    _patches.set_env_choice(backend, setting)
    if backend is None:
        return "ACCEL_ATTENTION_BACKEND unset"
    if _compat.platform_ignores_selected_backend(platform_cls):
        _patches.CPU_OVERRIDE.apply()
    return f"ACCEL_ATTENTION_BACKEND={setting} -> {backend}"


def _settings(environ=None) -> list[str]:
    """The accel variables present in the environment (``accel_plugin.envs.ENV_VARS``);
    with none, :func:`register` changes nothing."""
    from accel_plugin import envs

    environ = os.environ if environ is None else environ
    return [var.name for var in envs.ENV_VARS if var.name in environ]


def _user_selected(environ=None) -> list[str]:
    """The accel-plugin settings the user set (each one asks this adapter to act)."""
    from accel_plugin import envs

    environ = os.environ if environ is None else environ
    return [name for name in (envs.ACCEL_ATTENTION_BACKEND, envs.ACCEL_DRAFT_CONFIG) if environ.get(name)]


def _version_supported(logger) -> bool:
    """Whether this vLLM is one the adapter supports (``_compat.SUPPORTED_VERSIONS``).

    Outside the range: if the user set ``ACCEL_ATTENTION_BACKEND`` or
    ``ACCEL_DRAFT_CONFIG``, start-up stops with the range in the message; otherwise
    (nothing asked of accel-plugin) a warning, and the plugin installs nothing.
    """
    from accel_plugin.versions import UnsupportedFrameworkVersion

    try:
        from . import _compat

        _compat.check_version()
    except UnsupportedFrameworkVersion as exc:
        selected = _user_selected()
        if selected:
            raise UnsupportedFrameworkVersion(f"{exc} ({', '.join(selected)} set)") from None
        logger.warning("accel-plugin stays inactive: %s", exc)
        return False
    return True


def _check_settings(environ=None) -> None:
    """Raise :class:`AccelStartupError` for the first wrong accel setting, before
    anything is changed in vLLM: every ``ACCEL_*`` value (:func:`accel_plugin.envs.check_all`,
    each message names the variable, the value and the valid values) and the draft
    YAML that ``ACCEL_DRAFT_CONFIG`` names (read and validated as the proposer will)."""
    from accel_plugin import envs

    errors = envs.check_all(environ)
    if errors:
        raise AccelStartupError("; ".join(map(str, errors)))
    path = envs.draft_config_path(environ)
    if path is not None:
        from accel_plugin.speculative.draft_config import DraftConfigError, load_draft_config

        try:
            load_draft_config(path)
        except DraftConfigError as exc:
            raise AccelStartupError(f"{envs.ACCEL_DRAFT_CONFIG}={path!r}: {exc}") from None


def _asked(environ=None) -> list[str]:
    """The accel settings that ask this adapter to install something (the version
    refusal's :func:`_user_selected`, plus a third-party plugin allowlist)."""
    from accel_plugin import envs

    environ = os.environ if environ is None else environ
    return _user_selected(environ) + [envs.ACCEL_PLUGINS] * bool(environ.get(envs.ACCEL_PLUGINS))


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent.

    A vLLM outside the supported range stops start-up when an accel setting is set
    (:func:`_version_supported`). A wrong accel setting always stops it
    (:func:`_check_settings`), and so does a refused ``ACCEL_ATTENTION_BACKEND``:
    :class:`AccelStartupError`, which vLLM does not catch. Any other failure undoes
    what was applied; it stops start-up too when a setting asked for something
    (:func:`_asked`), and otherwise is logged and leaves vLLM as it is without us.
    """
    global _REGISTERED
    logger = _logger()
    if _REGISTERED:
        logger.debug("accel-plugin: register() already ran in process %d", os.getpid())
        return
    if not _version_supported(logger):
        return
    _check_settings()
    if not _settings():
        _REGISTERED = True
        logger.info("accel-plugin loaded in process %d; inactive: no ACCEL_* variable is set, so nothing in "
                    "vLLM or this process is changed", os.getpid())
        return
    try:
        from accel_plugin.plugins.manager import process_plugins

        # Built once per process; the backends and the proposer reuse it.
        plugins = process_plugins()
        components = plugins.components(FRAMEWORK)  # unknown names fail loudly here
        for note in components.notes:
            logger.debug("accel-plugin: %s", note)
        summary = _install(logger, plugins, components.attention_backends)
        metrics = _setup_metrics(logger)
        if _asked():
            from . import _compat, _patches

            _patches.RAY_ENVIRONMENT.apply()
            if _patches.RAY_ENVIRONMENT.applied:
                logger.debug("accel-plugin: %s now lists %s, so that vLLM's Ray workers get the accel settings",
                             _compat.RAY_PREFIXES_SETTING, _compat.ACCEL_PREFIX)
    except AccelStartupError:
        _undo(logger)
        raise
    except Exception as exc:
        _undo(logger)
        asked = _asked()
        if asked:
            raise AccelStartupError(
                f"could not install what {', '.join(asked)} asks for: {type(exc).__name__}: {exc}") from exc
        logger.exception("accel-plugin: register() failed; no accel setting asks for anything (%s unset), so "
                         "accel-plugin stays inactive and vLLM runs as it does without it",
                         ", ".join(_ASKING))
        return
    _REGISTERED = True
    logger.info(
        "accel-plugin loaded in process %d; attention backends available: %s; %s; metrics: %s",
        os.getpid(),
        ", ".join(components.attention_backends) or "(none)",
        summary,
        metrics,
    )


def _setup_metrics(logger, environ=None) -> str:
    """Prepare this process for live metrics.

    A failure (e.g. an unwritable directory) stops start-up when ``ACCEL_METRICS`` or
    ``ACCEL_METRICS_DIR`` is set (the user asked for metrics, or for a place); with
    neither set it turns metrics off with a warning. Wrong values never get here:
    :func:`_check_settings` refuses them first.
    """
    from accel_plugin import envs

    environ = os.environ if environ is None else environ
    asked = [name for name in (envs.ACCEL_METRICS, envs.ACCEL_METRICS_DIR) if environ.get(name, "").strip()]
    try:
        from . import _patches
        from .metrics import setup

        directory = setup(lambda: _patches.LEDGER.apply(_patches.METRICS_PATCHES))
    except envs.EnvVarError as exc:
        raise AccelStartupError(str(exc)) from None
    except Exception as exc:
        if asked:
            settings = ", ".join(f"{name}={environ[name]!r}" for name in asked)
            raise AccelStartupError(f"live metrics could not be set up ({settings}): "
                                    f"{type(exc).__name__}: {exc}") from exc
        logger.warning("accel-plugin: live metrics are off: %s", exc)
        return "off"
    return "off" if directory is None else f"files in {directory}"


def _undo(logger) -> None:
    """Leave vLLM's own selection in place after a failed register()."""
    try:
        from . import _patches

        _patches.undo_all()
    except Exception:  # pragma: no cover - best effort
        logger.debug("accel-plugin: could not undo a partial registration", exc_info=True)
