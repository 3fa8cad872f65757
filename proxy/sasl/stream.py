"""SASL on asyncio streams: the negotiation, then frames through the security layer.

:class:`SaslReader` and :class:`SaslWriter` stand where an ``asyncio.StreamReader`` and
``StreamWriter`` stood (the methods the proxy uses), so the Thrift code above never knows
whether its bytes are framed and wrapped. Frames are a byte stream here: a Thrift message may
span frames and a frame hold several messages.

With ``auth`` (no security layer) a frame's bytes are read straight off the socket in the
caller's read sizes, with no copy of the whole frame. Wrapped frames are unwrapped whole, and
big ones (replies of megabytes) in a thread: python-gssapi releases the GIL, so the event loop
goes on serving other clients meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from proxy.sasl.layer import PLAIN, SaslError, SecurityLayer
from proxy.sasl.negotiation import Negotiation, NegotiationReader, Status, encode

_LENGTH = struct.Struct(">I")
READ_SIZE = 64 * 1024
# Frames above this are wrapped or unwrapped off the event loop (~1.2 ms per 64 KiB here).
THREAD_ABOVE = 64 * 1024


class ByteReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...

    def at_eof(self) -> bool: ...


class ByteWriter(Protocol):
    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    async def wait_closed(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class SaslReader:
    """The bytes inside the frames of ``raw``; a broken frame raises ConnectionResetError
    (after ``on_error``, which logs it), as a reset connection would."""

    def __init__(
        self,
        raw: asyncio.StreamReader,
        layer: SecurityLayer,
        max_frame: int,
        *,
        early: bytes = b"",
        on_error: Callable[[SaslError], None] | None = None,
    ) -> None:
        self.raw = raw
        self.layer = layer
        self.max_frame = max_frame
        self._plain = layer is PLAIN
        self._remaining = 0  # bytes of the current plain frame still on the socket
        self._buffer = bytearray()  # unwrapped bytes not yet read
        self._early = early  # frame bytes that arrived with the last negotiation message
        self._eof = False
        self._on_error = on_error

    def at_eof(self) -> bool:
        return self._eof or (not self._buffer and not self._early and self.raw.at_eof())

    async def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = READ_SIZE
        try:
            while not self._buffer:
                if self._plain and self._remaining:
                    data = await self._raw_read(min(n, self._remaining))
                    if not data:
                        return self._end()
                    self._remaining -= len(data)
                    return data
                if not await self._next_frame():
                    return self._end()
        except SaslError as exc:
            if self._on_error is not None:
                self._on_error(exc)
            raise ConnectionResetError(f"SASL: {exc}") from None
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def _end(self) -> bytes:
        self._eof = True
        return b""

    async def _raw_read(self, n: int) -> bytes:
        if self._early:
            data, self._early = self._early[:n], self._early[n:]
            return data
        return await self.raw.read(n)

    async def _raw_exactly(self, n: int) -> bytes | None:
        data = bytearray()  # not bytes +=: a 64 MiB frame would be copied quadratically
        while len(data) < n:
            piece = await self._raw_read(n - len(data))
            if not piece:
                return None
            data += piece
        return bytes(data)

    async def _next_frame(self) -> bool:
        """Start the next frame (``False`` at a clean or broken end of the stream)."""
        head = await self._raw_exactly(4)
        if head is None:
            return False
        (length,) = _LENGTH.unpack(head)
        if length > self.max_frame:
            raise SaslError(f"a SASL frame of {length} bytes (limit {self.max_frame})")
        if self._plain:
            self._remaining = length
            return True
        payload = await self._raw_exactly(length)
        if payload is None:
            return False
        if length > THREAD_ABOVE:
            self._buffer += await asyncio.to_thread(self.layer.unwrap, payload)
        else:
            self._buffer += self.layer.unwrap(payload)
        return True


class SaslWriter:
    """Writes go out as frames at ``drain`` (each drain is one flush, as Java's client
    flushes once per message); ``close`` flushes what is left first."""

    def __init__(self, raw: asyncio.StreamWriter, layer: SecurityLayer) -> None:
        self.raw = raw
        self.layer = layer
        self.transport = raw.transport
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self._pending.append(data)
            self._pending_bytes += len(data)

    async def drain(self) -> None:
        if self._pending:
            pieces, size = self._take()
            try:
                if self.layer is PLAIN:
                    self._write_plain(pieces, size)
                elif size > THREAD_ABOVE:
                    frames = await asyncio.to_thread(self._wrap, pieces)
                    self.raw.writelines(frames)
                else:
                    self.raw.writelines(self._wrap(pieces))
            except RuntimeError as exc:  # uvloop: the connection closed meanwhile
                raise ConnectionResetError(f"connection closed: {exc}") from exc
        await self.raw.drain()

    def _take(self) -> tuple[list[bytes | bytearray | memoryview], int]:
        pieces, size = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        return pieces, size

    def _write_plain(self, pieces: list[bytes | bytearray | memoryview], size: int) -> None:
        self.raw.write(_LENGTH.pack(size))
        for piece in pieces:
            self.raw.write(piece)

    def _wrap(self, pieces: list[bytes | bytearray | memoryview]) -> list[bytes]:
        data = b"".join(pieces)
        step = self.layer.max_send or len(data)
        frames = []
        for at in range(0, len(data), step):
            token = self.layer.wrap(data[at : at + step])
            frames.append(_LENGTH.pack(len(token)) + token)
        return frames

    def close(self) -> None:
        if self._pending and not self.raw.is_closing():
            pieces, size = self._take()
            with contextlib.suppress(RuntimeError):  # uvloop: closed under us: nothing to send
                if self.layer is PLAIN:
                    self._write_plain(pieces, size)
                else:
                    self.raw.writelines(self._wrap(pieces))
        self.raw.close()

    def is_closing(self) -> bool:
        return self.raw.is_closing()

    async def wait_closed(self) -> None:
        await self.raw.wait_closed()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw.get_extra_info(name, default)


# -- negotiation on streams ------------------------------------------------------------------


class PeerClosed(SaslError):
    """The peer closed before sending anything (a TCP health check, a port probe)."""


class Negotiator:
    """Reads and writes negotiation messages on raw streams, each read within ``timeout``."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.messages = NegotiationReader()
        self.received = 0

    async def receive(self) -> Negotiation:
        async with asyncio.timeout(self.timeout):
            while True:
                message = self.messages.next()
                if message is not None:
                    return message
                data = await self.reader.read(READ_SIZE)
                if not data:
                    if not self.received:
                        raise PeerClosed("the peer closed the connection without a word")
                    raise SaslError("the peer closed the connection during SASL negotiation")
                self.received += len(data)
                self.messages.feed(data)

    async def send(self, status: Status, payload: bytes = b"") -> None:
        self.writer.write(encode(status, payload))
        await self.writer.drain()

    async def fail(self, status: Status, reason: str) -> None:
        """Tell the peer why (BAD: its fault; ERROR: ours), as Thrift's transport does."""
        try:
            async with asyncio.timeout(1.0):
                await self.send(status, reason.encode()[:1000])
        except (OSError, TimeoutError):
            pass


async def client_negotiate(
    negotiator: Negotiator,
    mechanism: str,
    first: bytes,
    step: Callable[[bytes], bytes | Awaitable[bytes]],
) -> bytes:
    """The client side: START, the initial response, then answers to each challenge until
    COMPLETE. Returns COMPLETE's payload (DIGEST-MD5's ``rspauth``); raises SaslError."""
    negotiator.writer.write(encode(Status.START, mechanism.encode()))
    await negotiator.send(Status.OK, first)
    while True:
        message = await negotiator.receive()
        if message.status is Status.COMPLETE:
            return message.payload
        if message.status is not Status.OK:
            reason = message.payload.decode("utf-8", "replace") or message.status.name
            raise SaslError(f"the metastore refused {mechanism}: {reason}")
        answer = step(message.payload)
        if not isinstance(answer, bytes):
            answer = await answer
        await negotiator.send(Status.OK, answer)
