"""Writing to a client connection from a task, with backpressure, without asyncio's streams.

A call answered by a task writes its reply through :class:`ProtocolWriter`: the
connection's transport, and a ``drain`` that waits while the transport has told the
protocol to pause (its buffer above the high-water mark) and fails once the connection is
lost, as ``asyncio.StreamWriter.drain`` does. Its methods are those
``proxy.sasl.stream.ByteWriter`` names, so the session's writes go through it unchanged.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class ProtocolWriter:
    """The writes of a connection's tasks (see the module's docstring). The protocol tells
    it :meth:`pause`, :meth:`resume` and :meth:`lost`."""

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop):
        self.transport = transport
        self._loop = loop
        self._paused = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._lost: BaseException | None = None
        self._closed: asyncio.Future[None] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.transport.write(data)

    def writelines(self, data: list[bytes | memoryview] | tuple[bytes | memoryview, ...]) -> None:
        self.transport.writelines(data)

    async def drain(self) -> None:
        if self._lost is not None:
            raise ConnectionResetError("the client connection is lost") from self._lost
        if self.transport.is_closing():
            # (asyncio's does the same: one turn, so that a close under way is seen.)
            await asyncio.sleep(0)
            if self._lost is not None:
                raise ConnectionResetError("the client connection is lost") from self._lost
        if not self._paused:
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._wake(None)

    def lost(self, exc: BaseException | None) -> None:
        self._lost = exc if exc is not None else ConnectionResetError("connection lost")
        self._wake(self._lost)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _wake(self, exc: BaseException | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(ConnectionResetError("the client connection is lost"))

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    async def wait_closed(self) -> None:
        if self._lost is not None:
            return
        if self._closed is None:
            self._closed = self._loop.create_future()
        await self._closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)
