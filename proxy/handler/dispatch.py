"""What happens to one call: look it up in the catalog, then serve it, forward it, or both.

* **Cacheable reads** go through the cache (:mod:`.reads`).
* **Writes** go to the HMS; their reply is held until the scopes they change are
  invalidated, then sent (:mod:`.writes`); lock calls fence the tables they name.
* **Session calls** (``set_ugi``, ``setMetaConf``) change their connection (:mod:`.identity`).
* **Everything else** (other reads, unknown methods) is forwarded (:mod:`.forward`).

The reply to a client is the metastore's reply byte for byte. Requests are forwarded as they
came (old non-strict headers are rewritten to the strict form the HMS requires), so the HMS
echoes the client's own seqid; cached replies get the caller's seqid patched in.
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from collections.abc import Callable
from typing import Literal

from proxy import bridge, catalog, idl
from proxy.audit import AuditLog
from proxy.cache import locks
from proxy.cache.engine import CacheEngine
from proxy.cache.l1 import Item
from proxy.cache.plan import ReadPlan
from proxy.catalog import Kind, MethodSpec
from proxy.guard.calls import PARTITION_READS
from proxy.guard.gate import Gate
from proxy.handler import again
from proxy.handler.again import Again
from proxy.handler.audited import CallAudit
from proxy.handler.flight import Flight
from proxy.handler.forward import Forwarder, Sent, fail, refuse, upstream_request
from proxy.handler.identity import Identities
from proxy.handler.known_calls import KnownCall, KnownCalls
from proxy.handler.reads import cached_read
from proxy.handler.session import ClientGone, NoReply, SessionState
from proxy.handler.writes import Writes
from proxy.loop import guarded_write
from proxy.metrics import Metrics, method_label
from proxy.upstream import ClientChannel, UpstreamPool
from proxy.upstream.hazards import spoils_connection
from proxy.wire.binary import AppErrorType, MessageHeader, MessageType
from proxy.wire.framing import Message, Transport, seqid_offset

log = logging.getLogger(__name__)
_I32 = struct.Struct(">i")
# Calls handle() does more with than forwarding them, whatever the catalog says.
_NOT_PLAIN = frozenset({"set_ugi", "get_delegation_token"})
_PLAIN_MEMO = 1024  # method names remembered as forwarded plainly or not

# Replies up to this size may be written at once by serve_hit_now (one copy, one write);
# larger ones take the ordinary way, written in slices with backpressure.
IMMEDIATE_REPLY_BYTES = 1 << 20


class CallHandler:
    def __init__(
        self,
        pool: UpstreamPool,
        metrics: Metrics,
        cache: CacheEngine | None = None,
        *,
        max_reply_bytes: int,
        check_iceberg_base: bool = True,
        audit: AuditLog | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.cache = cache
        keep_limit = cache.max_entry_bytes if cache is not None else max_reply_bytes
        # Calls for partition objects are costed before they go, and every call waits its
        # turn at the metastore as its tenant (proxy.guard).
        self.gate = Gate(pool.options, pool, metrics)
        self.forwarder = Forwarder(pool, metrics, pool.timeouts, keep_limit, self.gate)
        # One line per call (--audit-log), from wherever it is answered.
        self.audit = CallAudit(audit, self.gate) if audit is not None else None
        self.identities = Identities(pool, self.forwarder)
        self._plain: dict[str, bool] = {}  # see forwards_plainly
        # Calls known by their bytes, with their plans and what answers them again.
        self.known = KnownCalls(cache.planner.per_user) if cache is not None else None
        if self.known is not None:
            metrics.settle_with(self.known.settle)
        self.writes = (
            Writes(cache, self.forwarder, pool, check_iceberg_base=check_iceberg_base)
            if cache is not None
            else None
        )

    async def handle(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        sent: Sent | None = None,
    ) -> None:
        """Answer one call. Raises ClientGone when the client connection must be closed.
        ``sent``: a call only forwarded, sent as it arrived, that ends here (see
        :meth:`forward_now`)."""
        header = message.header
        if header.type == MessageType.ONEWAY:
            client = NoReply(client.transport)
        label = method_label(header.name)
        spec = catalog.lookup(header.name)
        started = time.perf_counter() if sent is None else sent.started
        source = "upstream"
        audit = self.audit
        sent_before = getattr(client, "sent", 0) if audit is not None else 0
        outcome = "internal_error"
        try:
            if sent is not None:
                outcome = await self._forward(session, message, client, spec, sent)
            elif header.name == "set_ugi":
                outcome = await self.identities.set_ugi(session, message, client)
            elif header.name == "get_delegation_token":
                outcome = await self.identities.delegation_token(session, message, client)
            elif spec is not None and spec.kind is Kind.SESSION:
                outcome = await self.identities.pinned_call(session, message, client)
            elif spec is not None and spec.kind is Kind.CACHEABLE_READ and self.cache is not None:
                try:
                    refused = self.gate.charge_hit(session, message)
                    if refused is not None:  # (a rule that counts hits, its bucket empty)
                        outcome = await refuse(self.gate, client, refused)
                    else:
                        plan = self.plan_of(session, message, spec)
                        served = await cached_read(
                            self.cache, self.forwarder, session, message, client, spec, plan
                        )
                        outcome, source = served.outcome, served.source
                finally:
                    session.charged = False
            elif self.writes is not None and header.name in locks.LOCK_METHODS:
                outcome = await self.writes.locking(session, message, client, spec)
            elif self.writes is not None and (spec is None or spec.kind is Kind.WRITE):
                outcome = await self.writes.write(session, message, client, spec)
            else:
                outcome = await self._forward(session, message, client, spec)
        except ClientGone:
            self.count_call(label, outcome := "upstream_error")
            raise
        except ConnectionError as exc:  # the client's side, while it was being answered
            self.count_call(label, outcome := "client_gone")
            raise ClientGone(f"client connection lost: {exc}") from exc
        except Exception:
            self.count_call(label, outcome := "internal_error")
            log.exception("%s: internal error answering %s", session.peer, header.name)
            await fail(
                client, message, AppErrorType.INTERNAL_ERROR, "hms-cache-proxy internal error"
            )
            return
        finally:
            if audit is not None:
                cacheable = (
                    self.cache is not None and spec is not None and spec.kind is Kind.CACHEABLE_READ
                )
                took = time.perf_counter() - started
                audit.handled(
                    session, message, outcome, source, cacheable, took, client, sent_before
                )
        self.count_call(label, outcome, source, time.perf_counter() - started)

    def count_call(
        self, label: str, outcome: str, source: str | None = None, took: float = 0.0
    ) -> None:
        """Count a call (``label``: its method's) with its outcome, however it was answered
        (the awaited path, a hit at once, a flight): the one place a call is counted but for
        an Again's batches (:meth:`.again.Again.settle`). ``source``: where its reply came
        from (``cache`` or ``upstream``), ``took`` seconds; ``None``: no reply went out."""
        self.metrics.requests.labels(label, outcome).inc()
        if source is not None:
            self.metrics.request_duration.labels(label, source).observe(took)

    async def _forward(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        spec: catalog.MethodSpec | None,
        sent: Sent | None = None,
    ) -> str:
        """A call only forwarded: its reply relayed as the metastore sends it."""
        oneway = message.header.name in idl.oneway_methods()  # the metastore sends no reply
        retries = 1 if spec is not None and spec.retryable else 0
        return await self.forwarder.forward(
            session, message, client, oneway=oneway, retries=retries, sent=sent
        )

    def forwards_plainly(self, session: SessionState, header: MessageHeader) -> bool:
        """Whether :meth:`handle` does nothing with this call but forward it and relay its
        reply (what :meth:`forward_now` may do as the call arrives): a two-way call of a
        client with no connection of its own, no session call, nothing the cache answers or
        must see, nothing the bridge for removed methods rewrites (a removed method's reply
        is looked at only if it is an exception: see :class:`.flight.Flight`)."""
        name = header.name
        if header.type != MessageType.CALL or session.pinned is not None:
            return False
        plain = self._plain.get(name)
        if plain is None:
            plain = self._plain_method(name)
            if len(self._plain) < _PLAIN_MEMO:  # (names are the client's: bounded)
                self._plain[name] = plain
        return plain and name not in self.forwarder.removals.names

    def _plain_method(self, name: str) -> bool:
        if name in _NOT_PLAIN or name in idl.oneway_methods() or name in PARTITION_READS:
            return False  # (a call for partitions is costed first: proxy.guard)
        spec = catalog.lookup(name)
        if self.cache is None:
            return spec is None or spec.kind is not Kind.SESSION
        return spec is not None and spec.kind is Kind.READ and name not in locks.LOCK_METHODS

    def forward_now(
        self,
        session: SessionState,
        message: Message,
        write: Callable[[bytes], None],
        hand_over: Callable[[Sent], None],
        landed: Callable[[bool], None],
    ) -> Flight | None:
        """Send a call only forwarded (:meth:`forwards_plainly`) on an idle pooled
        connection at once, its reply to be written with ``write`` as it arrives (see
        :mod:`.flight`); ``None``: no such call, or no such connection at hand, nothing
        done (the call takes :meth:`handle`)."""
        if not self.forwards_plainly(session, message.header) or self.gate.limits.active:
            return None  # (a call under a rate is charged the ordinary way: proxy.guard)
        if spoils_connection(message):
            return None  # (its connection is closed after it: the ordinary way does that)
        pool = self.pool
        conn = pool.take_now(session.identity)
        if conn is None:
            return None
        assert conn.diverter is not None
        try:
            guarded_write(conn.writer, conn.replies.transport.frame(upstream_request(message)))
        except ConnectionError:  # closed under us, before a byte of the call went out
            pool.discard(conn)
            return None
        self.metrics.forwarded_at_once.labels(method_label(message.header.name)).inc()
        return Flight(
            conn,
            conn.diverter,
            message.header,
            pool,
            self.metrics,
            self.count_call,
            write,
            hand_over,
            landed,
            pool.timeouts.read,
            look_at_exceptions=message.header.name in bridge.REPLACEMENTS,
            audit=(
                functools.partial(self.audit.forwarded, session, message)
                if self.audit is not None
                else None
            ),
        )

    def serve_hit_now(
        self,
        session: SessionState,
        message: Message,
        write: Callable[[bytes], None],
        repeat: bytes | None = None,
    ) -> Item | Literal[True] | None:
        """Answer a call that is a cache hit needing no await (see
        :meth:`CacheEngine.hit_now`) through ``write``, at once: no task, no coroutine, the
        same reply, metrics and outcome as :meth:`handle` gives it; the hit it answered
        (``True``: a reply assembled from partitions, nothing to answer again from).
        ``None``: nothing was written or counted; the call takes :meth:`handle`. ``write``
        raises ConnectionError when the client is gone (then ClientGone, counted as
        :meth:`handle` counts it). ``repeat``: the call's bytes but for its seqid: its plan
        is kept by them (:class:`.known_calls.KnownCalls`), for :meth:`serve_known_now`."""
        cache, known = self.cache, self.known
        header = message.header
        if (
            cache is None
            or known is None
            or header.type != MessageType.CALL
            or session.pinned is not None
        ):
            return None
        if cache.freshness.want:  # the ordinary way records it for the freshness check
            return None
        spec = catalog.lookup(header.name)
        if spec is None or spec.kind is not Kind.CACHEABLE_READ:
            return None
        started = time.perf_counter()
        identity = session.cache_identity
        item = None
        try:
            # A request for partitions never asked in this combination: assembled from
            # partitions judged before, without planning it (see proxy.cache.assembled).
            assembled = cache.assembled_now(spec, message, identity, IMMEDIATE_REPLY_BYTES)
            if assembled is None:
                plan = self.plan_of(session, message, spec, repeat)
                if plan is not None:
                    item = cache.hit_now(plan, IMMEDIATE_REPLY_BYTES)
        except Exception:  # the ordinary way answers it (and reports what went wrong)
            log.debug("%s: no immediate answer to %s", session.peer, header.name, exc_info=True)
            return None
        if assembled is not None:
            try:
                self._written(header.name, assembled.reply, "ok", write, started)
            finally:  # (after the write: the client has the reply meanwhile)
                cache.count_assembled(assembled)
            if self.audit is not None:
                took = time.perf_counter() - started
                self.audit.answered(
                    session, header.name, assembled.table, assembled.reply, "ok", "hit", took
                )
            return True
        return self._answer_now(cache, header.seqid, item, write, started, session)

    def plan_of(
        self,
        session: SessionState,
        message: Message,
        spec: MethodSpec,
        repeat: bytes | None = None,
    ) -> ReadPlan | None:
        """The plan of a cacheable read, kept with the call (:meth:`.KnownCalls.plan`;
        ``repeat``: its bytes but for the seqid, if known); ``None``: not one to cache, or
        a pinned session's."""
        cache, known = self.cache, self.known
        assert cache is not None and known is not None  # (one with the other)
        make = functools.partial(cache.plan, spec, message, session.cache_identity)
        return known.plan(session, message, make, repeat)

    def serve_known_now(
        self,
        call: KnownCall,
        seqid: int,
        write: Callable[[bytes], None],
        session: SessionState | None = None,
    ) -> Item | None:
        """:meth:`serve_hit_now` for a call known by its bytes but for the seqid, kept with
        its plan (:meth:`.known_calls.KnownCalls.get` found it for the session): no scan,
        no decode, no digest. ``None``: not a hit to answer at once."""
        cache = self.cache
        if cache is None or cache.freshness.want:
            return None
        plan = call.plan
        if plan is None:  # (not one to cache)
            return None
        started = time.perf_counter()
        call.asked = True
        try:
            item = cache.hit_now(plan, IMMEDIATE_REPLY_BYTES)
        except Exception:
            log.debug("no immediate answer to a known call", exc_info=True)
            return None
        return self._answer_now(cache, seqid, item, write, started, session)

    def again(self, item: Item, request: bytes, transport: Transport) -> Again | None:
        """What answers ``request`` again, on its connection or any other (its bytes but for
        the seqid the same), while the hit on ``item``, with which it was just answered,
        holds (see :class:`.known_calls.KnownCalls`); ``None``: not a call to know that way (see
        ``binary.seqid_offset``)."""
        at = seqid_offset(request, transport)
        if at is None or self.cache is None or item.answer is None:
            return None
        return Again(request, at, transport, item, self.cache.served_again, self.metrics)

    def _answer_now(
        self,
        cache: CacheEngine,
        seqid: int,
        item: Item | None,
        write: Callable[[bytes], None],
        started: float,
        session: SessionState | None = None,
    ) -> Item | None:
        if item is None:
            return None
        counted = item.counted
        assert counted is not None  # (made when it was judged a hit)
        if item.answer is None:
            try:
                item.answer = again.prepared(item.entry.payload)
            except Exception:
                log.debug("no immediate answer to %s", counted.method, exc_info=True)
                return None
        head, rest, outcome = item.answer
        reply = head + _I32.pack(seqid) + rest
        try:
            self._written(counted.method, reply, outcome, write, started)
        finally:  # (after the write: the client has the reply meanwhile)
            cache.count_now(item)
        if self.audit is not None:
            took = time.perf_counter() - started
            self.audit.answered(session, counted.method, counted.table, reply, outcome, "hit", took)
        return item

    def _written(
        self,
        method: str,
        reply: bytes,
        outcome: str,
        write: Callable[[bytes], None],
        started: float,
    ) -> None:
        """Write a reply answered at once, counted as :meth:`handle` counts it."""
        label = method_label(method)
        try:
            write(reply)
        except ConnectionError as exc:
            self.count_call(label, "client_gone")
            raise ClientGone(f"client connection lost: {exc}") from exc
        self.count_call(label, outcome, "cache", time.perf_counter() - started)

    def end_session(self, session: SessionState) -> None:
        self.identities.end_session(session)
