"""A lean Redis client for the one hot operation: the look-up behind every cache hit.

redis-py does everything else (fills, bumps, cluster discovery, flushing). A hit, though, is
one HMGET (+ one MGET) and its cost should be a round trip, not a client library: here a
command is a ``transport.write`` of pre-encoded RESP, replies are parsed as they arrive in
``data_received`` (by hiredis when it is installed), and concurrent hits share the
connection by pipelining (Redis answers in order). On Redis Cluster, commands go to the node
that owns their key's slot, per the slot map redis-py keeps; a MOVED reply makes the look-up
fail over to the slow path once and the map refresh.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from redis import crc

from proxy.cache import redis_tls
from proxy.memo import BoundedMemo, Footprint, footprint_of

try:
    import hiredis
except ImportError:  # the pure reader below stands in
    hiredis = None  # type: ignore[assignment]

Command = tuple[bytes | str | int, ...]


class RespError(Exception):
    """An error reply (``-ERR ...``, ``-MOVED ...``)."""


class Disconnected(Exception):
    pass


# Encoded look-ups are memoised (hits repeat the same ones over and over), within a budget:
# their keys are digests, but a get_partitions_by_names of many names is one long MGET.
_ENCODED: BoundedMemo[Command, bytes] = BoundedMemo(16_384, 8 << 20, largest=8 * 1024)
_REPEATED = frozenset({"HMGET", "HGETALL", "MGET", "GET"})  # look-ups; a fence is never twice


def encoded_footprint() -> Footprint:
    """The memo of encoded commands (one per process, shared by every connection)."""
    return footprint_of(_ENCODED)


def encode(command: Command) -> bytes:
    """RESP for ``command``."""
    known = _ENCODED.get(command)
    if known is not None:
        return known
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    encoded = b"".join(out)
    if command[0] in _REPEATED:
        # The command's own strings are kept as the key: count them along with the encoding.
        _ENCODED.put(command, encoded, 2 * len(encoded))
    return encoded


class Reader(Protocol):
    """Bytes in, replies out (sans-I/O): ``feed`` what arrived, then ``gets`` until it returns
    :data:`INCOMPLETE`. Error replies are :class:`RespError` values, not raised; bytes that
    are not RESP raise :class:`Disconnected`."""

    def feed(self, data: bytes, /) -> None: ...

    def gets(self) -> Any: ...


INCOMPLETE: Any = object()  # what ``gets`` returns until a whole reply is in


class PureReader:
    """The fallback for when hiredis is not installed, in linear time: a reply that arrives in
    many pieces is not parsed again from its first byte on each (an MGET of 100,000 entries,
    5.7 MB in 64 KiB pieces, took 2.4 s that way; 57 ms like this). The reader keeps its
    place: how many bytes the value it is in needs before it is worth looking again, and the
    arrays it is part way through, with the items read so far."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # where the next value starts
        self._need = 0  # bytes the buffer must hold before that value can be complete
        self._arrays: list[tuple[list[Any], int]] = []  # (items so far, count), outermost first

    def feed(self, data: bytes, /) -> None:
        if self._pos:
            # Only what was consumed goes: deleting a bytearray's head moves its start and
            # copies nothing, so a long value still arriving is never copied here.
            del self._buf[: self._pos]
            self._need -= self._pos
            self._pos = 0
        self._buf += data

    def gets(self) -> Any:
        buf = self._buf
        while len(buf) >= self._need:
            pos = self._pos
            end = buf.find(b"\r\n", pos)
            if end < 0:
                self._need = len(buf) + 1
                return INCOMPLETE
            kind = buf[pos]
            try:
                size = int(buf[pos + 1 : end]) if kind in b"$*:" else 0
            except ValueError as exc:
                raise Disconnected(f"bad reply line {bytes(buf[pos:end])[:40]!r}") from exc
            value: Any
            if kind == 0x24 and size >= 0:  # $ bulk string
                stop = end + 2 + size
                if len(buf) < stop + 2:
                    self._need = stop + 2
                    return INCOMPLETE
                value, self._pos = bytes(buf[end + 2 : stop]), stop + 2
            elif kind == 0x2A and size > 0:  # * array: its items are the next values
                self._arrays.append(([], size))
                self._pos = self._need = end + 2
                continue
            else:
                self._pos = self._need = end + 2
                if kind in b"$*":  # nil (-1) or an empty array
                    value = None if size < 0 else []
                elif kind == 0x3A:  # : integer
                    value = size
                elif kind == 0x2B:  # + simple string
                    value = bytes(buf[pos + 1 : end])
                elif kind == 0x2D:  # - error
                    value = RespError(bytes(buf[pos + 1 : end]).decode("utf-8", "replace"))
                else:
                    raise Disconnected(f"unexpected reply byte {bytes([kind])!r}")
            self._need = self._pos
            while self._arrays:  # a value completes the arrays it ends
                items, count = self._arrays[-1]
                items.append(value)
                if len(items) < count:
                    break
                value = items
                self._arrays.pop()
            else:
                return value
        return INCOMPLETE


