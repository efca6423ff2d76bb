"""Handing freed memory back to the system after large, short-lived work (a huge request body, a
huge prompt's tokenizing).

glibc keeps freed heap memory for reuse: after a few megabyte-sized strings are freed on
different threads, their pages stay resident in the threads' arenas (the process's RSS grew by
tens of megabytes per refused 2 MB prompt and never came back). ``malloc_trim(0)`` returns every
arena's free pages; it costs a few milliseconds, so it runs after large work only, off the event
loop and the engine thread. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import threading

log = logging.getLogger(__name__)

LARGE_FREE_BYTES = 4 << 20  # work that freed this much is followed by a trim

_lock = threading.Lock()
_libc: list[ctypes.CDLL | None] = []  # filled once: glibc, or None where there is no malloc_trim


def _glibc() -> ctypes.CDLL | None:
    if not _libc:
        found = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(libc, "malloc_trim"):
                    libc.malloc_trim.argtypes = [ctypes.c_size_t]
                    libc.malloc_trim.restype = ctypes.c_int
                    found = libc
            except OSError as error:
                log.debug("no malloc_trim: %s", error)
        _libc.append(found)
    return _libc[0]


def release_free_memory() -> bool:
    """Return the heap's free pages to the system; False where that is not possible (not glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    with _lock:  # one trim at a time: two would walk the same arenas
        libc.malloc_trim(0)
    return True
