"""Free memory handed back (proxy.memory): what the soak in docs/reliability.md measures."""

from __future__ import annotations

import asyncio
import os

import pytest

from proxy import memory


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(memory.MALLOC_TRIM is None, reason="glibc only")
def test_trim_gives_free_chunks_back_and_keeps_what_is_live() -> None:
    # Chunks of the sizes the cache holds (over pymalloc's 512 bytes), every other one freed
    # while the rest stay live: glibc keeps the freed ones in its heap, resident.
    live = [os.urandom(1) * (2_000 + (i % 50) * 1_000) for i in range(8_000)]
    for i in range(0, len(live), 2):
        live[i] = b""
    before = rss()
    assert memory.trim() is not None
    assert before - rss() > 20 * 2**20  # ~100 MB were freed: most of it leaves RSS
    assert all(len(b) in (0, 2_000 + (i % 50) * 1_000) for i, b in enumerate(live))


@pytest.mark.skipif(memory.MALLOC_TRIM is None, reason="glibc only")
def test_keep_trimming_runs_until_cancelled() -> None:
    async def run() -> None:
        calls = []
        real = memory.trim
        memory.trim = lambda: calls.append(1) or 0.0  # type: ignore[assignment,func-returns-value]
        try:
            task = asyncio.create_task(memory.keep_trimming(0.01))
            while len(calls) < 3:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            memory.trim = real

    asyncio.run(run())