def reader() -> Reader:
    """hiredis's reader (C: 10 to 25 times faster on a large reply) when it is installed,
    else ours."""
    if hiredis is None:
        return PureReader()
    reply: Reader = hiredis.Reader(
        protocolError=Disconnected, replyError=RespError, notEnoughData=INCOMPLETE
    )
    return reply


class RespConnection(asyncio.Protocol):
    def __init__(self, new_reader: Callable[[], Reader] = reader) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader = new_reader()
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._outgoing: list[bytes] = []
        self.closed = False
        # A subscribed connection's messages (replies no command waits for), and its end.
        self.on_push: Callable[[Any], None] | None = None
        self.on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not asserted with isinstance: uvloop's are not subclasses of
        # asyncio.Transport (they implement the same methods).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            while self._waiting or self.on_push is not None:
                value = self._reader.gets()
                if value is INCOMPLETE:
                    break
                if not self._waiting:
                    assert self.on_push is not None
                    self.on_push(value)
                    continue
                future = self._waiting.popleft()
                if not future.done():  # abandoned by a timed-out caller: its reply is dropped
                    future.set_result(value)
        except Disconnected as exc:
            self._fail(exc)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(Disconnected(str(exc) if exc else "connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self.on_lost is not None:
            self.on_lost()
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(exc)
                # A caller gathering several replies sees the first failure only; the rest
                # would be logged as "never retrieved" when collected. Marked as seen here.
                future.exception()

    def send(self, commands: Sequence[Command]) -> list[asyncio.Future[Any]]:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise Disconnected("not connected")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self._waiting.extend(futures)
        # Commands sent in the same turn of the loop (busy clients) leave in one write.
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.extend(encode(c) for c in commands)
        return futures

    def _flush(self) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def replies_within(futures: Sequence[asyncio.Future[Any]], timeout: float) -> list[Any]:
    """The replies, or TimeoutError for those not in after ``timeout`` seconds.

    Not asyncio.timeout: when this process was not scheduled for a while (a busy machine),
    the replies and the deadline come due in the same turn of the loop. The replies are read
    first (I/O callbacks run before timers), so the deadline finds them in and passes; a
    timeout would cancel the task all the same and blame Redis for our own lateness.
    """

    def expire() -> None:
        for future in futures:
            if not future.done():
                future.set_exception(TimeoutError(f"redis did not answer in {timeout:g} s"))
                future.exception()  # the caller raises the first; the rest are not "lost"

    handle = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return [await f for f in futures]
    finally:
        handle.cancel()


async def open_connection(kwargs: dict[str, Any], timeout: float) -> RespConnection:
    """A connection from redis-py's parsed URL (host/port or path, auth, db, TLS as redis-py
    makes it: see proxy.cache.redis_tls)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        if kwargs.get("path"):
            _, conn = await loop.create_unix_connection(RespConnection, kwargs["path"])
        else:
            _, conn = await loop.create_connection(
                RespConnection,
                kwargs.get("host", "localhost"),
                int(kwargs.get("port", 6379)),
                ssl=redis_tls.context(kwargs) if redis_tls.uses_tls(kwargs) else None,
            )
        try:
            await _set_up(conn, kwargs)
        except BaseException:  # refused, timed out or cancelled: not left open
            conn.close()
            raise
    return conn


async def _set_up(conn: RespConnection, kwargs: dict[str, Any]) -> None:
    """AUTH and SELECT as the URL says."""
    setup: list[Command] = []
    if kwargs.get("password"):
        user = kwargs.get("username")
        setup.append(("AUTH", user, kwargs["password"]) if user else ("AUTH", kwargs["password"]))
    if int(kwargs.get("db") or 0):
        setup.append(("SELECT", int(kwargs["db"])))
    if setup:
        for reply in await asyncio.gather(*conn.send(setup)):
            if isinstance(reply, RespError):
                raise reply


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster slot of ``key`` (its hash tag's, if it has one), as redis-py
    computes it; ours takes the str keys the look-ups are made of, too."""
    return crc.key_slot(key.encode() if isinstance(key, str) else key)
