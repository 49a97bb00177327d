"""The recorders of live metrics: KV-cache usage and the domain proposer, for Prometheus
and the log.

Framework-free: a framework adapter hands over, once per step, the host copy of the
step's sequence lengths (:meth:`KVCacheMetrics.record`) and, after each proposer
call, the proposer (:meth:`SpeculationMetrics.record`). The KV accounting is
:func:`accel_plugin.observability.kv_accounting.paged_usage`, the one ``accel kv simulate`` uses, so a
live server and the simulator count the same way. Every metric, its labels and
PromQL examples: docs/observability.md ("Live metrics"); the metrics themselves:
:mod:`accel_plugin.observability.metrics_catalogue`; how the values reach a scrape:
:mod:`accel_plugin.observability.metrics_files`.

Recording costs a few microseconds per value on the host (no device work): only
values that changed are written.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import envs
from .kv_accounting import Usage, paged_usage
from .metrics_catalogue import DRAFTING_STATES, METRICS, SPEC_STATES
from .metrics_files import MetricsSink, find_prometheus, metrics_dir

__all__ = ["KVCacheMetrics", "LiveMetrics", "SpeculationMetrics", "format_kv", "live_metrics"]


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


#: seconds between two reads of the model-derived values (alpha, c, expected speedup): the full
#: statistics cost about 0.1 ms for eight entries, a cost per step the counters do not need
MODEL_REFRESH_S = 1.0


class SpeculationMetrics:
    """Per-domain counters and the controller's state, recorded after each proposer call.

    ``record`` takes a framework-neutral proposer
    (:class:`accel_plugin.speculative.DomainProposer`: ``counters()``, ``stats(by_bucket=False)``,
    ``num_steps``, ``propose_seconds``). Counters, k and state are read after every call; the
    model-derived gauges (alpha, cost ratio, expected speedup) at most every ``MODEL_REFRESH_S``
    seconds of ``live.clock``, and at once when a domain appears.
    """

    def __init__(self, live: LiveMetrics):
        self.live = live
        self.last_stats: dict[str, Any] = {}  #: the last full read (``stats(by_bucket=False)``)
        self.last_counters: dict[str, Any] = {}  #: the last per-call read (``counters()``)
        self.last_propose_seconds: float | None = None
        self.propose_seconds = 0.0
        self.steps = 0
        self._by_domain: dict[str, list] = {}
        self._stats_at = -math.inf

    def _domain_series(self, domain: str) -> list:
        found = self._by_domain.get(domain)
        if found is None:
            sink, labels = self.live.sink, (*self.live.base_labels, domain)
            found = [sink.series(METRICS[name], labels) for name in _SPEC_SERIES]
            found.append([sink.series(METRICS["accel_spec_state"], (*labels, state)) for state in SPEC_STATES])
            self._by_domain[domain] = found
        return found

    def record(self, proposer: Any) -> None:
        counters = proposer.counters()
        now = self.live.clock()
        refresh = now - self._stats_at >= MODEL_REFRESH_S or counters.keys() != self.last_stats.keys()
        if refresh:
            self.last_stats, self._stats_at = proposer.stats(by_bucket=False), now  # not the per-bucket table
        before, self.last_counters = self.last_counters, counters
        self.last_propose_seconds = proposer.propose_seconds - self.propose_seconds if self.steps else None
        self.propose_seconds, self.steps = proposer.propose_seconds, proposer.num_steps
        sink = self.live.sink
        if sink is not None:
            for domain, s in counters.items():
                if not refresh and before.get(domain) == s:
                    continue  # the usual step of a domain with no request or none drafting: nothing to write
                *series, states = self._domain_series(domain)
                values = (s.drafted, s.accepted, s.steps, s.acceptance_rate, s.mean_acceptance_length, s.k,
                          1 if s.state in DRAFTING_STATES else 0)
                if refresh:
                    m = self.last_stats[domain]
                    values += (m.alpha, m.cost_ratio, m.expected_speedup)
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
        for domain, s in self.last_counters.items():
            alpha = getattr(self.last_stats.get(domain), "alpha", None)  # as of the last full read
            alpha = "n/a" if alpha is None else f"{alpha:.2f}"
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
        sink = MetricsSink(directory) if directory and find_prometheus() is not None else None
        live = LiveMetrics(base_labels, sink, log=log, log_interval=envs.metrics_log_interval(environ))
    _live.clear()  # a forked child starts afresh
    _live[pid] = live
    return live
