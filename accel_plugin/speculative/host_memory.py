"""Give memory the process freed back to the operating system (glibc's ``malloc_trim``).

A draft KV cache on the CPU is a few large tensors that are reallocated when it
grows and when it shrinks. glibc keeps what they freed in its heap for later
allocations instead of returning it, so after a burst of requests the process's RSS
would stay at the burst's peak although the cache shrank. ``malloc_trim(0)`` returns
the free pages of every arena (``madvise(MADV_DONTNEED)``, not only the heap's top).
It is called after a draft cache shrinks (rare: the sizes move by powers of two with
hysteresis), never per step. Where the C library has no ``malloc_trim`` (musl,
macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_freed_memory"]


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the operating system; False where this C
    library cannot (then nothing happens)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
