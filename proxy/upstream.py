"""Connections to the Hive Metastore: failover, timeouts, pooling, and set_ugi identity.

Trino and Presto open a new TCP connection for every metastore call; the proxy keeps a pool
so the HMS does not pay for that. A pooled connection is not a blank slate, though:
``set_ugi`` binds an identity to a connection for its whole life (the HMS refuses to change
it), and every later call on it runs as that user. So the pool is keyed by identity:

* a client that never called ``set_ugi`` gets a connection that never did either;
* a client that did gets a connection bound to the same ``set_ugi`` arguments, either one
  the pool already holds, or a fresh or anonymous one on which the proxy first replays the
  client's ``set_ugi`` (and checks the HMS accepted it).

Connections whose state the proxy cannot reproduce (``setMetaConf``) are pinned to their
client and closed with it, never pooled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from proxy import idl
from proxy.config import Endpoint, Options
from proxy.memo import BoundedMemo
from proxy.metrics import Metrics
from proxy.tasks import background
from proxy.tls import upstream_context
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, MessageReader

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
# How long an endpoint that refused a connection is passed over while others are tried.
ENDPOINT_BACKOFF_SECONDS = 10.0
# The proxy's own calls (the readiness probe, the notification follower, listing a database's
# tables before a drop) are not a client's: they get bounds of their own, short enough that a
# metastore that accepts connections but does not answer is noticed promptly.
PROBE_TIMEOUT = 5.0
OWN_CALL_TIMEOUT = 30.0
# set_ugi arguments are a user and its groups, a few hundred bytes; a client can send
# megabytes. Identities bigger than this are neither pooled nor remembered.
MAX_POOLED_IDENTITY = 64 * 1024
UGI_REPLY_BYTES = 4 << 20


class UpstreamError(Exception):
    """The exchange with the metastore failed; ``outcome`` is the metrics label.

    ``stale``: it failed before any reply byte on a connection that had served calls before,
    the signature of a pooled connection the HMS closed while idle. ``started_reply``: part
    of the reply had already gone to the client.
    """

    outcome = "connection_error"
    stale = False
    started_reply = False


class UpstreamUnavailable(UpstreamError):
    """No metastore connection to be had (none reachable, or all in use)."""


class UpstreamUnreachable(UpstreamUnavailable):
    """No metastore could be connected to (each failure is logged by the pool, once)."""


class UpstreamTimeout(UpstreamError):
    outcome = "timeout"


class UpstreamClosed(UpstreamError):
    """The connection ended mid-call. ``stale``: before any reply byte, on a reused one."""

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


class UpstreamProtocolError(UpstreamError):
    outcome = "protocol_error"


@dataclass(frozen=True, slots=True)
class Identity:
    """What a client's ``set_ugi`` said, as the bytes of its arguments.

    Keying by the exact bytes means "replay exactly what the client sent"; two clients that
    encode the same user differently just get separate pools, which is harmless.
    """

    args: bytes

    def call(self) -> bytes:
        return encode_header("set_ugi", MessageType.CALL, 0) + self.args


@dataclass(eq=False)
class UpstreamConnection:
    endpoint: Endpoint
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    replies: MessageReader
    identity: Identity | None = None
    calls: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    pinned: bool = False

    @property
    def usable(self) -> bool:
        """Not closed by either side (an idle HMS connection can be closed under us)."""
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class UpstreamPool:
    """Connections to the metastore, reused across clients, kept apart by identity."""

    def __init__(self, options: Options, metrics: Metrics) -> None:
        self.options = options
        self.metrics = metrics
        self._tls = upstream_context(options)
        self._idle: OrderedDict[Identity | None, deque[UpstreamConnection]] = OrderedDict()
        self._idle_count = 0
        self._open = 0  # idle + in use
        self._slots = asyncio.Condition()
        self._waiting = 0  # callers waiting in _reserve_slot for a connection to come back
        self._endpoint_failed_at: dict[Endpoint, float] = {}
        self._down: set[Endpoint] = set()  # endpoints whose last connection attempt failed
        # The HMS's reply to each identity's set_ugi, so a client repeating it can be answered
        # without a round trip (the HMS answers the same arguments the same way).
        self._ugi_replies: BoundedMemo[Identity, Message] = BoundedMemo(
            10_000, UGI_REPLY_BYTES, largest=MAX_POOLED_IDENTITY
        )
        self._closed = False
        self._update_gauges()

    # -- acquiring and releasing ---------------------------------------------------------

    async def acquire(
        self, identity: Identity | None, *, fresh: bool = False
    ) -> UpstreamConnection:
        """A connection running as ``identity``; ``fresh`` skips pooled ones (after a stale one).

        At the connection limit it waits (up to ``--upstream-connect-timeout``) for one to
        come back, and takes it if it runs as ``identity``; otherwise it closes the oldest
        idle connection and opens its own.
        """
        deadline = time.monotonic() + self.options.upstream_connect_timeout
        while True:
            if not fresh:
                conn = self._take_idle(identity)
                if conn is not None:
                    return conn
                if identity is not None:
                    anonymous = self._take_idle(None)
                    if anonymous is not None:
                        return await self._bind(anonymous, identity)
            if await self._reserve_slot(deadline, identity, fresh=fresh):
                break
        try:
            conn = await self._connect()
        except BaseException:
            await self._free_slot()
            raise
        if identity is not None:
            return await self._bind(conn, identity)
        return conn

    def release(self, conn: UpstreamConnection, *, reusable: bool) -> None:
        """Give a connection back after a call; closed instead if it cannot be reused."""
        conn.calls += 1
        if conn.pinned:
            return
        if not reusable or self._closed or not conn.usable or conn.replies.buffered:
            self._discard(conn)
            return
        if conn.identity is not None and len(conn.identity.args) > MAX_POOLED_IDENTITY:
            self._discard(conn)  # an idle connection must not keep megabytes of set_ugi alive
            return
        conn.idle_since = time.monotonic()
        queue = self._idle.setdefault(conn.identity, deque())
        queue.append(conn)
        self._idle.move_to_end(conn.identity)
        self._idle_count += 1
        while self._idle_count > self.options.upstream_max_idle:
            self._discard(self._pop_oldest_idle())
        self._update_gauges()
        if self._waiting:  # at the limit, someone waits for exactly this
            background(self._notify_slot(), "waking a caller waiting for a connection")

    def discard(self, conn: UpstreamConnection) -> None:
        """Close a connection that failed or is out of step; it never goes back to the pool."""
        if conn.pinned:
            conn.pinned = False
        self._discard(conn)

    async def pin(self, identity: Identity | None) -> UpstreamConnection:
        """A connection for one client alone (its state cannot be shared)."""
        conn = await self.acquire(identity)
        conn.pinned = True
        return conn

    def remember_ugi_reply(self, identity: Identity, reply: Message) -> None:
        self._ugi_replies.put(identity, reply, len(identity.args) + len(reply.data))

    def ugi_reply(self, identity: Identity) -> Message | None:
        return self._ugi_replies.get(identity)

    def bind(self, conn: UpstreamConnection, identity: Identity) -> None:
        """``conn`` ran ``set_ugi`` for ``identity`` successfully."""
        conn.identity = identity

    # -- internals -------------------------------------------------------------------------

    def _take_idle(self, identity: Identity | None) -> UpstreamConnection | None:
        queue = self._idle.get(identity)
        now = time.monotonic()
        found = None
        while queue:
            conn = queue.pop()  # most recently used first: it is the least likely to be stale
            self._idle_count -= 1
            if conn.usable and now - conn.idle_since < self.options.upstream_idle_timeout:
                found = conn
                break
            self._discard(conn)
        if queue is not None and not queue:
            # No empty queues stay behind: eviction takes the oldest identity's queue, and
            # it must hold a connection (many identities, each with its own, hit this).
            del self._idle[identity]
        self._update_gauges()
        return found

    def _pop_oldest_idle(self) -> UpstreamConnection:
        identity, queue = next(iter(self._idle.items()))
        conn = queue.popleft()
        if not queue:
            del self._idle[identity]
        self._idle_count -= 1
        return conn

    def _discard(self, conn: UpstreamConnection) -> None:
        conn.close()
        self._open -= 1
        self._update_gauges()
        background(self._notify_slot(), "waking a caller waiting for a connection")

    async def _notify_slot(self) -> None:
        async with self._slots:
            self._slots.notify()

    async def _reserve_slot(
        self, deadline: float, identity: Identity | None, *, fresh: bool
    ) -> bool:
        """Count a new connection against the limit (``True``), closing the oldest idle one
        if need be; or wait for a connection to come back (``False``: look at the idle ones
        again, one may be of the caller's identity, unless it wants a ``fresh`` one)."""
        limit = self.options.upstream_max_connections
        async with self._slots:
            if self._open >= limit and not fresh and self._usable_idle(identity):
                return False  # one came back while this caller waited for the lock: take it
            if self._open >= limit and not self._idle_count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise UpstreamUnavailable(f"all {limit} metastore connections busy")
                self._waiting += 1
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._slots.wait(), remaining)
                finally:
                    self._waiting -= 1
                return False
            if self._open >= limit:
                victim = self._pop_oldest_idle()
                victim.close()
                self._open -= 1
            self._open += 1
        self._update_gauges()
        return True

    def _usable_idle(self, identity: Identity | None) -> bool:
        """Whether an idle connection that ``identity`` would take exists."""
        return bool(self._idle.get(identity)) or (
            identity is not None and bool(self._idle.get(None))
        )

    async def _free_slot(self) -> None:
        self._open -= 1
        self._update_gauges()
        await self._notify_slot()

    def _endpoint_order(self) -> list[Endpoint]:
        """Configured order, passing over endpoints that failed recently (all, if all did)."""
        now = time.monotonic()
        healthy = [
            e
            for e in self.options.upstream
            if now - self._endpoint_failed_at.get(e, -1e9) > ENDPOINT_BACKOFF_SECONDS
        ]
        return healthy + [e for e in self.options.upstream if e not in healthy]

    async def _connect(self) -> UpstreamConnection:
        errors = []
        for endpoint in self._endpoint_order():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        endpoint.host,
                        endpoint.port,
                        limit=READ_SIZE,
                        ssl=self._tls,
                        server_hostname=endpoint.host if self._tls else None,
                    ),
                    self.options.upstream_connect_timeout,
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                self.metrics.upstream_connects.labels("failed").inc()
                self._endpoint_failed_at[endpoint] = time.monotonic()
                reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
                errors.append(f"{endpoint}: {reason}")
                # Said once when it goes down (and once when it is back), not at every try:
                # the health probe alone tries every 2 s.
                if endpoint not in self._down:
                    self._down.add(endpoint)
                    log.warning("cannot connect to metastore %s: %s", endpoint, reason)
                else:
                    log.debug("cannot connect to metastore %s: %s", endpoint, reason)
                continue
            self.metrics.upstream_connects.labels("ok").inc()
            self._endpoint_failed_at.pop(endpoint, None)
            if endpoint in self._down:
                self._down.discard(endpoint)
                log.info("metastore %s is reachable again", endpoint)
            replies = MessageReader(
                self.options.upstream_transport, self.options.max_reply_bytes, keep=False
            )
            return UpstreamConnection(endpoint, reader, writer, replies)
        raise UpstreamUnreachable("no metastore reachable (" + "; ".join(errors) + ")")

    async def _bind(self, conn: UpstreamConnection, identity: Identity) -> UpstreamConnection:
        """Replay ``set_ugi`` on ``conn`` so that it runs as ``identity``."""
        try:
            reply = await exchange(conn, identity.call(), "set_ugi", 0, self.options)
            if not set_ugi_succeeded(reply):
                raise UpstreamProtocolError("the metastore refused a replayed set_ugi")
        except BaseException:
            self._discard(conn)
            raise
        conn.identity = identity
        return conn

    def _update_gauges(self) -> None:
        self.metrics.upstream_connections.labels("idle").set(self._idle_count)
        self.metrics.upstream_connections.labels("active").set(self._open - self._idle_count)

    async def ask(
        self,
        identity: Identity | None,
        method: str,
        timeout: float = OWN_CALL_TIMEOUT,
        /,
        **args: object,
    ) -> Message:
        """One call of the proxy's own on a pooled connection running as ``identity``, its
        whole reply; the connection is closed if the exchange fails (raises UpstreamError)."""
        conn = await self.acquire(identity)
        try:
            reply = await exchange(
                conn, idl.encode_call(method, 0, **args), method, 0, self.options, timeout
            )
        except BaseException:
            self.discard(conn)
            raise
        self.release(conn, reusable=True)
        return reply

    async def probe(self) -> bool:
        """Does a metastore answer a call now? (fb303 ``getStatus``, for readiness.)"""
        try:
            reply = await self.ask(None, "getStatus", PROBE_TIMEOUT)
        except UpstreamError:
            return False
        return reply.header.type == MessageType.REPLY

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._discard(self._pop_oldest_idle())


