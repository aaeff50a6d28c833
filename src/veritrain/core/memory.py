"""Giving freed memory back to the system between the stages of a long step.

glibc keeps memory that Python and numpy have freed: after a large array is freed its mmap threshold rises, so later
arrays below that size come from the heap, and a heap that has grown is trimmed only from its top. A stage that
made a few hundred MB of temporaries thus leaves the process that much larger, and the next stage's own peak comes
on top of it. `give_back` asks glibc to return every free page (`malloc_trim(0)`); elsewhere it does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Optional


@functools.cache
def _trim() -> Optional[Any]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl without it, Windows)
        return None


def give_back() -> None:
    """Return the pages freed memory still holds to the system, where the C library can (glibc)."""
    trim = _trim()
    if trim is not None:
        trim(0)
