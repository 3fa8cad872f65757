"""Free memory handed back to the operating system (glibc's ``malloc_trim``).

Most of what the cache keeps in process is bytes objects larger than pymalloc's 512-byte
limit, which glibc's malloc allocates. As entries are replaced (writes, expiry, eviction) and
replies come and go, glibc keeps the chunks freed inside its heap on its free lists:
resident, unused, and growing with the churn. The 30-minute soak (docs/reliability.md) saw
them grow ~0.3 MB a minute while live memory beyond what the caches and memos count stayed
flat. ``malloc_trim(0)`` gives the whole free pages among them back to the kernel (the soak
with it: 0.32 MB/min instead of 0.46, the rest pymalloc's arenas). It runs on the event
loop every ``--malloc-trim-seconds`` and takes a few milliseconds (measured here: 13 ms
when 60 MB were free, 1.5 ms when nothing was). Elsewhere than glibc (musl, macOS) there
is nothing to call and it never runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


MALLOC_TRIM = _malloc_trim()


def trim() -> float | None:
    """Give free memory back; the seconds it took, or ``None`` where there is no glibc."""
    if MALLOC_TRIM is None:
        return None
    started = time.perf_counter()
    MALLOC_TRIM(0)
    return time.perf_counter() - started


async def keep_trimming(every: float) -> None:
    """:func:`trim` every ``every`` seconds, until cancelled."""
    if MALLOC_TRIM is None:
        log.debug("no malloc_trim here (not glibc): free memory is the allocator's to keep")
        return
    while True:
        await asyncio.sleep(every)
        took = trim()
        log.debug("malloc_trim took %.1f ms", (took or 0.0) * 1000)
