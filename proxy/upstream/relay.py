"""One call on one metastore connection: send it, then stream or hold the reply.

Nothing here knows about the cache, the pool or the options: a call gets its connection,
its bounds (:class:`Timeouts`) and, when its reply is streamed, the client to write to.
A reply is read whole before any of it is sent (see :func:`relay`), so its size is known
before the client sees a byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.loop import guarded_write
from proxy.upstream.connection import UpstreamConnection
from proxy.upstream.errors import (
    ReplyTooLarge,
    UpstreamClosed,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from proxy.wire.binary import MessageType
from proxy.wire.errors import MessageTooLarge, ProtocolError
from proxy.wire.framing import Message, Transport

READ_SIZE = 256 * 1024
# What the proxy reads of a reply it must take whatever its size: a write's (applied by the
# metastore: refusing its reply would tell the client a done write failed), and its own
# calls' (a page of the notification log). The old --max-reply-bytes default, doubled.
UNREFUSED_REPLY_BYTES = 1 << 30
# Replies up to this size are kept (for the cache) before they go out (a few hundred
# microseconds at most); bigger ones after, off the client's clock.
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
    reply = await read_reply(conn, name, seqid, timeout, limit=UNREFUSED_REPLY_BYTES)
    if conn.replies.buffered:
        raise UpstreamProtocolError("metastore sent bytes after its reply")
    return reply


async def read_reply(
    conn: UpstreamConnection,
    name: str,
    seqid: int,
    timeout: float,
    deadline: float | None = None,
    *,
    limit: int | None = None,
) -> Message:
    """The whole reply to the call ``name``/``seqid`` on ``conn``, each wait for bytes
    bounded by ``timeout`` (the first by ``deadline`` if given, in the loop's time: a call
    whose wait began before, see :mod:`proxy.handler.flight`; its reply may have begun in
    ``conn.replies``). A reply longer than the connection's limit (``conn.replies.max_size``,
    ``--max-reply-bytes``; ``limit`` instead, for this reply, when given: a reply that must
    be taken whatever its size) raises :class:`ReplyTooLarge` as soon as that shows,
    holding no more of it than the limit."""
    reader = conn.replies
    if limit is None:
        return await _read_reply(conn, name, seqid, timeout, deadline)
    usual = reader.max_size
    reader.max_size = limit
    try:
        return await _read_reply(conn, name, seqid, timeout, deadline)
    finally:
        reader.max_size = usual


async def _read_reply(
    conn: UpstreamConnection, name: str, seqid: int, timeout: float, deadline: float | None
) -> Message:
    reader = conn.replies
    reader.keep = True
    got_bytes = reader.buffered > 0
    checked = False
    while True:
        try:
            message = reader.next_message()
        except MessageTooLarge as exc:
            raise ReplyTooLarge(
                f"the reply to {name} is larger than {reader.max_size} bytes", limit=reader.max_size
            ) from exc
        except ProtocolError as exc:
            raise UpstreamProtocolError(f"bad reply: {exc}") from exc
        if message is not None:
            h = message.header
            check_reply_header(name, seqid, h.name, h.type, h.seqid)
            return message
        header = reader.header
        if header is not None and not checked:  # (a mismatched reply fails at once)
            check_reply_header(name, seqid, header.name, header.type, header.seqid)
            checked = True
        reader.feed(await receive(conn, timeout, got_bytes=got_bytes, deadline=deadline))
        got_bytes, deadline = True, None


async def relay(
    conn: UpstreamConnection,
    name: str,
    seqid: int,
    client: ClientChannel | None,
    timeout: float,
    *,
    on_reply: OnReply | None = None,
    hold_exception: bool = False,
    deadline: float | None = None,
    limit: int | None = None,
) -> str | Message:
    """Read one reply from ``conn`` whole (:func:`read_reply`), then send it to ``client``,
    or return it (no ``client``).

    A reply goes out only once whole, so that one past the client's limit can still be
    answered with an error naming it (:class:`ReplyTooLarge`) instead of a connection cut
    in the middle of a message (what a Thrift 0.14+ client does past its 100 MiB): the
    proxy holds at most ``--max-reply-bytes`` per call.

    Returns the outcome label once the reply went out, or the whole reply when held.
    ``on_reply`` gets the whole reply; it runs before the reply is sent when the reply is
    small (so the client's next call can already hit), after it otherwise. With
    ``hold_exception``, an ``EXCEPTION`` reply is not sent but returned whole, for the
    caller to look at (the bridge for removed methods, :mod:`proxy.bridge`). ``deadline``
    and ``limit``: as for :func:`read_reply`.
    """
    whole = await read_reply(conn, name, seqid, timeout, deadline, limit=limit)
    kind = whole.header.type
    if client is None or (hold_exception and kind == MessageType.EXCEPTION):
        return whole
    small = len(whole.data) <= STORE_BEFORE_REPLY_BYTES
    if on_reply is not None and small:
        await on_reply(whole)
    await client.send(client.transport.frame(whole.data))
    if on_reply is not None and not small:
        await on_reply(whole)
    start = whole.header.length  # (the result's first bytes, not a copy of the body)
    return result_outcome(kind, whole.data[start : start + 3])
