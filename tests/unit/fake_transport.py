"""A client connection with no socket: the listener's protocol fed chosen chunks.

:class:`FakeConnection` makes the server's own protocol for a connection, as its listener
would, and hands it bytes in the pieces a test chooses (a request whole, split anywhere,
two coalesced), so which way a call takes is decided by the test, not by the timing of a
loopback socket. What the proxy writes back is kept in order. The transport does what
asyncio's does for the proxy's code and asyncio's streams: writes, closes (telling the
protocol on the next turn), swaps of protocol, the end of the client's side."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.server import ThriftServer
from tests.unit.scripted_hms import split_messages, until

# Event-loop turns a reply may take: enough for round trips to a real Redis on a busy
# machine (each turn polls the sockets), few enough that a reply that never comes fails.
TURNS = 500_000


class FakeTransport(asyncio.Transport):
    def __init__(self, loop: asyncio.AbstractEventLoop, port: int) -> None:
        super().__init__({"peername": ("127.0.0.1", port), "sockname": ("127.0.0.1", 9083)})
        self.loop = loop
        self.written = bytearray()
        self.protocol: asyncio.BaseProtocol | None = None
        self.closing = False
        self.lost = False
        self.reading = True

    # -- what the proxy and asyncio's streams call -------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing:
            return  # (asyncio's drops writes after close, with a warning at most)
        self.written += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.loop.call_soon(self._lose)

    def abort(self) -> None:
        self.close()

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            assert self.protocol is not None
            self.protocol.connection_lost(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading


class FakeConnection:
    """One client connection to ``server``, fed by the test (``framed``: the client's
    transport frames its messages)."""

    def __init__(self, server: ThriftServer, port: int, *, framed: bool) -> None:
        loop = asyncio.get_running_loop()
        self.framed = framed
        self.transport = FakeTransport(loop, port)
        protocol = server.protocol(loop)  # (what the listener makes for it)
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)

    def feed(self, data: bytes) -> None:
        """``data`` arrives, as one read of the socket."""
        assert not self.transport.lost, "the proxy closed the connection"
        protocol = self.transport.get_protocol()
        assert isinstance(protocol, asyncio.Protocol)
        protocol.data_received(data)

    def replies(self) -> list[bytes]:
        """Every whole reply written so far (their frames taken off)."""
        return split_messages(bytes(self.transport.written), framed=self.framed)

    async def replied(self, count: int) -> list[bytes]:
        """Wait until ``count`` replies in all have been written; they."""
        await until(
            lambda: len(self.replies()) >= count or self.transport.lost,
            f"{count} replies",
            TURNS,
        )
        replies = self.replies()
        assert len(replies) >= count, f"the proxy closed the connection after {replies!r}"
        return replies

    async def end(self) -> None:
        """The client ends its side and goes (as a socket's end reaches asyncio)."""
        if self.transport.lost:
            return
        protocol = self.transport.get_protocol()
        assert isinstance(protocol, asyncio.Protocol)
        if not protocol.eof_received():
            self.transport.close()
        await until(lambda: self.transport.lost, "the connection's end", TURNS)
