"""Patches 5 to 8 of the vLLM ledger (:mod:`._patches`): what the adapter changes in the
process outside vLLM's classes, each step with its probe, its undo and a reader of its target.

* the live metrics' set-up (:class:`accel_plugin.observability.metrics_files.ProcessSetup`,
  the core's steps: ``ACCEL_METRICS_DIR`` and its temporary directory, a collector in
  ``prometheus_client.REGISTRY``, an ``atexit`` hook), applied step by step here so that
  ``undo_all()`` undoes them;
* vLLM's list of variable prefixes its Ray executor copies to workers
  (``_compat.carry_settings_to_ray_workers``), with its previous value kept for the undo.
"""

from __future__ import annotations

import os

from . import _compat

__all__ = [
    "add_ray_prefix", "atexit_state", "cleanup_registered", "collector_registered", "export_metrics_dir",
    "metrics_dir_exported", "metrics_dir_state", "ray_prefix_added", "ray_prefixes_state", "register_cleanup",
    "register_collector", "registry_state", "restore_ray_prefixes", "unexport_metrics_dir", "unregister_cleanup",
    "unregister_collector",
]


def _setup():
    """This process's metrics set-up (nothing changed by asking), or None: metrics are off."""
    from accel_plugin.observability.metrics_files import process_setup

    return process_setup()


def _existing():
    """The set-up if one was made in this process (or inherited); never makes one."""
    from accel_plugin.observability.metrics_files import current_setup

    return current_setup()


def _require():
    setup = _setup()
    if setup is None:
        raise RuntimeError("live metrics are off here (ACCEL_METRICS=0 or no prometheus_client); nothing to set up")
    return setup


def metrics_dir_exported() -> bool:
    setup = _existing()
    return setup is not None and setup.own is not None


def export_metrics_dir() -> None:
    _require().export_dir()


def unexport_metrics_dir() -> None:
    setup = _existing()
    if setup is not None:
        setup.unexport_dir()


def metrics_dir_state():
    from accel_plugin import envs

    return os.environ.get(envs.ACCEL_METRICS_DIR)


def collector_registered() -> bool:
    setup = _existing()
    return setup is not None and setup.collector is not None


def register_collector() -> None:
    _require().register_collector()


def unregister_collector() -> None:
    setup = _existing()
    if setup is not None:
        setup.unregister_collector()


def registry_state():
    """The collectors of ``prometheus_client.REGISTRY`` (None: prometheus_client absent)."""
    from accel_plugin.observability.metrics_files import find_prometheus

    prometheus = find_prometheus()
    if prometheus is None:
        return None
    return frozenset(id(c) for c in prometheus.REGISTRY._collector_to_names)


def cleanup_registered() -> bool:
    setup = _existing()
    return setup is not None and setup.cleanup_registered


def register_cleanup() -> None:
    _require().register_cleanup()


def unregister_cleanup() -> None:
    setup = _existing()
    if setup is not None:
        setup.unregister_cleanup()


def atexit_state():
    """The ``atexit`` handler registered for the metrics directory, or None. ``atexit``
    cannot list its handlers (and ``unregister`` leaves ``_ncallbacks()`` unchanged), so
    this is the set-up's record of what it registered and unregistered."""
    setup = _existing()
    return None if setup is None else setup.cleanup_handler


#: the value of vLLM's prefix setting before :func:`add_ray_prefix` changed it
_ray: dict[str, object] = {"added": False, "before": None}


def ray_prefix_added() -> bool:
    return bool(_ray["added"])


def add_ray_prefix() -> bool:
    """Make vLLM's Ray executor copy the ``ACCEL_*`` variables; True when the list changed."""
    before = os.environ.get(_compat.RAY_PREFIXES_SETTING)
    if _compat.carry_settings_to_ray_workers():
        _ray.update(added=True, before=before)
        return True
    return False


def restore_ray_prefixes() -> None:
    if not _ray["added"]:
        return
    if _ray["before"] is None:
        os.environ.pop(_compat.RAY_PREFIXES_SETTING, None)
    else:
        os.environ[_compat.RAY_PREFIXES_SETTING] = _ray["before"]  # type: ignore[assignment]
    _ray.update(added=False, before=None)


def ray_prefixes_state():
    return os.environ.get(_compat.RAY_PREFIXES_SETTING)
