"""What both adapters' packed target copies share (:mod:`.tgi.packed_linears`, :mod:`.vllm.packed_linears`).

While our drafts speculate, a step multiplies ``batch x (1 + drafts)`` rows with each of
the target's matrices; on a CPU the framework's own float32 product costs up to 2x more
from about four rows than at one. The adapters keep a copy of each matrix in the native
few-row product's layout (:mod:`accel_plugin.kernels.cpu_linear`) and multiply by it from
the row count where it is faster, measured at start-up by :func:`dense_rows`. Imports no
framework.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

__all__ = ["NATIVE_MAX_ROWS", "PROBE_ROWS", "dense_rows"]

#: row counts the start-up measurement compares the two products at (1..PROBE_ROWS)
PROBE_ROWS = 8
#: the most rows the native few-row product multiplies (it splits the work over output columns
#: only; a prompt of more rows goes to the framework's own product)
NATIVE_MAX_ROWS = 64


def dense_rows(pairs, linear: Callable, *, timer: Callable, repeats: int = 3) -> int:
    """The most rows up to which the framework's product is at least as fast as the packed
    copy's at every row count, over ``pairs`` (``timer(pairs, rows, use_packed, linear)``: ms
    of one product of ``rows`` rows with every matrix of ``pairs``): 0 when the copy wins at one
    row, :data:`PROBE_ROWS` when the framework's never loses up to there."""
    timer(pairs, 1, False, linear), timer(pairs, 1, True, linear)  # warm-up: first calls allocate
    for rows in range(1, PROBE_ROWS + 1):
        t_dense = statistics.median(timer(pairs, rows, False, linear) for _ in range(repeats))
        t_packed = statistics.median(timer(pairs, rows, True, linear) for _ in range(repeats))
        if t_packed < t_dense:
            return rows - 1
    return PROBE_ROWS
