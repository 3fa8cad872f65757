"""A lean Redis client for the one hot operation: the look-up behind every cache hit.

redis-py does everything else (fills, bumps, cluster discovery, flushing). A hit, though, is
one HMGET (+ one MGET) and its cost should be a round trip, not a client library: here a
command is a ``transport.write`` of pre-encoded RESP, replies are parsed as they arrive in
``data_received``, and concurrent hits share the connection by pipelining (Redis answers in
order). On Redis Cluster, commands go to the node that owns their key's slot, per the slot
map redis-py keeps; a MOVED reply makes the look-up fail over to the slow path once and the
map refresh.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any

from proxy.memo import BoundedMemo

Command = tuple[bytes | str | int, ...]


class RespError(Exception):
    """An error reply (``-ERR ...``, ``-MOVED ...``)."""


class Disconnected(Exception):
    pass


# Encoded look-ups are memoised (hits repeat the same ones over and over), within a budget:
# their keys are digests, but a get_partitions_by_names of many names is one long MGET.
_ENCODED: BoundedMemo[Command, bytes] = BoundedMemo(16_384, 8 << 20, largest=8 * 1024)
_REPEATED = frozenset({"HMGET", "HGETALL", "MGET", "GET"})  # look-ups; a fence is never twice


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


_INCOMPLETE = object()


def parse(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One reply at ``pos``: (value, next position), or (_INCOMPLETE, pos)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    if kind == 0x24:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            return _INCOMPLETE, pos
        return bytes(buf[end + 2 : stop]), stop + 2
    if kind == 0x2A:  # * array
        count = int(line)
        if count < 0:
            return None, end + 2
        items = []
        at = end + 2
        for _ in range(count):
            item, at2 = parse(buf, at)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
            at = at2
        return items, at
    if kind == 0x3A:  # : integer
        return int(line), end + 2
    if kind == 0x2B:  # + simple string
        return line, end + 2
    if kind == 0x2D:  # - error
        return RespError(line.decode("utf-8", "replace")), end + 2
    raise Disconnected(f"unexpected reply byte {kind!r}")


class RespConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._outgoing: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        try:
            while pos < len(buf) and self._waiting:
                value, nxt = parse(buf, pos)
                if value is _INCOMPLETE:
                    break
                pos = nxt
                future = self._waiting.popleft()
                if not future.done():  # abandoned by a timed-out caller: its reply is dropped
                    future.set_result(value)
        except (Disconnected, ValueError) as exc:
            self._fail(Disconnected(str(exc)))
            if self.transport is not None:
                self.transport.close()
            return
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(Disconnected(str(exc) if exc else "connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
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
    """A connection from redis-py's parsed URL (host/port or path, auth, db, TLS)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        if kwargs.get("path"):
            _, conn = await loop.create_unix_connection(RespConnection, kwargs["path"])
        else:
            context = None
            if kwargs.get("ssl") or kwargs.get("connection_class_name") == "SSLConnection":
                context = ssl.create_default_context(cafile=kwargs.get("ssl_ca_certs"))
                if kwargs.get("ssl_certfile"):
                    context.load_cert_chain(kwargs["ssl_certfile"], kwargs.get("ssl_keyfile"))
                if kwargs.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
            _, conn = await loop.create_connection(
                RespConnection,
                kwargs.get("host", "localhost"),
                int(kwargs.get("port", 6379)),
                ssl=context,
            )
        setup: list[Command] = []
        if kwargs.get("password"):
            user = kwargs.get("username")
            setup.append(
                ("AUTH", user, kwargs["password"]) if user else ("AUTH", kwargs["password"])
            )
        if int(kwargs.get("db") or 0):
            setup.append(("SELECT", int(kwargs["db"])))
        if setup:
            for reply in await asyncio.gather(*conn.send(setup)):
                if isinstance(reply, RespError):
                    conn.close()
                    raise reply
    return conn


# CRC16-CCITT (XMODEM), as Redis Cluster hashes keys to slots.
_CRC_TABLE = []
for _i in range(256):
    _crc = _i << 8
    for _ in range(8):
        _crc = ((_crc << 1) ^ 0x1021) if _crc & 0x8000 else (_crc << 1)
    _CRC_TABLE.append(_crc & 0xFFFF)


def key_slot(key: str | bytes) -> int:
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    crc = 0
    for byte in raw:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC_TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc % 16384
