"""The files live metrics travel in: prometheus_client's multiprocess format, the
directory each process writes to, and the collector that serves them.

How the numbers reach a scrape. A serving framework runs the model in a worker
process and answers ``/metrics`` in another (vLLM's API server), and
``prometheus_client`` chooses between in-memory and file-backed values once, when
it is imported (``PROMETHEUS_MULTIPROC_DIR``), long before a plugin runs. So the
values are written straight into ``prometheus_client``'s multiprocess file format
(one mmap file per process and type, read by
``prometheus_client.multiprocess.MultiProcessCollector``), whatever the process's
own value class is:

* :func:`setup_process` runs early in every process (vLLM: the plugin's
  ``register()``, through its patch ledger, step by step: :class:`ProcessSetup`
  changes nothing an adapter cannot undo). The first process makes a temporary
  directory and passes it to its children in ``ACCEL_METRICS_DIR`` (removed when
  that process exits, by an ``atexit`` hook); it registers :class:`FileCollector`
  in ``prometheus_client.REGISTRY``, which serves the files of every process when
  the framework serves that registry.
* When ``PROMETHEUS_MULTIPROC_DIR`` is set (by the user, or by vLLM with several API
  servers), the files go there instead: the framework's own multiprocess collector
  then reads them, and :class:`FileCollector` stays silent (no duplicates).
* File names carry ``accel-<pid>``, never a bare pid, so they never share a file
  with ``prometheus_client``'s own metrics of the same process.

Gauges use the ``mostrecent`` multiprocess mode (the last value written by any
process, as vLLM's gauges do); counters are summed over processes. Recording costs
a few microseconds per value on the host (no device work): only values that changed
are written.

``prometheus_client`` is optional: without it, metrics are off (one DEBUG line).
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import envs
from .metrics_catalogue import MetricDef

__all__ = ["FileCollector", "MetricsSink", "ProcessSetup", "current_setup", "find_prometheus", "metrics_dir", "process_setup",
           "read_metrics", "setup_process"]

_logger = logging.getLogger("accel_plugin.observability.metrics_files")


def find_prometheus() -> Any | None:
    """``prometheus_client`` (with its multiprocess pieces), or None when not installed."""
    try:
        import prometheus_client
        from prometheus_client import mmap_dict, multiprocess  # noqa: F401
    except ImportError:
        return None
    return prometheus_client


def metrics_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where this process writes: ``PROMETHEUS_MULTIPROC_DIR``, else ``ACCEL_METRICS_DIR``."""
    environ = os.environ if environ is None else environ
    return environ.get("PROMETHEUS_MULTIPROC_DIR") or envs.metrics_dir(environ)


class _Series:
    """One labelled series of one metric in a sink: ``set`` writes its new value."""

    __slots__ = ("_file", "_gauge", "_key", "last")

    def __init__(self, file: Any, key: str, gauge: bool):
        self._file, self._key, self._gauge, self.last = file, key, gauge, None

    def set(self, value: float, now: float) -> None:
        """Write ``value`` (``now``: the time a gauge is stamped with) unless unchanged."""
        if value == self.last:
            return
        self.last = value
        self._file.write_value(self._key, float(value), now if self._gauge else 0.0)


class MetricsSink:
    """Writes metric values of this process into ``directory`` in prometheus_client's
    multiprocess format: ``counter_accel-<pid>.db`` and ``gauge_mostrecent_accel-<pid>.db``.

    A recorder asks for its series once (:meth:`series`) and sets them every step;
    only values that changed touch the file. Not thread-safe (one framework step at
    a time).
    """

    def __init__(self, directory: str, clock: Callable[[], float] = time.time):
        from prometheus_client.mmap_dict import MmapedDict, mmap_key

        self.directory = directory
        self.clock = clock
        self._mmap_key = mmap_key
        tag = f"accel-{os.getpid()}"
        os.makedirs(directory, exist_ok=True)
        self._files = {
            "counter": MmapedDict(os.path.join(directory, f"counter_{tag}.db")),
            "gauge": MmapedDict(os.path.join(directory, f"gauge_mostrecent_{tag}.db")),
        }
        self._series: dict[tuple[str, tuple[str, ...]], _Series] = {}

    def series(self, metric: MetricDef, labelvalues: tuple[str, ...]) -> _Series:
        """The series ``metric{labels}`` (made on first use)."""
        labelvalues = tuple(labelvalues)
        found = self._series.get((metric.name, labelvalues))
        if found is None:
            if len(labelvalues) != len(metric.labels):
                raise ValueError(f"{metric.name} takes labels {metric.labels}; got {labelvalues}")
            key = self._mmap_key(metric.family, metric.name, list(metric.labels), list(labelvalues), metric.help)
            found = _Series(self._files[metric.kind], key, metric.kind == "gauge")
            self._series[(metric.name, labelvalues)] = found
        return found

    def write(self, metric: MetricDef, labelvalues: tuple[str, ...], value: float) -> None:
        """Set ``metric{labels}`` to ``value`` (a counter's running total, a gauge's level)."""
        self.series(metric, labelvalues).set(value, self.clock())

    def close(self) -> None:
        for f in self._files.values():
            f.close()


class FileCollector:
    """A ``prometheus_client`` collector serving the accel metric files of every process.

    Silent while ``PROMETHEUS_MULTIPROC_DIR`` is set: the framework's own multiprocess
    collector reads that directory, accel files included.
    """

    def __init__(self, directory: str):
        self.directory = directory

    def describe(self) -> list:
        return []  # names are only known from the files; nothing to check at registration

    def collect(self) -> Iterable:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR") or not os.path.isdir(self.directory):
            return []
        from prometheus_client.multiprocess import MultiProcessCollector

        files = glob.glob(os.path.join(self.directory, "*_accel-*.db"))
        return MultiProcessCollector.merge(files, accumulate=True)


