"""Paired timings of draft and target work: c and v per batch size on a noisy machine.

The machine may be shared: one round can run ten times slower, or faster, than the
one before, so nothing here compares times taken at different moments.

- **Paired c.** The draft work of one ``propose`` call and the target step that
  follows it (and verifies those drafts) run at most seconds apart. Each such pair
  gives ``r = draft seconds per forward / verifying step seconds``; a slow spell
  slows both and leaves ``r`` alone. ``c`` (against a *plain* step, the unit of the
  speedup formula) is the median over the last 64 pairs of ``r (1 + v)``, each with
  the ``v`` of its own step (a verifying step lasts ``1 + v`` plain ones). Pairs
  older than 512 timed steps are left out while 3 newer ones exist (an off domain
  drafts only in probes, and its window would keep a spell for thousands of steps).
- **Paired v.** A plain step (no drafts) next to a verifying one of the same batch
  bucket gives ``v = T_verify / T_plain - 1``, divided by the drafts per request
  the verifying step checked: ``u``, the overhead per draft token, so that ``v(k) =
  u k``. ``u`` is the median of the last 64 samples weighted by drafts per request
  (a step that verified one draft among eight requests says little), clamped at 0.
  **Long drafts** (``LONG_DRAFTS`` = 4 or more per request) read ``u`` from their own
  samples once there are 3 of them (the least noisy samples: a step's noise divided
  by 4 or more): a CPU engine's step may cost much more per draft from some length on
  (eager vLLM at batch 1 here: 3-6% for 1-3 drafts, 21-28% for 4-5), and a ``u`` read
  mostly from short drafts under-prices long ones. Short drafts keep the bucket's
  whole window (a sample of one draft carries the step's noise five times over, one
  of a probe among 8 requests forty times: read alone, a few of them mislead).
  The controller makes such plain steps when none happen by themselves
  (calibration steps). Nothing measured and ``controller.verify_overhead`` unset:
  ``v = 0``.
- **Buckets.** Steps are grouped by rows: 1, 2, 3-4, 5-8, 9-16, ... (a batch of 8 on
  a CPU is compute-bound and verifies far more expensively than a batch of 1). A
  bucket with fewer than 3 samples uses the nearest bucket that has them.
- **Plausibility.** Given the bytes of weights one forward reads (the target's and
  a draft's), ``c_size = draft_bytes / target_bytes``; a measured ``c`` outside
  ``[c_size / 4, c_size * 4]`` is clamped into it, with one warning per draft.
  (A GPU draft of a few layers is often launch-bound and slower than its size
  says: ``controller.draft_cost`` sets c where the band is wrong.)
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .draft_config.schema import ControllerConfig

__all__ = ["StepCosts", "batch_bucket"]

#: paired samples kept per window (c per draft and bucket, u per bucket)
_PAIR_WINDOW = 64
#: timed steps after which a sample of c gives way to newer ones: a domain that is off
#: drafts only in probes, so its window fills slowly and would keep a spell for long
_MAX_AGE = 512
#: samples a bucket needs before its c or u counts (else the nearest bucket's)
MIN_PAIRS = 3
#: a measured c is clamped into [c_size / SIZE_BAND, c_size * SIZE_BAND]
SIZE_BAND = 4.0
#: drafts per request from which u is read from such steps alone (once MIN_PAIRS exist)
LONG_DRAFTS = 4
#: raw times kept for the counters (draft_forward_ms ...); decisions use pairs only
_TIMES_KEPT = 64


def batch_bucket(rows: int) -> int:
    """The bucket of a batch of ``rows``: 1, 2, 4, 8, ... (the power of two at or
    above ``rows``: rows 3-4 -> 4, 5-8 -> 8)."""
    return 1 if rows <= 1 else 1 << (rows - 1).bit_length()


def nearest(buckets: Iterable[int], bucket: int) -> int | None:
    """``bucket`` if among ``buckets``, else the nearest one (ties: the smaller); None if empty."""
    return min(buckets, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b), default=None)


def median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def lower_quartile(values: Iterable[float]) -> float | None:
    """The lower quartile (the smallest of up to 4 values); ``None``: none."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4] if ordered else None


def measured_speedup(samples: Iterable[tuple[float, float]]) -> float | None:
    """Mean token gain times median time ratio of ``(gain, time ratio)`` samples (None: none).
    A median of their products takes one of a few values at batch 1 (``accepted + 1`` times
    the ratio): where more than half the steps accept nothing, that of a step that accepted none."""
    pairs = list(samples)
    return sum(g for g, _ in pairs) / len(pairs) * median(t for _, t in pairs) if pairs else None


