"""The in-process engine's heap: freed memory kept for the next allocation.

A round of an in-process run allocates and frees the same large buffers again and
again (each reply's bytes, each update, torch's activations and optimizer state):
glibc hands a block above its mmap threshold back to the kernel on free, and the
next allocation of that size faults every page in again (docs/results/client-cpu.md
measured what that costs). ``keep_freed_memory`` raises the mmap threshold and
the trim threshold once per process (glibc's ``mallopt``), so freed blocks stay in
the heap and are reused: the process's resident memory stays at its peak instead
of shrinking between rounds; the peak itself is unchanged. A no-op where the C
library is not glibc."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("flwr.pflower")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h
MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB come from the heap, not a fresh mapping
TRIM_THRESHOLD = (1 << 31) - 1  # the heap's top is not handed back


@functools.cache
def keep_freed_memory() -> bool:
    """Set the two thresholds (once); whether they are set."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # one arena: a thread's own arena is a chain of 64 MB heaps, each unmapped when
    # it empties, so a worker thread's large blocks would fault in again anyway
    done = all(
        mallopt(option, value)
        for option, value in (
            (M_ARENA_MAX, 1),
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
    )
    log.debug("heap: freed memory kept for reuse: %s", done)
    return done
