"""Live metrics of the KV cache and of the domain proposer, for Prometheus and the log.

Framework-free: a framework adapter hands over, once per step, the host copy of the
step's sequence lengths (:meth:`KVCacheMetrics.record`) and, after each proposer
call, the proposer (:meth:`SpeculationMetrics.record`). The KV accounting is
:func:`accel_plugin.observability.kv.paged_usage`, the one ``accel kv simulate`` uses, so a
live server and the simulator count the same way. Every metric, its labels and
PromQL examples: docs/observability.md ("Live metrics").

How the numbers reach a scrape. A serving framework runs the model in a worker
process and answers ``/metrics`` in another (vLLM's API server), and
``prometheus_client`` chooses between in-memory and file-backed values once, when
it is imported (``PROMETHEUS_MULTIPROC_DIR``), long before a plugin runs. So the
values are written straight into ``prometheus_client``'s multiprocess file format
(one mmap file per process and type, read by
``prometheus_client.multiprocess.MultiProcessCollector``), whatever the process's
own value class is:

* :func:`setup_process` runs early in every process (vLLM: the plugin's
  ``register()``). The first process makes a temporary directory and passes it to
  its children in ``ACCEL_METRICS_DIR`` (removed when that process exits); it
  registers :class:`FileCollector` in ``prometheus_client.REGISTRY``, which serves
  the files of every process when the framework serves that registry.
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
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import envs
from .kv import Usage, paged_usage

__all__ = [
    "KV_LABELS",
    "METRICS",
    "SPEC_LABELS",
    "FileCollector",
    "KVCacheMetrics",
    "LiveMetrics",
    "MetricDef",
    "MetricsSink",
    "SpeculationMetrics",
    "format_kv",
    "live_metrics",
    "read_metrics",
    "setup_process",
]

_logger = logging.getLogger("accel_plugin.observability.metrics")

#: labels of every accel metric: vLLM's own (``model_name``, ``engine``), so dashboards join them
BASE_LABELS = ("model_name", "engine")
KV_LABELS = (*BASE_LABELS, "kv_cache_group", "block_size")
SPEC_LABELS = (*BASE_LABELS, "domain")
#: a domain is drafting in these controller states (accel_plugin.speculative.controller.DomainState)
DRAFTING_STATES = ("warmup", "on", "fixed")
SPEC_STATES = ("warmup", "on", "off", "fixed", "failed", "no-draft")


@dataclass(frozen=True)
class MetricDef:
    """One metric: ``name`` as scraped (counters end in ``_total``), kind, help, labels."""

    name: str
    kind: str  #: "gauge" or "counter"
    help: str
    labels: tuple[str, ...]

    @property
    def family(self) -> str:
        """The metric family name (a counter's without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


def _g(name: str, help: str, labels: tuple[str, ...]) -> MetricDef:
    return MetricDef(name, "gauge", help, labels)


def _c(name: str, help: str, labels: tuple[str, ...]) -> MetricDef:
    return MetricDef(name, "counter", help, labels)


#: Every metric, by name. docs/observability.md documents each (a test checks).
METRICS: dict[str, MetricDef] = {m.name: m for m in (
    _g("accel_kv_seqs", "Sequences in the last step's batch.", KV_LABELS),
    _g("accel_kv_used_slots", "KV slots holding a token in the last step (sum of sequence lengths).", KV_LABELS),
    _g("accel_kv_allocated_slots", "KV slots in the blocks those sequences hold (blocks x block_size).",
       KV_LABELS),
    _g("accel_kv_internal_slots", "Allocated KV slots no token fills (unused tails of last blocks).", KV_LABELS),
    _g("accel_kv_internal_fragmentation_percent", "Internal fragmentation in the last step: "
       "100 x internal / allocated slots.", KV_LABELS),
    _g("accel_kv_blocks", "KV blocks in use in the last step (sum of ceil(seq_len / block_size)).", KV_LABELS),
    _g("accel_kv_last_step_timestamp_seconds", "Unix time of the last step recorded.", KV_LABELS),
    _c("accel_kv_steps_total", "Steps recorded.", KV_LABELS),
    _c("accel_kv_used_slot_steps_total", "Sum over steps of used slots (rate / allocated rate = "
       "slot-step weighted usage, as accel kv simulate).", KV_LABELS),
    _c("accel_kv_allocated_slot_steps_total", "Sum over steps of allocated slots.", KV_LABELS),
    _c("accel_spec_drafted_tokens_total", "Draft tokens proposed and verified, per domain.", SPEC_LABELS),
    _c("accel_spec_accepted_tokens_total", "Draft tokens the target accepted, per domain.", SPEC_LABELS),
    _c("accel_spec_draft_steps_total", "(request, step) pairs that drafted and were verified, per domain.",
       SPEC_LABELS),
    _g("accel_spec_acceptance_rate", "Accepted / drafted tokens since start (vLLM's definition).", SPEC_LABELS),
    _g("accel_spec_alpha", "Per-position acceptance over the controller's window (the a of its speedup "
       "model); absent until measured.", SPEC_LABELS),
    _g("accel_spec_mean_acceptance_length", "1 + accepted tokens / drafting steps since start.", SPEC_LABELS),
    _g("accel_spec_k", "Draft tokens per request the controller chooses now (batch bucket of the last step).",
       SPEC_LABELS),
    _g("accel_spec_on", "1 while the domain drafts (state warmup, on, fixed), 0 otherwise.", SPEC_LABELS),
    _g("accel_spec_state", "1 for the domain's current controller state, 0 for the others.",
       (*SPEC_LABELS, "state")),
    _g("accel_spec_cost_ratio", "c: one draft forward / one plain target step; absent until measured.",
       SPEC_LABELS),
    _g("accel_spec_expected_speedup", "The controller's predicted speedup S at the current k; absent until "
       "measured.", SPEC_LABELS),
    _c("accel_spec_propose_seconds_total", "Time spent in the proposer (routing, drafting, bookkeeping).",
       BASE_LABELS),
    _c("accel_spec_propose_steps_total", "Proposer calls (one per decoding step).", BASE_LABELS),
    _g("accel_spec_last_propose_seconds", "Time of the last proposer call.", BASE_LABELS),
    _c("accel_metrics_record_seconds_total", "Time the framework's worker spent recording these metrics "
       "(host side; up to the previous step).", BASE_LABELS),
)}


# ------------------------------------------------------------------ the files


def _prometheus() -> Any | None:
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


#: this process's setup: the directory its collector serves (inherited by a forked child)
_process: dict[str, str | None] = {"dir": None}


def _remove_owned_dir(path: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child inherits atexit handlers; only the creator removes it
        shutil.rmtree(path, ignore_errors=True)


def setup_process(environ: dict[str, str] | None = None, registry: Any = None) -> str | None:
    """Prepare this process for accel metrics, early (vLLM: in ``register()``); idempotent.

    Returns the directory the files go to, or None when metrics are off
    (``ACCEL_METRICS=0``, or ``prometheus_client`` is not installed). Without
    ``PROMETHEUS_MULTIPROC_DIR`` and ``ACCEL_METRICS_DIR``, makes a temporary directory,
    exports it as ``ACCEL_METRICS_DIR`` (children inherit it) and removes it at exit.
    Registers a :class:`FileCollector` for that directory in ``registry`` (default:
    ``prometheus_client.REGISTRY``), once per process.
    """
    environ = os.environ if environ is None else environ
    if not envs.metrics_enabled(environ):
        return None
    prometheus = _prometheus()
    if prometheus is None:
        _logger.debug("accel metrics are off: prometheus_client is not installed (pip install prometheus_client)")
        return None
    if _process["dir"] is not None:  # done here, or in the parent this process was forked from
        return metrics_dir(environ) or _process["dir"]
    own = envs.metrics_dir(environ)
    if own is None:
        own = tempfile.mkdtemp(prefix="accel-metrics-")
        environ[envs.ACCEL_METRICS_DIR] = own
        atexit.register(_remove_owned_dir, own, os.getpid())
    else:
        os.makedirs(own, exist_ok=True)
    (registry or prometheus.REGISTRY).register(FileCollector(own))
    _process["dir"] = own
    return metrics_dir(environ)


# --------------------------------------------------------------- the recorders


def format_kv(usage: Usage) -> str:
    """``12 seqs, 1,234 slots used / 1,280 allocated (3.6% internal), 80 blocks``."""
    return (f"{usage.seqs} seqs, {usage.used:,} slots used / {usage.allocated:,} allocated "
            f"({usage.percent('internal'):.1f}% internal), {usage.blocks:,} blocks")


#: what KVCacheMetrics.record publishes, in order
_KV_SERIES = ("accel_kv_seqs", "accel_kv_used_slots", "accel_kv_allocated_slots", "accel_kv_internal_slots",
              "accel_kv_internal_fragmentation_percent", "accel_kv_blocks", "accel_kv_last_step_timestamp_seconds",
              "accel_kv_steps_total", "accel_kv_used_slot_steps_total", "accel_kv_allocated_slot_steps_total")


class KVCacheMetrics:
    """KV-cache usage of one KV-cache group, recorded once per step from host-side lengths."""

    def __init__(self, live: LiveMetrics, group: str, block_size: int):
        self.live, self.group, self.block_size = live, group, block_size
        self.labels = (*live.base_labels, group, str(block_size))
        self.steps = self.used_slot_steps = self.allocated_slot_steps = 0
        self.last: Usage | None = None
        sink = live.sink
        self._series = None if sink is None else [sink.series(METRICS[name], self.labels) for name in _KV_SERIES]

    def record(self, seq_lens: Sequence[int]) -> Usage:
        """Account one step whose sequences have ``seq_lens`` tokens (a list of ints: pass
        ``tensor.tolist()``, not a device tensor) and publish it."""
        usage = paged_usage(seq_lens, self.block_size)
        self.last = usage
        self.steps += 1
        self.used_slot_steps += usage.used
        self.allocated_slot_steps += usage.allocated
        if self._series is not None:
            now = self.live.clock()
            values = (usage.seqs, usage.used, usage.allocated, usage.internal, usage.percent("internal"),
                      usage.blocks, now, self.steps, self.used_slot_steps, self.allocated_slot_steps)
            for series, value in zip(self._series, values):
                series.set(value, now)
            self.live.publish_record_seconds(now)
        self.live.maybe_log()
        return usage


def _finite(value: float | None) -> bool:
    return value is not None and not math.isnan(value) and not math.isinf(value)


#: per domain, what SpeculationMetrics.record publishes (then accel_spec_state per state)
_SPEC_SERIES = ("accel_spec_drafted_tokens_total", "accel_spec_accepted_tokens_total", "accel_spec_draft_steps_total",
                "accel_spec_acceptance_rate", "accel_spec_mean_acceptance_length", "accel_spec_k", "accel_spec_on",
                "accel_spec_alpha", "accel_spec_cost_ratio", "accel_spec_expected_speedup")


class SpeculationMetrics:
    """Per-domain counters and the controller's state, recorded after each proposer call.

    ``record`` takes a framework-neutral proposer
    (:class:`accel_plugin.speculative.DomainProposer`: ``stats()``, ``num_steps``,
    ``propose_seconds``).
    """

    def __init__(self, live: LiveMetrics):
        self.live = live
        self.last_stats: dict[str, Any] = {}
        self.last_propose_seconds: float | None = None
        self.propose_seconds = 0.0
        self.steps = 0
        self._by_domain: dict[str, list] = {}

    def _domain_series(self, domain: str) -> list:
        found = self._by_domain.get(domain)
        if found is None:
            sink, labels = self.live.sink, (*self.live.base_labels, domain)
            found = [sink.series(METRICS[name], labels) for name in _SPEC_SERIES]
            found.append([sink.series(METRICS["accel_spec_state"], (*labels, state)) for state in SPEC_STATES])
            self._by_domain[domain] = found
        return found

    def record(self, proposer: Any) -> None:
        stats = proposer.stats()
        self.last_propose_seconds = proposer.propose_seconds - self.propose_seconds if self.steps else None
        self.propose_seconds, self.steps = proposer.propose_seconds, proposer.num_steps
        self.last_stats = stats
        sink = self.live.sink
        if sink is not None:
            now = self.live.clock()
            for domain, s in stats.items():
                *series, states = self._domain_series(domain)
                values = (s.drafted, s.accepted, s.steps, s.acceptance_rate, s.mean_acceptance_length, s.k,
                          1 if s.state in DRAFTING_STATES else 0, s.alpha, s.cost_ratio, s.expected_speedup)
                for one, value in zip(series, values):
                    if _finite(value):  # unmeasured (None) values stay absent
                        one.set(value, now)
                for state, one in zip(SPEC_STATES, states):
                    one.set(1 if s.state == state else 0, now)
            base, m = self.live.base_labels, METRICS
            sink.series(m["accel_spec_propose_seconds_total"], base).set(self.propose_seconds, now)
            sink.series(m["accel_spec_propose_steps_total"], base).set(self.steps, now)
            if self.last_propose_seconds is not None:
                sink.series(m["accel_spec_last_propose_seconds"], base).set(self.last_propose_seconds, now)
            self.live.publish_record_seconds(now)
        self.live.maybe_log()

    def summary(self) -> str:
        """``support a=0.82 k=4 on, code a=0.41 k=0 off; propose 1.20 ms/step``."""
        parts = []
        for domain, s in self.last_stats.items():
            alpha = "n/a" if s.alpha is None else f"{s.alpha:.2f}"
            parts.append(f"{domain} a={alpha} k={s.k} {s.state}")
        per_step = f"; propose {1e3 * self.propose_seconds / self.steps:.2f} ms/step" if self.steps else ""
        return ", ".join(parts) + per_step


class LiveMetrics:
    """The accel metrics of one process (one model): its recorders, its sink, its log line.

    ``base_labels``: values of ``model_name`` and ``engine``. ``sink``: where values
    go (None: only the log line and the recorders' own fields). ``log``: called with
    the periodic line, at most every ``log_interval`` seconds (0: never).
    """

    def __init__(self, base_labels: tuple[str, str], sink: MetricsSink | None, *,
                 log: Callable[[str], None] | None = None, log_interval: float = 10.0,
                 clock: Callable[[], float] = time.time):
        self.base_labels = tuple(base_labels)
        self.sink, self.log, self.log_interval, self.clock = sink, log, log_interval, clock
        self.kv_groups: dict[str, KVCacheMetrics] = {}
        self.speculation: SpeculationMetrics | None = None
        self._last_log = clock()
        #: seconds the framework adapter spent recording (it adds each call's time)
        self.record_seconds = 0.0
        self._record_series = None if sink is None else sink.series(
            METRICS["accel_metrics_record_seconds_total"], self.base_labels)

    def publish_record_seconds(self, now: float) -> None:
        if self._record_series is not None:
            self._record_series.set(self.record_seconds, now)

    def kv(self, group: str, block_size: int) -> KVCacheMetrics:
        """The recorder of KV-cache group ``group`` with ``block_size`` (made on first use).

        The caller records each step once per group (several metadata builders may
        serve one group)."""
        key = f"{group}/{block_size}"
        if key not in self.kv_groups:
            self.kv_groups[key] = KVCacheMetrics(self, group, block_size)
        return self.kv_groups[key]

    def proposer(self) -> SpeculationMetrics:
        if self.speculation is None:
            self.speculation = SpeculationMetrics(self)
        return self.speculation

    def line(self) -> str:
        """``accel KV: ...; speculation: ...`` (what the periodic log prints)."""
        parts = []
        recorded = [r for r in self.kv_groups.values() if r.last is not None]
        for r in recorded:
            name = "accel KV" if len(recorded) == 1 else f"accel KV [{r.group}, block {r.block_size}]"
            parts.append(f"{name}: {format_kv(r.last)}")
        if self.speculation is not None and self.speculation.steps:
            parts.append(f"speculation: {self.speculation.summary()}")
        return "; ".join(parts)

    def maybe_log(self) -> None:
        if not self.log or not self.log_interval:
            return
        now = self.clock()
        if now - self._last_log >= self.log_interval:
            self._last_log = now
            self.log(self.line())


_live: dict[int, LiveMetrics | None] = {}


def live_metrics(base_labels: tuple[str, str], *, log: Callable[[str], None] | None = None,
                 environ: Mapping[str, str] | None = None) -> LiveMetrics | None:
    """This process's :class:`LiveMetrics`, made on first use; None when metrics are off.

    The sink writes to :func:`metrics_dir`; with no directory (``setup_process`` never
    ran here) there are recorders and the log line, but nothing to scrape.
    """
    pid = os.getpid()
    if pid in _live:
        return _live[pid]
    environ = os.environ if environ is None else environ
    live = None
    if envs.metrics_enabled(environ):
        directory = metrics_dir(environ)
        sink = MetricsSink(directory) if directory and _prometheus() is not None else None
        live = LiveMetrics(base_labels, sink, log=log, log_interval=envs.metrics_log_interval(environ))
    _live.clear()  # a forked child starts afresh
    _live[pid] = live
    return live
