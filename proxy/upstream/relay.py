"""One call on one metastore connection: send it, then stream or hold the reply.

Nothing here knows about the cache, the pool or the options: a call gets its connection,
its bounds (:class:`Timeouts`) and, when its reply is streamed, the client to write to.
Replies to a buffered client are copied piece by piece as they arrive (a 100 MB reply never
sits in memory unless it is being kept); a framed client needs the whole length first, so
its reply is held and sent in one frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.loop import guarded_write
from proxy.upstream.connection import UpstreamConnection
from proxy.upstream.errors import (
    UpstreamClosed,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    started,
)
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, MessageReader, Transport

READ_SIZE = 256 * 1024
# Replies up to this size are kept (for the cache) before their last bytes go out (a few
# hundred microseconds at most); bigger ones after, off the client's clock.
STORE_BEFORE_REPLY_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long the proxy waits for the metastore.

    ``read`` bounds each wait for reply bytes of a client's call (``--upstream-read-timeout``:
    as long as the clients themselves wait). The proxy's own calls (the readiness probe, the
    notification follower, listing a database's tables before a drop) are not a client's:
    ``own_call`` and ``probe`` are short enough that a metastore that accepts connections but
    does not answer is noticed promptly.
    """

    read: float
    own_call: float = 30.0
    probe: float = 5.0


class ClientChannel(Protocol):
    """The client side of a session, as a relayed reply needs it."""

    transport: Transport

    async def send(self, data: bytes) -> None:
        """Write ``data`` (raw bytes, already framed as needed) and respect backpressure."""

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        """Write one message, framed as needed, given in two parts."""


OnReply = Callable[[Message], Awaitable[None]]


def result_outcome(message_type: int, body_start: bytes) -> str:
    """``ok`` or ``user_error`` (a declared exception) from the first bytes of a result."""
    if message_type == MessageType.EXCEPTION:
        return "user_error"
    if not body_start or body_start[0] == 0:  # STOP: a void method's empty result
        return "ok"
    if len(body_start) >= 3 and body_start[1:3] != b"\x00\x00":
        return "user_error"
    return "ok"


async def send(conn: UpstreamConnection, data: bytes, timeout: float) -> None:
    try:
        guarded_write(conn.writer, conn.replies.transport.frame(data))
        # asyncio.timeout, not wait_for: no extra task per call on the hot path.
        async with asyncio.timeout(timeout):
            await conn.writer.drain()
    except TimeoutError as exc:
        raise UpstreamTimeout("timed out sending to the metastore") from exc
    except OSError as exc:
        raise UpstreamClosed(f"connection lost while sending: {exc}", stale=conn.calls > 0) from exc


async def receive(
    conn: UpstreamConnection, timeout: float, *, got_bytes: bool, deadline: float | None = None
) -> bytes:
    """The next bytes from the metastore, within ``timeout`` (or by ``deadline``, in the
    loop's time, for a call whose wait began before); errors say whether the connection was
    stale."""
    try:
        async with asyncio.timeout(timeout) if deadline is None else asyncio.timeout_at(deadline):
            data = await conn.reader.read(READ_SIZE)
    except TimeoutError as exc:
        raise UpstreamTimeout(f"the metastore sent nothing for {timeout:g} s") from exc
    except OSError as exc:
        raise UpstreamClosed(str(exc), stale=conn.calls > 0 and not got_bytes) from exc
    if not data:
        raise UpstreamClosed(
            "the metastore closed the connection", stale=conn.calls > 0 and not got_bytes
        )
    return data


def check_reply_header(
    name: str, seqid: int, reply_name: str, reply_type: int, reply_seqid: int
) -> None:
    if reply_type not in (MessageType.REPLY, MessageType.EXCEPTION):
        raise UpstreamProtocolError(f"metastore sent message type {reply_type} as a reply")
    if reply_name != name or reply_seqid != seqid:
        raise UpstreamProtocolError(
            f"reply {reply_name!r}/{reply_seqid} does not match call {name!r}/{seqid}"
        )


async def exchange(
    conn: UpstreamConnection, request: bytes, name: str, seqid: int, timeout: float
) -> Message:
    """Send one call and read its whole reply (for the proxy's own small calls)."""
    await send(conn, request, timeout)
    reader = MessageReader(conn.replies.transport, conn.replies.max_size)
    got = False
    while True:
        try:
            message = reader.next_message()
        except ProtocolError as exc:
            raise UpstreamProtocolError(str(exc)) from exc
        if message is not None:
            h = message.header
            check_reply_header(name, seqid, h.name, h.type, h.seqid)
            if reader.buffered:
                raise UpstreamProtocolError("metastore sent bytes after its reply")
            return message
        reader.feed(await receive(conn, timeout, got_bytes=got))
        got = True


async def relay(
    conn: UpstreamConnection,
    name: str,
    seqid: int,
    client: ClientChannel | None,
    timeout: float,
    *,
    on_reply: OnReply | None = None,
    keep_limit: int = 0,
    hold_exception: bool = False,
    deadline: float | None = None,
) -> str | Message:
    """Copy one reply from ``conn``: streamed to ``client``, or held whole (no ``client``).

    Returns the outcome label once the reply went out, or the whole reply when held.
    ``on_reply`` gets the whole reply (kept while streaming, while it is no bigger than
    ``keep_limit``); it runs before the last piece is sent when the reply is small. With
    ``hold_exception``, an ``EXCEPTION`` reply is not sent but returned whole, for the
    caller to look at (the bridge for removed methods, :mod:`proxy.bridge`). ``deadline``:
    when the first bytes are due, for a call whose wait began before (see
    :mod:`proxy.handler.flight`); its reply may have begun in ``conn.replies``.
    """
    reader = conn.replies
    stream = client is not None and client.transport is Transport.BUFFERED
    keep = client is None or not stream or on_reply is not None or hold_exception
    reader.keep = keep
    held: list[bytes] = []
    prefix = bytearray()  # header and the first bytes of the result: enough for the outcome
    header_length = 0
    got_bytes = reader.buffered > 0
    sent = False
    while True:
        try:
            piece = reader.take()
        except ProtocolError as exc:
            raise started(UpstreamProtocolError(f"bad reply: {exc}"), sent) from exc
        if piece is not None:
            if not header_length:
                h = piece.header
                check_reply_header(name, seqid, h.name, h.type, h.seqid)
                header_length = h.length
                if hold_exception and h.type == MessageType.EXCEPTION:
                    client, stream = None, False  # nothing has been sent yet: hold it
            if len(prefix) < header_length + 3:
                prefix += piece.data[: header_length + 3 - len(prefix)]
            if piece.last:
                whole = piece.message
                if client is None:
                    assert whole is not None
                    return whole
                small = whole is not None and len(whole.data) <= STORE_BEFORE_REPLY_BYTES
                if whole is not None and on_reply is not None and small:
                    await on_reply(whole)
                if stream:
                    await client.send(piece.data)
                else:
                    await client.send(client.transport.frame(b"".join([*held, piece.data])))
                if whole is not None and on_reply is not None and not small:
                    await on_reply(whole)
                return result_outcome(piece.header.type, bytes(prefix[header_length:]))
            if stream:
                assert client is not None
                if piece.data:
                    await client.send(piece.data)
                    sent = True
                if keep and reader.buffered > keep_limit:
                    reader.keep = keep = False  # too big to cache: stream it only
            else:
                held.append(piece.data)
        try:
            chunk = await receive(conn, timeout, got_bytes=got_bytes, deadline=deadline)
        except UpstreamError as exc:
            raise started(exc, sent) from exc
        got_bytes, deadline = True, None
        reader.feed(chunk)