async def send(
    conn: UpstreamConnection, data: bytes, options: Options, timeout: float | None = None
) -> None:
    conn.writer.write(options.upstream_transport.frame(data))
    try:
        # asyncio.timeout, not wait_for: no extra task per call on the hot path.
        async with asyncio.timeout(timeout or options.upstream_read_timeout):
            await conn.writer.drain()
    except TimeoutError as exc:
        raise UpstreamTimeout("timed out sending to the metastore") from exc
    except OSError as exc:
        raise UpstreamClosed(f"connection lost while sending: {exc}", stale=conn.calls > 0) from exc


async def receive(
    conn: UpstreamConnection,
    options: Options,
    *,
    got_bytes: bool,
    timeout: float | None = None,
) -> bytes:
    """The next bytes from the metastore; errors say whether the connection was stale."""
    limit = timeout or options.upstream_read_timeout
    try:
        async with asyncio.timeout(limit):
            data = await conn.reader.read(READ_SIZE)
    except TimeoutError as exc:
        raise UpstreamTimeout(f"the metastore sent nothing for {limit:g} s") from exc
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
    conn: UpstreamConnection,
    request: bytes,
    name: str,
    seqid: int,
    options: Options,
    timeout: float | None = None,
) -> Message:
    """Send one call and read its whole reply (for the proxy's own small calls)."""
    await send(conn, request, options, timeout)
    reader = MessageReader(options.upstream_transport, options.max_reply_bytes)
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
        reader.feed(await receive(conn, options, got_bytes=got, timeout=timeout))
        got = True


def set_ugi_succeeded(reply: Message) -> bool:
    if reply.header.type != MessageType.REPLY:
        return False
    try:
        result = idl.decode_result("set_ugi", reply.body)
    except ProtocolError:
        return False
    return result.success is not None
