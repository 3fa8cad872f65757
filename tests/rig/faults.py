"""A TCP relay put between the proxy and the HMS, that can misbehave on request.

It reproduces what the network and a metastore do to long-lived connections: a connection a
load balancer or the HMS dropped while idle (the proxy only learns when it next uses it), a
metastore (or store) that answers only when the test lets it, and one that accepts calls and
never answers. Held answers tell a test that a call is in flight, and let it do something
meanwhile, however long that takes. With ``record=True`` it keeps what passed each way, per
connection, so that a test can tell a message went through byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from tests.rig.ports import free_port


class FaultyRelay:
    def __init__(self, target_host: str, target_port: int, *, record: bool = False) -> None:
        self.target = (target_host, target_port)
        self.record = record
        # What was relayed, by (connection id, toward the target): kept per connection, so
        # that chunks of connections in use at once do not interleave.
        self._relayed: dict[tuple[int, bool], bytearray] = {}
        self.port = free_port()
        self.blackhole = False
        self.connections = 0
        self.held = 0  # answers waiting at the relay now (see hold_answers)
        self._open = asyncio.Event()  # answers pass while it is set
        self._open.set()
        self._doomed: set[int] = set()  # connection ids to drop on their next request
        self._live: dict[int, tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> FaultyRelay:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", self.port), self._loop
        ).result(10)
        return self

    def stop(self) -> None:
        async def _stop() -> None:
            assert self._server is not None
            self._server.close()
            for a, b in list(self._live.values()):
                a.close()
                b.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A closed transport lets its socket go a loop turn later (connection_lost runs
            # from call_soon): turns for them, or the loop stops first and the sockets are
            # warned about (ResourceWarning) in whichever test runs next.
            for _ in range(3):
                await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def hold_answers(self) -> None:
        """From now on, answers from the target wait at the relay (counted in ``held``)
        until ``release_answers``."""
        self._in_loop(self._open.clear)

    def release_answers(self) -> None:
        self._in_loop(self._open.set)

    def _in_loop(self, action: Callable[[], None]) -> None:
        async def run() -> None:
            action()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def carried(self, message: bytes, *, upward: bool) -> bool:
        """Whether ``message`` passed whole over one connection (toward the target if
        ``upward``; needs ``record``)."""
        return any(message in data for (_, up), data in self._relayed.items() if up == upward)

    def drop_idle_connections_silently(self) -> int:
        """Every open connection fails on its next request, before any reply byte (stale)."""
        self._doomed.update(self._live)
        return len(self._live)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cid = self.connections
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        except BaseException:  # cancelled by stop: else the accepted socket is left open,
            writer.close()  # and warned about (ResourceWarning) in whichever test runs then
            raise
        self._live[cid] = (writer, up_writer)
        try:
            await asyncio.gather(
                self._pump(cid, reader, up_writer, upward=True),
                self._pump(cid, up_reader, writer, upward=False),
            )
        finally:
            self._live.pop(cid, None)
            writer.close()
            up_writer.close()

    async def _pump(
        self, cid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upward: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if upward and cid in self._doomed:
                    break  # the request vanishes and the connection ends: a stale connection
                if self.blackhole:
                    continue
                if not upward and not self._open.is_set():
                    self.held += 1
                    try:
                        await self._open.wait()
                    finally:
                        self.held -= 1
                if self.record:
                    self._relayed.setdefault((cid, upward), bytearray()).extend(data)
                writer.write(data)
                await writer.drain()
        for w in self._live.get(cid, ()):
            w.close()
