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

At ``--upstream-max-connections`` (a protection for the HMS: never more connections open) a
caller waits its turn, first come, first served, for as long as the call itself may take
(``--upstream-read-timeout`` for a client's call, the own calls' bound for the proxy's):
talking to the HMS directly, such a call would have queued on the HMS's thread pool and been
slow, not failed, so the proxy fails a call for its own limit no sooner than for slowness.
Reads may hold all but an eighth of the connections; the rest is the writes' (see
:func:`read_share`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from proxy import idl
from proxy.config import Endpoint, Options
from proxy.memo import BoundedMemo, Footprint, footprint_of
from proxy.metrics import Metrics
from proxy.sasl.stream import ByteReader, ByteWriter
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
from proxy.upstream.streams import diverting, open_connection
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


def read_share(limit: int) -> int:
    """How many of ``limit`` connections reads may hold at once: all but an eighth (and
    all but one from two connections on; 56 of the default 64).

    Writes get capacity of their own rather than a place at the head of the queue: a write
    fences its tables, so every read of them goes to the metastore until the write is
    answered; that is when the pool fills up, with reads the metastore is slow on. At the
    head of the queue the write would still wait for one of them to finish, prolonging the
    pile-up it caused and risking its own bound; with a reserve it starts at once."""
    return max(1, limit - max(1, limit // 8))


@dataclass(eq=False)
class _Waiter:
    """A caller waiting its turn for a connection."""

    ticket: int  # arrival order
    write: bool
    woken: asyncio.Future[None]


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
        self._read_share = read_share(options.upstream_max_connections)
        self._reads_held = 0  # connections in use by reads (or being opened for one)
        # Callers waiting their turn, reads and writes apart, each in arrival order.
        self._queues: dict[bool, deque[_Waiter]] = {False: deque(), True: deque()}
        self._tickets = itertools.count()
        self._endpoint_failed_at: dict[Endpoint, float] = {}
        self._down: set[Endpoint] = set()  # endpoints whose last connection attempt failed
        # The HMS's reply to each identity's set_ugi, so a client repeating it can be answered
        # without a round trip (the HMS answers the same arguments the same way).
        self._ugi_replies: BoundedMemo[Identity, Message] = BoundedMemo(
            10_000, UGI_REPLY_BYTES, largest=MAX_POOLED_IDENTITY
        )
        self._closed = False
        # Read when scraped (two ints, from the scrape's thread): nothing to update per call.
        connections = self.metrics.upstream_connections
        connections.labels("idle").set_function(lambda: self._idle_count)
        connections.labels("active").set_function(lambda: self._open - self._idle_count)

    # -- acquiring and releasing ---------------------------------------------------------

    async def acquire(
        self,
        identity: Identity | None,
        *,
        fresh: bool = False,
        write: bool = False,
        patience: float | None = None,
        _retried: bool = False,
    ) -> UpstreamConnection:
        """A connection running as ``identity``; ``fresh`` skips pooled ones (after a stale
        one); ``write``: for a call that may change metadata (it may use every connection,
        reads all but an eighth).

        At the limit it waits its turn, first come, first served, up to ``patience`` seconds
        (``--upstream-read-timeout`` unless told: the bound of the call it is for), then
        raises UpstreamUnavailable. Its turn come, it takes an idle connection running as
        ``identity``, or else closes the oldest idle connection and opens its own.
        """
        patience = self.timeouts.read if patience is None else patience
        deadline = time.monotonic() + patience
        if self.auth is not None:
            await self.auth.prepare(identity)
        idle = await self._wait_turn(identity, fresh, write, deadline, patience)
        if idle is not None:
            if idle.identity is None and identity is not None:
                return await self._bind(idle, identity)  # an anonymous one, bound by set_ugi
            return idle
        # A slot is counted for a new connection.
        try:
            conn = await self._connect(identity)
        except UpstreamAuthFailed as exc:
            self._free_slot(write=write)
            if not exc.retry or _retried:
                raise
            # E.g. a delegation token the HMS forgot: a new one is fetched (on a connection of
            # the proxy's own, so not while this slot is held), then one more try.
            log.info("metastore refused a connection (%s); trying once more", exc)
            left = max(0.0, deadline - time.monotonic())
            return await self.acquire(
                identity, fresh=True, write=write, patience=left, _retried=True
            )
        except BaseException:
            self._free_slot(write=write)
            raise
        conn.held_by_read = not write
        if identity is not None and identity.binds_by_set_ugi:
            return await self._bind(conn, identity)
        conn.identity = identity
        return conn

    def take_now(self, identity: Identity | None) -> UpstreamConnection | None:
        """An idle connection running as ``identity`` whose replies can be taken as they
        arrive, for a read, if one can be had at once (no one waits, no set_ugi to replay,
        no SASL); ``None`` otherwise (then :meth:`acquire` it is). Given back as acquired."""
        queues = self._queues
        if self.auth is not None or self._closed or queues[False] or queues[True]:
            return None
        if self._reads_held >= self._read_share:
            return None
        queue = self._idle.get(identity)
        if not queue or queue[-1].diverter is None:
            return None
        conn = self._take_idle(identity)
        if conn is None:
            return None
        self._reads_held += 1
        conn.held_by_read = True
        if conn.diverter is None:  # (one opener opens all: not so, but never assumed)
            self.release(conn, reusable=True)
            return None
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
        write: bool = False,
        patience: float | None = None,
        pinned: UpstreamConnection | None = None,
    ) -> AsyncIterator[UpstreamConnection]:
        """A connection for one exchange: given back afterwards, or closed if the exchange
        failed in any way (its reply may be half read: it cannot serve anyone else).
        ``write`` and ``patience`` as for :meth:`acquire`.

        ``pinned``: the client's own connection, used instead of a pooled one; it is closed
        the same way on failure (its owner sees ``conn.closed``).
        """
        conn = pinned or await self.acquire(identity, fresh=fresh, write=write, patience=patience)
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
        self._unhold(conn)
        if not reusable or self._closed or not conn.usable or conn.replies.buffered:
            self._discard(conn)
            return
        if conn.identity is not None and len(conn.identity.args) > MAX_POOLED_IDENTITY:
            self._discard(conn)  # an idle connection must not keep megabytes of set_ugi alive
            return
        conn.idle_since = time.monotonic()
        idle = self._idle
        queue = idle.get(conn.identity)
        if queue is None:
            idle[conn.identity] = deque((conn,))
        else:
            queue.append(conn)
            idle.move_to_end(conn.identity)
        self._idle_count += 1
        while self._idle_count > self.options.upstream_max_idle:
            self._discard(self._pop_oldest_idle())
        queues = self._queues
        if queues[False] or queues[True]:  # (no one waits, the usual: nothing to wake)
            self._wake_next()

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
        self._unhold(conn)
        conn.close()
        self._open -= 1
        self._wake_next()

    # -- waiting one's turn ------------------------------------------------------------------

    async def _wait_turn(
        self,
        identity: Identity | None,
        fresh: bool,
        write: bool,
        deadline: float,
        patience: float,
    ) -> UpstreamConnection | None:
        """Wait for this caller's turn (until ``deadline``, ``patience`` seconds after it
        asked), then take what :meth:`_take` gives. A newcomer queues behind every waiter
        that could take what it would."""
        waiter: _Waiter | None = None
        queued_at = 0.0
        try:
            while True:
                if waiter is not None:  # wakes from here on are kept for the wait below
                    waiter.woken = asyncio.get_running_loop().create_future()
                if self._may_take(waiter, write):
                    return self._take(identity, fresh=fresh, write=write)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._busy(write, patience)
                if waiter is None:
                    waiter = self._enqueue(write)
                    queued_at = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.woken, remaining)
        finally:
            if waiter is not None:
                self._queues[waiter.write].remove(waiter)
                self._update_waiting(write)
                self.metrics.upstream_wait.observe(time.monotonic() - queued_at)
                self._wake_next()  # its turn, if it had come, passes on

    def _enqueue(self, write: bool) -> _Waiter:
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._tickets), write, future)
        self._queues[write].append(waiter)
        self._update_waiting(write)
        return waiter

    def _update_waiting(self, write: bool) -> None:
        kind = "write" if write else "read"
        self.metrics.upstream_waiting.labels(kind).set(len(self._queues[write]))

    def _room(self, write: bool) -> bool:
        """Whether a caller of this kind could take a connection now (an idle one, a slot
        left, or a slot made by closing an idle connection of another identity)."""
        full = self._open >= self.options.upstream_max_connections and not self._idle_count
        return not full and (write or self._reads_held < self._read_share)

    def _first_in_line(self) -> _Waiter | None:
        """The earliest waiter that could take a connection now."""
        heads = [q[0] for write, q in self._queues.items() if q and self._room(write)]
        return min(heads, key=lambda w: w.ticket, default=None)

    def _may_take(self, waiter: _Waiter | None, write: bool) -> bool:
        """Whether it is the turn of ``waiter`` (or of a newcomer: ``None``)."""
        return self._room(write) and self._first_in_line() is waiter

    def _wake_next(self) -> None:
        """Room may have come: wake the waiter whose turn it is (once it has taken its
        connection, it wakes the next)."""
        first = self._first_in_line()
        if first is not None and not first.woken.done():
            first.woken.set_result(None)

    def _take(
        self, identity: Identity | None, *, fresh: bool, write: bool
    ) -> UpstreamConnection | None:
        """For the caller whose turn it is (there is room): an idle connection running as
        ``identity`` (or an anonymous one to bind), unless it wants a ``fresh`` one; or
        ``None``: a slot counted for a new connection, made by closing the oldest idle
        connection if the limit is reached."""
        if not write:
            self._reads_held += 1
        conn = None if fresh else self._take_idle(identity)
        if conn is None and not fresh and self._can_bind(identity):
            conn = self._take_idle(None)
        if conn is not None:
            conn.held_by_read = not write
            return conn
        if self._open >= self.options.upstream_max_connections:
            self._pop_oldest_idle().close()
            self._open -= 1
        self._open += 1
        return None

    def _busy(self, write: bool, patience: float) -> UpstreamUnavailable:
        limit = self.options.upstream_max_connections
        if not self._room(write=True):  # every connection in use
            return UpstreamUnavailable(f"all {limit} metastore connections busy for {patience:g} s")
        return UpstreamUnavailable(
            f"all {self._read_share} metastore connections reads may hold (of {limit}) busy "
            f"for {patience:g} s"
        )

    def _unhold(self, conn: UpstreamConnection) -> None:
        """``conn`` is no longer in use by a read: one more read may take a connection."""
        if conn.held_by_read:
            conn.held_by_read = False
            self._reads_held -= 1

    def _free_slot(self, *, write: bool) -> None:
        """A slot counted for a new connection that was not opened after all."""
        self._open -= 1
        if not write:
            self._reads_held -= 1
        self._wake_next()

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
                conn = UpstreamConnection(endpoint, reader, writer, replies)
                conn.diverter = diverting(writer)
                return conn
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
        return await open_connection(
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

    async def ask(
        self,
        identity: Identity | None,
        method: str,
        timeout: float | None = None,
        /,
        **args: object,
    ) -> Message:
        """One call of the proxy's own on a pooled connection running as ``identity``, its
        whole reply (raises UpstreamError); ``timeout`` defaults to ``Timeouts.own_call``,
        and bounds the wait for a connection too."""
        return await self._ask(identity, method, timeout, False, args)

    async def ask_for_write(
        self, identity: Identity | None, method: str, /, **args: object
    ) -> Message:
        """As :meth:`ask`, for a call a write needs before it is forwarded, or the proxy's
        own housekeeping (delegation tokens, the notification log): it may take the
        connections kept for writes, so it never waits behind the clients' reads."""
        return await self._ask(identity, method, None, True, args)

    async def _ask(
        self,
        identity: Identity | None,
        method: str,
        timeout: float | None,
        write: bool,
        args: dict[str, object],
    ) -> Message:
        request = idl.encode_call(method, 0, **args)
        bound = timeout or self.timeouts.own_call
        async with self.connection(identity, write=write, patience=bound) as conn:
            return await exchange(conn, request, method, 0, bound)

    async def probe(self) -> bool:
        """Does a metastore answer a call now? (fb303 ``getStatus``, for readiness.)"""
        try:
            # On the connections kept for writes: under overload, the readiness probe must
            # not wait behind the clients' reads and find the metastore "down".
            reply = await self._ask(None, "getStatus", self.timeouts.probe, True, {})
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
