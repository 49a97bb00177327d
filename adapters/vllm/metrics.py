"""accel metrics inside vLLM: where each number comes from (the accounting is
:mod:`accel_plugin.observability.metrics_recorders`; the user's view is docs/observability.md).

* :func:`setup` runs in ``register()``, in every vLLM process where an accel
  variable is set, before vLLM starts its engine core: it prepares the metric files' directory, hands it to the
  processes vLLM starts next (``ACCEL_METRICS_DIR``) and registers the collector
  that ``vllm serve``'s ``/metrics`` serves (``prometheus_client.REGISTRY``, or
  vLLM's own multiprocess collector when ``PROMETHEUS_MULTIPROC_DIR`` is set).
* KV cache: the accel backends' metadata builder calls :meth:`KVRecorder.record`
  in every step, with the step's ``CommonAttentionMetadata``. The lengths come from
  vLLM's host copy (``_compat.seq_lens_cpu``): nothing waits for the device. Only
  the first tensor/pipeline-parallel rank records (the others see the same batch),
  and a step is counted once per KV-cache group even when several builders serve it.
* Speculation: :class:`accel_plugin.adapters.vllm.DomainDraftProposer` records
  after each ``propose`` (:func:`proposer_recorder`).
* The periodic INFO line goes to vLLM's logger ``vllm.accel_plugin`` from the worker,
  and the recorders' own time to ``accel_metrics_record_seconds_total``.
* A recorder that raises logs one warning and stops; serving goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["KVRecorder", "ProposerRecorder", "kv_recorder", "proposer_recorder", "setup"]


def _compat():
    from . import _compat as module  # imports vLLM: only once the adapter runs inside it

    return module


def _logger():
    from vllm.logger import init_logger

    return init_logger("vllm.accel_plugin")


def setup(apply_steps: Callable[[], None]) -> str | None:
    """Called by ``register()`` in every process; returns the metric directory or None (off).
    ``apply_steps`` makes the changes (the ledger entries ``_patches.METRICS_PATCHES``, so
    that ``undo_all()`` undoes them)."""
    from accel_plugin.observability.metrics_files import process_setup

    plan = process_setup()
    if plan is None:
        return None
    apply_steps()
    return plan.directory


def _live(vllm_config: Any):
    """This process's :class:`accel_plugin.observability.metrics_recorders.LiveMetrics` (None: metrics off), with
    vLLM's own ``model_name`` and ``engine`` label values."""
    from accel_plugin.observability.metrics_recorders import live_metrics

    model_name = str(vllm_config.model_config.served_model_name)
    engine = str(vllm_config.parallel_config.data_parallel_rank)
    return live_metrics((model_name, engine), log=_logger().info)


def _disable(what: str, exc: BaseException) -> None:
    _logger().warning("accel metrics: recording %s failed (%s: %s); its metrics stop here, serving goes on",
                      what, type(exc).__name__, exc, exc_info=exc)


class KVRecorder:
    """What one metadata builder holds: the group's recorder (shared by every builder
    of the group in this process) and the step it saw last."""

    #: id(group recorder) -> [group recorder or None (failed), the host seq_lens of the step it counted last]
    _shared: ClassVar[dict[int, list]] = {}

    def __init__(self, live: Any, group: str, block_size: int):
        recorder = live.kv(group, block_size)
        self._live, self._seq_lens_cpu = live, _compat().seq_lens_cpu
        self._state = self._shared.setdefault(id(recorder), [recorder, None])

    def record(self, common: Any) -> None:
        """Account the step of ``common`` (a ``CommonAttentionMetadata``) once.

        Every KV-cache group's metadata is a shallow copy of one per-step object, so
        the host ``seq_lens`` tensor is the same object for all of a step's builds.
        A failure is logged once and switches this group's recording off.
        """
        start = time.perf_counter()
        state = self._state
        seq_lens = self._seq_lens_cpu(common)
        if state[0] is None or seq_lens is None or seq_lens is state[1]:
            return
        state[1] = seq_lens
        try:
            state[0].record(seq_lens[: common.num_reqs].tolist())
        except Exception as exc:  # noqa: BLE001 - metrics never stop a step
            state[0] = None
            _disable("the KV cache", exc)
        self._live.record_seconds += time.perf_counter() - start


class ProposerRecorder:
    """Records the proposer's statistics after each ``propose`` (failures: once, then off)."""

    def __init__(self, live: Any):
        self._live, self._recorder = live, live.proposer()

    def record(self, proposer: Any) -> None:
        if self._recorder is None:
            return
        start = time.perf_counter()
        try:
            self._recorder.record(proposer)
        except Exception as exc:  # noqa: BLE001 - metrics never stop a step
            self._recorder = None
            _disable("the proposer's statistics", exc)
        self._live.record_seconds += time.perf_counter() - start


def kv_recorder(kv_cache_spec: Any, vllm_config: Any) -> KVRecorder | None:
    """The recorder of the builder of ``kv_cache_spec``'s group, or None: metrics off,
    not the first rank, or a group whose blocks ``paged_usage`` does not describe
    (sliding-window groups free the blocks that leave the window)."""
    try:
        group = _compat().kv_cache_group_name(kv_cache_spec)
        if group is None:
            _logger().debug("accel metrics: a KV-cache group of %s is not accounted "
                            "(its blocks are not one per block_size tokens)", type(kv_cache_spec).__name__)
            return None
        if not _compat().is_first_model_rank():
            return None
        live = _live(vllm_config)
        if live is None:
            return None
        # vLLM's allocation unit (--block-size); a kernel may see smaller blocks of it
        block_size = vllm_config.cache_config.block_size or kv_cache_spec.block_size
        return KVRecorder(live, group, int(block_size))
    except Exception as exc:  # noqa: BLE001 - metrics never stop the engine
        _disable("the KV cache", exc)
        return None


def proposer_recorder(vllm_config: Any) -> ProposerRecorder | None:
    """The speculation recorder of this process, or None (metrics off, not the first rank)."""
    try:
        if not _compat().is_first_model_rank():
            return None
        live = _live(vllm_config)
    except Exception as exc:  # noqa: BLE001 - metrics never stop the engine
        _disable("the proposer's statistics", exc)
        return None
    return None if live is None else ProposerRecorder(live)
