"""The metrics port in process: scrapes and the status page are made off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

from proxy.config import HostPort
from proxy.http import MetricsServer
from proxy.metrics import Metrics
from tests.unit.helpers import _get


class SlowCollector:
    """A registry member that takes half a second of CPU to write out, as Python code does
    (a big registry took ~20 ms). It holds the interpreter: off the event loop, the loop
    still gets its turns (the interpreter switches threads every 5 ms); on it, none."""

    def collect(self) -> Iterator[Any]:
        end = time.perf_counter() + 0.5
        n = 0
        while time.perf_counter() < end:
            n += 1
        return iter(())


def _ticks_during(server: MetricsServer, path: str) -> int:
    """How often a 10 ms timer fired on the event loop while ``path`` was being answered."""

    async def run() -> int:
        await server.start()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        reply = await _get(server.ports[0], path)
        task.cancel()
        await server.stop()
        assert reply.startswith(b"HTTP/1.1 200")
        return ticks

    return asyncio.run(run())


def test_a_slow_scrape_does_not_hold_up_the_event_loop() -> None:
    metrics = Metrics()
    metrics.registry.register(SlowCollector())  # type: ignore[arg-type]
    # On the event loop, the timer could not fire during the half second; off it, ~50 times.
    assert _ticks_during(MetricsServer(HostPort("127.0.0.1", 0), metrics), "/metrics") > 10


def test_the_status_page_is_rendered_off_the_event_loop() -> None:
    def page() -> Callable[[], bytes]:
        def render() -> bytes:
            time.sleep(0.5)
            return b"<html></html>"

        return render

    server = MetricsServer(HostPort("127.0.0.1", 0), Metrics(), page)
    assert _ticks_during(server, "/") > 10
