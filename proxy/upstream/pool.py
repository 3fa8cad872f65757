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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from proxy import idl
from proxy.config import Endpoint, Options
from proxy.memo import BoundedMemo, Footprint, footprint_of
from proxy.metrics import Metrics
from proxy.sasl.stream import ByteReader, ByteWriter
from proxy.tasks import background
from proxy.tls import upstream_context
from proxy.upstream.connection import Identity, UpstreamConnection
from proxy.upstream.errors import (
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from proxy.upstream.relay import READ_SIZE, Timeouts, exchange
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, MessageReader

log = logging.getLogger(__name__)

# How long an endpoint that refused a connection is passed over while others are tried.
ENDPOINT_BACKOFF_SECONDS = 10.0
# set_ugi arguments are a user and its groups, a few hundred bytes; a client can send
# megabytes. Identities bigger than this are neither pooled nor remembered.
MAX_POOLED_IDENTITY = 64 * 1024
UGI_REPLY_BYTES = 4 << 20


# Opens the byte stream to one endpoint (TCP, with TLS if configured; tests pass their own).
Opener = Callable[[Endpoint], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class UpstreamAuth(Protocol):
    """How a new connection authenticates (SASL on a Kerberized metastore)."""

    @property
    def per_user(self) -> bool:
        """Whether an identity's user is bound by the negotiation (a delegation token of
        theirs): then no connection of another identity can become theirs by set_ugi."""

    async def prepare(self, identity: Identity | None) -> None:
        """What a connection for ``identity`` needs first (its token), before a slot is held."""

    async def negotiate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        endpoint: Endpoint,
        identity: Identity | None,
    ) -> tuple[ByteReader, ByteWriter]:
        """The streams of an authenticated connection; raises UpstreamAuthFailed."""


class UpstreamPool:
    """Connections to the metastore, reused across clients, kept apart by identity."""

    def __init__(
        self,
        options: Options,
        metrics: Metrics,
        *,
        opener: Opener | None = None,
        auth: UpstreamAuth | None = None,
    ) -> None:
        self.options = options
        self.auth = auth
        self.metrics = metrics
        self.timeouts = Timeouts(options.upstream_read_timeout)
        self._tls = upstream_context(options)
        self._open_stream = opener or self._open_tcp
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
        self, identity: Identity | None, *, fresh: bool = False, _retried: bool = False
    ) -> UpstreamConnection:
        """A connection running as ``identity``; ``fresh`` skips pooled ones (after a stale one).

        At the connection limit it waits (up to ``--upstream-connect-timeout``) for one to
        come back, and takes it if it runs as ``identity``; otherwise it closes the oldest
        idle connection and opens its own.
        """
        deadline = time.monotonic() + self.options.upstream_connect_timeout
        if self.auth is not None:
            await self.auth.prepare(identity)
        while True:
            if not fresh:
                conn = self._take_idle(identity)
                if conn is not None:
                    return conn
                if self._can_bind(identity):
                    anonymous = self._take_idle(None)
                    if anonymous is not None:
                        return await self._bind(anonymous, identity)  # type: ignore[arg-type]
            if await self._reserve_slot(deadline, identity, fresh=fresh):
                break
        try:
            conn = await self._connect(identity)
        except UpstreamAuthFailed as exc:
            await self._free_slot()
            if not exc.retry or _retried:
                raise
            # E.g. a delegation token the HMS forgot: a new one is fetched (on a connection of
            # the proxy's own, so not while this slot is held), then one more try.
            log.info("metastore refused a connection (%s); trying once more", exc)
            return await self.acquire(identity, fresh=True, _retried=True)
        except BaseException:
            await self._free_slot()
            raise
        if identity is not None and identity.binds_by_set_ugi:
            return await self._bind(conn, identity)
        conn.identity = identity
        return conn

    def _can_bind(self, identity: Identity | None) -> bool:
        """Whether an anonymous connection can become ``identity``'s by ``set_ugi``."""
        if identity is None or not identity.binds_by_set_ugi:
            return False
        return not (identity.user and self.auth is not None and self.auth.per_user)

    @contextlib.asynccontextmanager
    async def connection(
        self,
        identity: Identity | None,
        *,
        fresh: bool = False,
        pinned: UpstreamConnection | None = None,
    ) -> AsyncIterator[UpstreamConnection]:
        """A connection for one exchange: given back afterwards, or closed if the exchange
        failed in any way (its reply may be half read: it cannot serve anyone else).

        ``pinned``: the client's own connection, used instead of a pooled one; it is closed
        the same way on failure (its owner sees ``conn.closed``).
        """
        conn = pinned or await self.acquire(identity, fresh=fresh)
        try:
            yield conn
        except BaseException:
            self.discard(conn)
            raise
        self.release(conn, reusable=True)

    def release(self, conn: UpstreamConnection, *, reusable: bool) -> None:
        """Give a connection back after a call; closed instead if it cannot be reused."""
        conn.calls += 1
        if conn.pinned or conn.closed:
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

    def ugi_replies_footprint(self) -> Footprint:
        return footprint_of(self._ugi_replies)

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
        if conn.closed:
            return  # once only: it stopped counting against the limit the first time
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
                self._pop_oldest_idle().close()
                self._open -= 1
            self._open += 1
        self._update_gauges()
        return True

    def _usable_idle(self, identity: Identity | None) -> bool:
        """Whether an idle connection that ``identity`` would take exists."""
        return bool(self._idle.get(identity)) or (
            self._can_bind(identity) and bool(self._idle.get(None))
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

    async def _connect(self, identity: Identity | None = None) -> UpstreamConnection:
        errors = []
        for endpoint in self._endpoint_order():
            try:
                reader, writer = await asyncio.wait_for(
                    self._open_stream(endpoint), self.options.upstream_connect_timeout
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
            if self.auth is None:
                return UpstreamConnection(endpoint, reader, writer, replies)
            try:
                streams = await self.auth.negotiate(reader, writer, endpoint, identity)
            except BaseException:
                writer.close()
                raise
            return UpstreamConnection(endpoint, *streams, replies)
        raise UpstreamUnreachable("no metastore reachable (" + "; ".join(errors) + ")")

    async def open_raw(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A bare stream to the first metastore that answers, outside the pool (for relaying
        an engine's own SASL negotiation to it)."""
        errors = []
        for endpoint in self._endpoint_order():
            try:
                return await self._open_stream(endpoint)
            except OSError as exc:
                errors.append(f"{endpoint}: {exc}")
        raise OSError("no metastore reachable (" + "; ".join(errors) + ")")

    async def _open_tcp(
        self, endpoint: Endpoint
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(
            endpoint.host,
            endpoint.port,
            limit=READ_SIZE,
            ssl=self._tls,
            server_hostname=endpoint.host if self._tls else None,
        )

    async def _bind(self, conn: UpstreamConnection, identity: Identity) -> UpstreamConnection:
        """Replay ``set_ugi`` on ``conn`` so that it runs as ``identity``."""
        try:
            reply = await exchange(conn, identity.call(), "set_ugi", 0, self.timeouts.read)
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
        timeout: float | None = None,
        /,
        **args: object,
    ) -> Message:
        """One call of the proxy's own on a pooled connection running as ``identity``, its
        whole reply (raises UpstreamError); ``timeout`` defaults to ``Timeouts.own_call``."""
        request = idl.encode_call(method, 0, **args)
        async with self.connection(identity) as conn:
            return await exchange(conn, request, method, 0, timeout or self.timeouts.own_call)

    async def probe(self) -> bool:
        """Does a metastore answer a call now? (fb303 ``getStatus``, for readiness.)"""
        try:
            reply = await self.ask(None, "getStatus", self.timeouts.probe)
        except UpstreamError:
            return False
        return reply.header.type == MessageType.REPLY

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._discard(self._pop_oldest_idle())


def set_ugi_succeeded(reply: Message) -> bool:
    if reply.header.type != MessageType.REPLY:
        return False
    try:
        result = idl.decode_result("set_ugi", reply.body)
    except ProtocolError:
        return False
    return result.success is not None
