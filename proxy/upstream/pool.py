"""Connections to the Hive Metastore, pooled, and kept apart by set_ugi identity.

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

The pool is put together from: :mod:`.admission` (when a caller may take a connection: the
connection limit, the reads' share, the line of those waiting), :mod:`.idle` (the idle
connections by identity) and :mod:`.endpoints` (which metastore a new connection goes to,
and how it authenticates). What stays here is which connection a caller gets, and what it
runs as.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from proxy import idl
from proxy.config import Options
from proxy.memo import BoundedMemo, Footprint, footprint_of
from proxy.metrics import Metrics
from proxy.upstream.admission import ANONYMOUS, Admission, Lane, LaneKind
from proxy.upstream.connection import Identity, UpstreamConnection
from proxy.upstream.endpoints import Endpoints, Opener, UpstreamAuth
from proxy.upstream.errors import UpstreamAuthFailed, UpstreamError, UpstreamProtocolError
from proxy.upstream.idle import IdleConnections
from proxy.upstream.relay import Timeouts, exchange
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# set_ugi arguments are a user and its groups, a few hundred bytes; a client can send
# megabytes. Identities bigger than this are neither pooled nor remembered.
MAX_POOLED_IDENTITY = 64 * 1024
UGI_REPLY_BYTES = 4 << 20


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
        self._endpoints = Endpoints(options, metrics, opener)
        self._idle = IdleConnections(
            options.upstream_max_idle, options.upstream_idle_timeout, self._discard
        )
        self._admission = Admission(
            options.upstream_max_connections,
            self._idle,
            metrics,
            heavy_limit=options.heavy_max_concurrent,
        )
        # The HMS's reply to each identity's set_ugi, so a client repeating it can be answered
        # without a round trip (the HMS answers the same arguments the same way).
        self._ugi_replies: BoundedMemo[Identity, Message] = BoundedMemo(
            10_000, UGI_REPLY_BYTES, largest=MAX_POOLED_IDENTITY
        )
        self._closed = False
        # Read when scraped (two ints, from the scrape's thread): nothing to update per call.
        idle, admission = self._idle, self._admission
        connections = self.metrics.upstream_connections
        connections.labels("idle").set_function(lambda: idle.count)
        connections.labels("active").set_function(lambda: admission.open - idle.count)
        self.metrics.heavy_in_flight.set_function(lambda: admission.heavy_held)

    # -- acquiring and releasing ---------------------------------------------------------

    async def acquire(
        self,
        identity: Identity | None,
        *,
        fresh: bool = False,
        write: bool = False,
        patience: float | None = None,
        lane: Lane = ANONYMOUS,
        _retried: bool = False,
    ) -> UpstreamConnection:
        """A connection running as ``identity``; ``fresh`` skips pooled ones (after a stale
        one); ``write``: for a call that may change metadata (it may use every connection,
        reads all but an eighth); ``lane``: whose call it is, and whether it is heavy (see
        :mod:`.admission`).

        At the limit it waits its turn, fairly across tenants, up to ``patience`` seconds
        (``--upstream-read-timeout`` unless told: the bound of the call it is for), then
        raises UpstreamUnavailable. Its turn come, it takes an idle connection running as
        ``identity``, or else closes the oldest idle connection and opens its own.
        """
        patience = self.timeouts.read if patience is None else patience
        deadline = time.monotonic() + patience
        if self.auth is not None:
            await self.auth.prepare(identity)
        kind = self._admission.kind_of(write, lane)
        idle = await self._admission.wait_turn(
            kind, deadline, patience, lambda: self._take(identity, fresh=fresh, kind=kind), lane
        )
        if idle is not None:
            if idle.identity is None and identity is not None:
                return await self._bind(idle, identity)  # an anonymous one, bound by set_ugi
            return idle
        # A slot is counted for a new connection.
        try:
            conn = await self._endpoints.connect(identity, self.auth)
        except UpstreamAuthFailed as exc:
            self._admission.free_slot(kind)
            if not exc.retry or _retried:
                raise
            # E.g. a delegation token the HMS forgot: a new one is fetched (on a connection of
            # the proxy's own, so not while this slot is held), then one more try.
            log.info("metastore refused a connection (%s); trying once more", exc)
            left = max(0.0, deadline - time.monotonic())
            return await self.acquire(
                identity, fresh=True, write=write, patience=left, lane=lane, _retried=True
            )
        except BaseException:
            self._admission.free_slot(kind)
            raise
        _mark_held(conn, kind)
        if identity is not None and identity.binds_by_set_ugi:
            return await self._bind(conn, identity)
        conn.identity = identity
        return conn

    def take_now(self, identity: Identity | None) -> UpstreamConnection | None:
        """An idle connection running as ``identity`` whose replies can be taken as they
        arrive, for a read, if one can be had at once (no one waits, no set_ugi to replay,
        no SASL); ``None`` otherwise (then :meth:`acquire` it is). Given back as acquired."""
        if self.auth is not None or self._closed or not self._admission.read_at_once():
            return None
        newest = self._idle.newest(identity)
        if newest is None or newest.diverter is None:
            return None
        conn = self._idle.take(identity)
        if conn is None:
            return None
        self._admission.hold("read")
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
        lane: Lane = ANONYMOUS,
    ) -> AsyncIterator[UpstreamConnection]:
        """A connection for one exchange: given back afterwards, or closed if the exchange
        failed in any way (its reply may be half read: it cannot serve anyone else).
        ``write``, ``patience`` and ``lane`` as for :meth:`acquire`.

        ``pinned``: the client's own connection, used instead of a pooled one; it is closed
        the same way on failure (its owner sees ``conn.closed``).
        """
        conn = pinned or await self.acquire(
            identity, fresh=fresh, write=write, patience=patience, lane=lane
        )
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
        self._admission.unhold(conn)
        if not reusable or self._closed or not conn.usable or conn.replies.buffered:
            self._discard(conn)
            return
        if conn.identity is not None and len(conn.identity.args) > MAX_POOLED_IDENTITY:
            self._discard(conn)  # an idle connection must not keep megabytes of set_ugi alive
            return
        self._idle.put(conn)
        self._admission.wake_next()

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

    async def open_raw(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A bare stream to the first metastore that answers, outside the pool (for relaying
        an engine's own SASL negotiation to it)."""
        return await self._endpoints.open_raw()

    # -- internals -------------------------------------------------------------------------

    def _discard(self, conn: UpstreamConnection) -> None:
        if conn.closed:
            return  # once only: it stopped counting against the limit the first time
        conn.close()
        self._admission.gone(conn)

    def _take(
        self, identity: Identity | None, *, fresh: bool, kind: LaneKind
    ) -> UpstreamConnection | None:
        """For the caller whose turn it is (there is room): an idle connection running as
        ``identity`` (or an anonymous one to bind), unless it wants a ``fresh`` one; or
        ``None``: a slot counted for a new connection, made by closing the oldest idle
        connection if the limit is reached."""
        self._admission.hold(kind)
        conn = None if fresh else self._idle.take(identity)
        if conn is None and not fresh and self._can_bind(identity):
            conn = self._idle.take(None)
        if conn is not None:
            _mark_held(conn, kind)
            return conn
        if self._admission.at_limit:
            # There is room, so an idle connection: closed, its slot is the new connection's.
            self._idle.pop_oldest().close()
        else:
            self._admission.opened()
        return None

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

    # -- the proxy's own calls -------------------------------------------------------------

    async def ask(
        self,
        identity: Identity | None,
        method: str,
        timeout: float | None = None,
        /,
        lane: Lane = ANONYMOUS,
        **args: object,
    ) -> Message:
        """One call of the proxy's own on a pooled connection running as ``identity``, its
        whole reply (raises UpstreamError); ``timeout`` defaults to ``Timeouts.own_call``,
        and bounds the wait for a connection too; ``lane``: as whom it waits its turn."""
        return await self._ask(identity, method, timeout, False, args, lane)

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
        lane: Lane = ANONYMOUS,
    ) -> Message:
        request = idl.encode_call(method, 0, **args)
        bound = timeout or self.timeouts.own_call
        async with self.connection(identity, write=write, patience=bound, lane=lane) as conn:
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
        while self._idle.count:
            self._discard(self._idle.pop_oldest())


def _mark_held(conn: UpstreamConnection, kind: LaneKind) -> None:
    """``conn`` counts against the reads' share (and the heavy reads') until unheld."""
    conn.held_by_read = kind != "write"
    conn.held_by_heavy = kind == "heavy"


def set_ugi_succeeded(reply: Message) -> bool:
    if reply.header.type != MessageType.REPLY:
        return False
    try:
        result = idl.decode_result("set_ugi", reply.body)
    except ProtocolError:
        return False
    return result.success is not None