def _weighted_median(samples: Iterable[tuple[float, float]]) -> float | None:
    """Median of ``(value, weight)`` samples: the value at half the total weight."""
    ordered = sorted(samples)
    half, total = sum(w for _, w in ordered) / 2, 0.0
    for value, weight in ordered:
        total += weight
        if total >= half:
            return value
    return None


def _nearest_window(by_bucket: dict[int, deque], bucket: int) -> tuple[int, deque] | None:
    """(bucket, window) of ``bucket`` or of the nearest bucket with MIN_PAIRS samples."""
    near = nearest((b for b, window in by_bucket.items() if len(window) >= MIN_PAIRS), bucket)
    return None if near is None else (near, by_bucket[near])


class StepCosts:
    """The paired measurements of one engine; configured values replace them.

    Feed :meth:`record_draft` after each draft call and :meth:`record_step` at the
    start of the next ``propose`` call; read :meth:`cost_ratio` and
    :meth:`verify_overhead` per batch bucket.
    """

    def __init__(self, cfg: ControllerConfig, *, target_bytes: int | None = None,
                 logger: logging.Logger | None = None):
        self.cfg = cfg
        self.logger = logger or logging.getLogger("accel_plugin.speculative")
        self.target_bytes = target_bytes  #: weight bytes one target forward reads (None: unknown)
        self.draft_bytes: dict[str, int] = {}  #: per draft: weight bytes one forward reads
        self._warned: set[str] = set()
        self._pending: dict[str, float] = {}  # draft -> seconds per forward, this call
        self._prev: tuple[float, int, float] | None = None  # last timed step: seconds, bucket, drafts per row
        self._timed = 0  # timed steps so far
        self._since_plain: dict[int, int] = {}  # verifying steps since the last plain one, per bucket
        # draft -> bucket -> (r, drafts per row, index of the timed step)
        self._pairs: dict[str, dict[int, deque[tuple[float, float, int]]]] = {}
        self._overheads: dict[int, deque[tuple[float, float]]] = {}  # bucket -> (u, drafts per row)
        # medians, until a measurement they read arrives (a c also until its oldest sample ages out):
        # ("plain"|"verify", bucket), ("forward", draft), ("u", bucket), ("c", draft, bucket) -> (c, expiry)
        self._memo: dict[tuple, Any] = {}
        self._draft_times: dict[str, deque[float]] = {}
        self._plain_times: dict[int, deque[float]] = {}
        self._verify_times: dict[int, deque[float]] = {}

    # ------------------------------------------------------------------ recording

    def record_draft(self, draft: str, rows: int, seconds_per_forward: float) -> None:
        """This call's drafting with ``draft`` for ``rows`` requests took ``seconds_per_forward``
        per forward; it is paired with the target step the next :meth:`record_step` reports
        and kept under that step's bucket (decisions are per batch, whatever share of
        it the draft serves)."""
        self._pending[draft] = seconds_per_forward
        self._draft_times.setdefault(draft, deque(maxlen=_TIMES_KEPT)).append(seconds_per_forward)
        self._memo.pop(("forward", draft), None)

    def record_step(self, seconds: float | None, rows: int, drafted_tokens: int) -> None:
        """The target step that just ran decoded ``rows`` requests and verified
        ``drafted_tokens`` drafts in all (0: a plain step) in ``seconds``; ``None``:
        it ran but its time is not comparable (it prefilled a prompt, or the engine
        was idle), which breaks the pairing with its neighbours."""
        pending, self._pending = self._pending, {}
        if seconds is None or seconds <= 0 or rows <= 0:
            self._prev = None
            return
        b = batch_bucket(rows)
        per_row = drafted_tokens / rows
        self._timed += 1
        this = (seconds, b, per_row)
        prev, self._prev = self._prev, this
        times = self._verify_times if drafted_tokens else self._plain_times
        times.setdefault(b, deque(maxlen=_TIMES_KEPT)).append(seconds)
        self._memo.pop(("verify" if drafted_tokens else "plain", b), None)
        if drafted_tokens:
            self._since_plain[b] = self._since_plain.get(b, 0) + 1
            for draft, draft_seconds in pending.items():
                window = self._pairs.setdefault(draft, {}).setdefault(b, deque(maxlen=_PAIR_WINDOW))
                window.append((draft_seconds / seconds, per_row, self._timed))
                self._forget(lambda key, draft=draft: key[0] == "c" and key[1] == draft)
        else:
            self._since_plain[b] = 0
        # a plain and a verifying step in a row, same bucket: one sample of u
        if prev is not None and prev[1] == b and (prev[2] == 0) != (per_row == 0):
            (t_verify, _, verify_per_row), (t_plain, _, _) = (this, prev) if per_row else (prev, this)
            window = self._overheads.setdefault(b, deque(maxlen=_PAIR_WINDOW))
            window.append(((t_verify / t_plain - 1.0) / verify_per_row, verify_per_row))
            self._forget(lambda key: key[0] in ("u", "c"))  # every c reads u

    def _forget(self, which: Callable[[tuple], bool]) -> None:
        for key in [key for key in self._memo if which(key)]:
            del self._memo[key]

    def steps_since_plain(self, bucket: int) -> int:
        """Verifying steps timed at ``bucket`` since its last plain one."""
        return self._since_plain.get(bucket, 0)

    def overhead_samples(self, bucket: int | None = None) -> int:
        """Samples of u at ``bucket`` (None: at the bucket that has the most)."""
        if bucket is None:
            return max(map(len, self._overheads.values()), default=0)
        return len(self._overheads.get(bucket, ()))

    def cost_samples(self, draft: str, bucket: int) -> int:
        return len(self._pairs.get(draft, {}).get(bucket, ()))

    # -------------------------------------------------------------------- reading

    def verify_overhead(self, k: float, bucket: int) -> float:
        """v for verifying ``k`` drafts per request at ``bucket``: configured, or ``u k`` (long drafts: their own u)."""
        if self.cfg.verify_overhead is not None:
            return self.cfg.verify_overhead
        return self._per_token_overhead(bucket, k) * k

    def _per_token_overhead(self, bucket: int, per_row: float) -> float:
        key = ("u", bucket, per_row >= LONG_DRAFTS)
        if key not in self._memo:
            near = _nearest_window(self._overheads, bucket)
            if near is None:
                self._memo[key] = 0.0
            else:
                long = [sample for sample in near[1] if sample[1] >= LONG_DRAFTS] if key[2] else []
                self._memo[key] = max(0.0, _weighted_median(long if len(long) >= MIN_PAIRS else near[1]))
        return self._memo[key]

    def measured_cost_ratio(self, draft: str, bucket: int) -> float | None:
        """The paired c of ``draft`` at ``bucket``, before the size band; ``None`` until measured."""
        key = ("c", draft, bucket)
        found = self._memo.get(key)
        if found is None or self._timed >= found[1]:
            near = _nearest_window(self._pairs.get(draft, {}), bucket)
            if near is None:
                found = None, math.inf
            else:  # each sample in plain steps, with the v of the step it was paired with
                b, window = near
                fresh = [sample for sample in window if self._timed - sample[2] < _MAX_AGE]
                # valid until the oldest fresh sample ages out (the last MIN_PAIRS: until the next pair)
                expiry = fresh[0][2] + _MAX_AGE if len(fresh) >= MIN_PAIRS else math.inf
                fresh = fresh if len(fresh) >= MIN_PAIRS else list(window)[-MIN_PAIRS:]
                found = median(r * (1.0 + self.verify_overhead(per_row, b)) for r, per_row, _ in fresh), expiry
            self._memo[key] = found
        return found[0]

    def size_cost_ratio(self, draft: str) -> float | None:
        """``draft_bytes / target_bytes``: the c the model sizes suggest (``None``: unknown)."""
        draft_bytes = self.draft_bytes.get(draft)
        return draft_bytes / self.target_bytes if draft_bytes and self.target_bytes else None

    def cost_ratio(self, draft: str, bucket: int) -> float | None:
        """c: configured, or the paired measurement within the size band (``None`` until measured)."""
        if self.cfg.draft_cost is not None:
            return self.cfg.draft_cost
        c = self.measured_cost_ratio(draft, bucket)
        size = self.size_cost_ratio(draft)
        if c is None or size is None:
            return c
        low, high = size / SIZE_BAND, size * SIZE_BAND
        if low <= c <= high:
            return c
        if draft not in self._warned:
            self._warned.add(draft)
            self.logger.warning(
                "draft %s: measured cost ratio c=%.4g is outside [%.4g, %.4g], %g times either side of "
                "its weight size ratio %.4g; using the nearer bound (controller.draft_cost fixes c)",
                draft, c, low, high, SIZE_BAND, size,
            )
        return min(max(c, low), high)

    def _median_of(self, tag: str, times: dict, key) -> float | None:
        memo = (tag, key)  # read for every domain at every step: sorted once per measurement
        if memo not in self._memo:
            self._memo[memo] = median(times.get(key, ()))
        return self._memo[memo]

    def draft_forward_s(self, draft: str) -> float | None:
        """Median of the last 64 forwards of ``draft`` (unpaired: for reading only)."""
        return self._median_of("forward", self._draft_times, draft)

    def target_step_s(self, bucket: int) -> float | None:
        """Median plain target step at ``bucket`` (for reading only)."""
        return self._median_of("plain", self._plain_times, bucket)

    def verify_step_s(self, bucket: int) -> float | None:
        """Median verifying target step at ``bucket`` (for reading only)."""
        return self._median_of("verify", self._verify_times, bucket)
