"""The process's C heap (glibc malloc): its figures, its arenas, giving free memory back.

With glibc's defaults every thread that allocates gets a malloc arena of its own (up to
8 per core) and freed memory stays in the arenas. Measured in 4-minute soaks of
``voxloop serve`` on 2 cores: 74 MB of free-but-kept heap right after the models loaded,
80-88 MB under load. ``voxloop serve`` limits the arenas to two and gives the free heap
back (``malloc_trim``) whenever no session is open. A fixed 128 KiB mmap threshold would
keep the free heap near 1 MB all the time, but every large buffer then costs fresh pages:
whisper's CPU time per utterance went from 0.17 to 0.27-0.29 s, so it is not used.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

#: glibc ``mallopt`` parameter (malloc.h).
_M_ARENA_MAX = -8


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


def _glibc(name: str):
    """A glibc function of this process, None on other C libraries."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def malloc_heap() -> dict[str, int] | None:
    """Bytes in use, free but kept, and in mmapped chunks (``mallinfo2``); None without glibc."""
    mallinfo2 = _glibc("mallinfo2")
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {"in_use": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd}


def limit_arenas(arenas: int = 2) -> bool:
    """At most ``arenas`` malloc arenas for the threads started from now on; False without glibc
    or when the operator tunes malloc (``MALLOC_ARENA_MAX`` / ``GLIBC_TUNABLES`` set)."""
    if "MALLOC_ARENA_MAX" in os.environ or "GLIBC_TUNABLES" in os.environ:
        return False
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))


def trim() -> bool:
    """Give the free heap back to the kernel (``malloc_trim(0)``); True when some was."""
    malloc_trim = _glibc("malloc_trim")
    return malloc_trim is not None and bool(malloc_trim(0))


#: Seconds between two looks at the session count by ``trim_when_idle``.
IDLE_TRIM_EVERY_S = 30.0


async def trim_when_idle(open_sessions: Callable[[], int], every_s: float | None = None) -> None:
    """Every ``every_s`` seconds (``IDLE_TRIM_EVERY_S``) with no session open, ``trim()`` (a few ms:
    the heap is small). Each server process runs one (``Hub.start``), front ends included.

    Runs until cancelled. Under load the free heap is reused as it is; trimming there would
    only make the next turns fault their pages in again.
    """
    if _glibc("malloc_trim") is None:
        return
    while True:
        await asyncio.sleep(IDLE_TRIM_EVERY_S if every_s is None else every_s)
        if open_sessions() == 0:
            trim()