def read_metrics(directory: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every accel sample in ``directory``: ``{(name, sorted labels): value}`` (tests, tools)."""
    from prometheus_client.multiprocess import MultiProcessCollector

    out = {}
    files = glob.glob(os.path.join(directory, "*_accel-*.db"))
    for family in MultiProcessCollector.merge(files, accumulate=True):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _remove_owned_dir(path: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child inherits atexit handlers; only the creator removes it
        shutil.rmtree(path, ignore_errors=True)


class ProcessSetup:
    """What preparing this process for accel metrics changes, one step at a time, each with
    its undo, so that an adapter can list every step in its patch ledger:

    1. :meth:`export_dir` / :meth:`unexport_dir`: without ``ACCEL_METRICS_DIR``, a
       temporary directory, exported as ``ACCEL_METRICS_DIR`` (the children inherit it);
    2. :meth:`register_collector` / :meth:`unregister_collector`: a :class:`FileCollector`
       for that directory in ``registry`` (``prometheus_client.REGISTRY``);
    3. :meth:`register_cleanup` / :meth:`unregister_cleanup`: an ``atexit`` hook that
       removes the temporary directory (only a directory step 1 made).

    :func:`setup_process` runs the three in order. Each step runs at most once in a row.
    """

    def __init__(self, environ: dict[str, str], registry: Any):
        self.environ, self.registry = environ, registry
        self.own: str | None = None  # the accel directory the collector serves
        self.made = False  # step 1 made (and exported) the directory
        self.collector: FileCollector | None = None
        self._cleanup: tuple[Callable[..., None], str, int] | None = None

    @property
    def directory(self) -> str | None:
        """Where this process writes (``PROMETHEUS_MULTIPROC_DIR`` wins over the accel one)."""
        return metrics_dir(self.environ) or self.own

    def export_dir(self) -> str:
        if self.own is None:
            own = envs.metrics_dir(self.environ)
            if own is None:
                own = tempfile.mkdtemp(prefix="accel-metrics-")
                self.environ[envs.ACCEL_METRICS_DIR] = own
                self.made = True
            else:
                os.makedirs(own, exist_ok=True)
            self.own = own
        return self.own

    def unexport_dir(self) -> None:
        """Forget the directory; one that :meth:`export_dir` made is removed and unexported."""
        if self.made and self.own is not None:
            if self.environ.get(envs.ACCEL_METRICS_DIR) == self.own:
                del self.environ[envs.ACCEL_METRICS_DIR]
            shutil.rmtree(self.own, ignore_errors=True)
        self.own, self.made = None, False

    def register_collector(self) -> None:
        if self.collector is None:
            collector = FileCollector(self.export_dir())
            self.registry.register(collector)
            self.collector = collector

    def unregister_collector(self) -> None:
        if self.collector is not None:
            self.registry.unregister(self.collector)
            self.collector = None

    def register_cleanup(self) -> None:
        self.export_dir()
        if self._cleanup is None and self.made and self.own is not None:
            self._cleanup = (_remove_owned_dir, self.own, os.getpid())
            atexit.register(*self._cleanup)

    def unregister_cleanup(self) -> None:
        if self._cleanup is not None:
            atexit.unregister(self._cleanup[0])  # only this module registers it
            self._cleanup = None

    @property
    def cleanup_registered(self) -> bool:
        return self._cleanup is not None

    @property
    def cleanup_handler(self) -> tuple[Callable[..., None], str, int] | None:
        """The ``atexit`` handler and arguments :meth:`register_cleanup` registered (None: none)."""
        return self._cleanup

    @property
    def done(self) -> bool:
        """All three steps are in place (here, or in the parent this process was forked from)."""
        return self.collector is not None and (self._cleanup is not None or not self.made)


#: this process's setup (inherited, done, by a forked child)
_process: dict[str, ProcessSetup | None] = {"setup": None}


def current_setup() -> ProcessSetup | None:
    """The :class:`ProcessSetup` :func:`process_setup` made in this process (or its parent), if any."""
    return _process["setup"]


def process_setup(environ: dict[str, str] | None = None, registry: Any = None) -> ProcessSetup | None:
    """This process's :class:`ProcessSetup` (made on first call, nothing changed yet), or
    None when metrics are off (``ACCEL_METRICS=0``, or ``prometheus_client`` is not installed).
    ``registry``: where the collector goes (default: ``prometheus_client.REGISTRY``)."""
    environ = os.environ if environ is None else environ
    if not envs.metrics_enabled(environ):
        return None
    prometheus = find_prometheus()
    if prometheus is None:
        _logger.debug("accel metrics are off: prometheus_client is not installed (pip install prometheus_client)")
        return None
    if _process["setup"] is None:
        _process["setup"] = ProcessSetup(environ, prometheus.REGISTRY if registry is None else registry)
    return _process["setup"]


def setup_process(environ: dict[str, str] | None = None, registry: Any = None) -> str | None:
    """Prepare this process for accel metrics, early; idempotent. Runs the three steps of
    :class:`ProcessSetup` (an adapter runs them through its ledger instead).

    Returns the directory the files go to, or None when metrics are off.
    """
    setup = process_setup(environ, registry)
    if setup is None:
        return None
    setup.export_dir()
    setup.register_collector()
    setup.register_cleanup()
    return setup.directory
