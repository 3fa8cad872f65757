"""Writing to a client connection: whole replies at once, big ones in slices with
backpressure, framed as the client's transport needs."""

from __future__ import annotations

import asyncio

from proxy.loop import guarded_write
from proxy.sasl.stream import ByteWriter
from proxy.wire.framing import Transport

WRITE_SLICE = 1 << 20
SMALL_MESSAGE = 64 * 1024
HEAD_BYTES = 256  # (a message's header and its result's first bytes)

_UVLOOP_TCP: dict[type, bool] = {}  # whether a transport's type is uvloop's TCP transport


class ClientConnection:
    """The client side of a session: framing-aware writes with backpressure.

    ``writer``: what a call's task writes through (proxy.conn.writer's, or a SASL session's,
    which wraps what it writes); ``plain``: the connection's own transport, when nothing
    wraps its bytes (replies answered at once are written straight to it)."""

    def __init__(
        self,
        writer: ByteWriter,
        transport: Transport,
        plain: asyncio.WriteTransport | None = None,
    ) -> None:
        self.writer = writer
        self.transport = transport
        # uvloop's TCP transport keeps a reference to what it is given until it is sent (no
        # copy, and nothing moved on each partial send): a message goes to it whole, in one
        # system call if the socket takes it. asyncio's own (and TLS) copy or move their
        # buffer: a big message goes to them in slices. Only a plain stream's writer: a SASL
        # session's frames and wraps what it writes (its raw transport is uvloop's too).
        raw = writer.transport if type(writer) is asyncio.StreamWriter else plain
        uvloop_tcp = _UVLOOP_TCP.get(type(raw))
        if uvloop_tcp is None:
            kind = type(raw)
            uvloop_tcp = _UVLOOP_TCP[kind] = (kind.__name__, kind.__module__) == (
                "TCPTransport",
                "uvloop.loop",
            )
        self.whole: asyncio.WriteTransport | None = raw if uvloop_tcp else None
        self.plain = raw  # a plain stream's transport (see write_at_once)
        self.framed = transport is Transport.FRAMED
        # Replies written at once: a bug after one is told from a bug before it.
        self.answered = 0
        # Bytes a task has sent, and the first bytes of the last message (for the audit
        # log: how big a reply was, how many partitions it holds).
        self.sent = 0
        self.head = b""

    async def send(self, data: bytes) -> None:
        self.sent += len(data)
        self.head = data[:HEAD_BYTES]
        self._write(data)
        await self.writer.drain()

    def _write(self, data: bytes | memoryview) -> None:
        """Write to the client, whose connection may be gone: then ConnectionResetError,
        the client gone (on either event loop, see :func:`proxy.loop.guarded_write`)."""
        writer = self.writer
        if writer.is_closing():
            raise ConnectionResetError("the client connection is closed")
        guarded_write(writer, data)

    def write_at_once(self, message: bytes) -> None:
        """Write one whole message, framed as the client's transport needs, without waiting
        for it to drain: a reply answered at once, written only while nothing else waits to
        be written (see proxy.conn.protocol). On a plain connection, straight to its
        transport (what ``StreamWriter.write`` does, without its Python steps: they were a
        tenth of the reply's way to the client, from cold memory, git log -p docs/benchmarks.md)."""
        if self.framed:
            message = self.transport.prefix(len(message)) + message
        plain = self.plain
        if plain is None:
            self._write(message)
            self.answered += 1
            return
        if plain.is_closing():
            raise ConnectionResetError("the client connection is closed")
        guarded_write(plain, message)
        self.answered += 1

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        """A message given as a head and a view of the rest, written without joining them
        and in slices, so a 100 MB cached reply is neither copied nor buffered whole (asyncio
        moves a transport's whole pending buffer on every partial send)."""
        writer = self.writer
        if self.transport is Transport.FRAMED:
            head = self.transport.prefix(len(head) + len(rest)) + head
        self.sent += len(head) + len(rest)
        self.head = head + bytes(rest[:HEAD_BYTES])
        if len(rest) <= SMALL_MESSAGE:  # one write, one system call
            self._write(head + rest)
            await writer.drain()
            return
        if self.whole is not None:
            if writer.is_closing():
                raise ConnectionResetError("the client connection is closed")
            try:
                self.whole.writelines((head, rest))
            except RuntimeError as exc:  # (see guarded_write)
                raise ConnectionResetError(f"the connection is closed: {exc}") from exc
            await writer.drain()
            return
        self._write(head)
        for at in range(0, len(rest), WRITE_SLICE):
            self._write(rest[at : at + WRITE_SLICE])
            await writer.drain()
        await writer.drain()
