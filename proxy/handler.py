"""What happens to one call: look it up in the catalog, then serve it, forward it, or both.

* **Cacheable reads** are answered from the cache when the entry is current; otherwise the
  call goes to the HMS and its reply is streamed to the client while being kept, then stored
  (before the last piece goes out, for replies small enough that this costs nothing, so the
  client's next call can already hit).
* **Writes** go to the HMS; their reply is held until the scopes they change are
  invalidated, then sent: a writer never reads its own write stale.
* **Everything else** (other reads, unknown methods, session calls) is forwarded.

The reply to a client is the metastore's reply byte for byte. Requests are forwarded as they
came (old non-strict headers are rewritten to the strict form the HMS requires), so the HMS
echoes the client's own seqid; cached replies get the caller's seqid patched in.

When the metastore cannot be reached or stays silent past the read timeout, the client gets
a ``TApplicationException`` promptly (engines treat it as retryable). When the metastore
hangs up during a call, the client's connection is closed too, which is what the client would
have seen talking to the HMS directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from proxy import catalog, iceberg, idl
from proxy.cache import locks
from proxy.cache import partitions as parts
from proxy.cache.engine import CacheEngine, Result
from proxy.cache.plan import FLUSH, ReadPlan
from proxy.catalog import Kind, MethodSpec
from proxy.config import Options
from proxy.metrics import Metrics, method_label
from proxy.status import Activity
from proxy.upstream import (
    Identity,
    UpstreamClosed,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    UpstreamProtocolError,
    UpstreamUnreachable,
    check_reply_header,
    exchange,
    receive,
    send,
    set_ugi_succeeded,
)
from proxy.wire.binary import (
    AppErrorType,
    MessageHeader,
    MessageType,
    encode_application_exception,
    encode_header,
    parse_header,
    with_seqid,
)
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, Transport

log = logging.getLogger(__name__)

# Replies up to this size are stored before their last bytes go out (a few hundred
# microseconds at most); bigger ones are stored after, off the client's clock.
STORE_BEFORE_REPLY_BYTES = 256 * 1024

# Names of methods this proxy does not know that still cannot change metadata.
_READ_PREFIXES = ("get", "list_", "show_", "fetch_", "check_", "is", "partition_name_", "find")


class ClientGone(Exception):
    """The client connection must be closed (its reply can no longer be completed)."""


class ClientChannel(Protocol):
    """The client side of a session, as the handler needs it."""

    transport: Transport

    async def send(self, data: bytes) -> None:
        """Write ``data`` (raw bytes, already framed as needed) and respect backpressure."""

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        """Write one message, framed as needed, given in two parts."""


@dataclass
class SessionState:
    """What the proxy remembers about one client connection."""

    peer: str
    identity: Identity | None = None
    pinned: UpstreamConnection | None = None
    calls: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class _NoReply:
    """The channel of a call the client sent as ONEWAY: it reads no reply, so the answer is
    dropped. Whether the metastore replies depends on the method, not on the message type
    (a Java processor answers every method that is not declared oneway), so that reply is
    still read off the pooled connection, where it would otherwise answer the next caller."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def send(self, data: bytes) -> None:
        pass

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        pass


OnReply = Callable[[Message], Awaitable[None]]
Fallback = Callable[[], Awaitable[bool]]


def upstream_request(message: Message) -> bytes:
    """The request as the HMS must see it: strict header, body untouched."""
    h = message.header
    if h.strict:
        return message.data
    return encode_header(h.name, h.type, h.seqid) + message.body


def result_outcome(message_type: int, body_start: bytes) -> str:
    """``ok`` or ``user_error`` (a declared exception) from the first bytes of a result."""
    if message_type == MessageType.EXCEPTION:
        return "user_error"
    if not body_start or body_start[0] == 0:  # STOP: a void method's empty result
        return "ok"
    if len(body_start) >= 3 and body_start[1:3] != b"\x00\x00":
        return "user_error"
    return "ok"


class CallHandler:
    def __init__(
        self,
        options: Options,
        pool: UpstreamPool,
        metrics: Metrics,
        cache: CacheEngine | None = None,
        activity: Activity | None = None,
    ) -> None:
        self.options = options
        self.pool = pool
        self.metrics = metrics
        self.cache = cache
        self.activity = activity or Activity(show_names=False)

    async def handle(self, session: SessionState, message: Message, client: ClientChannel) -> None:
        """Answer one call. Raises ClientGone when the client connection must be closed."""
        header = message.header
        if header.type == MessageType.ONEWAY:
            client = _NoReply(client.transport)
        label = method_label(header.name)
        spec = catalog.lookup(header.name)
        started = time.perf_counter()
        source = "upstream"
        try:
            if header.name == "set_ugi":
                outcome = await self._set_ugi(session, message, client)
            elif spec is not None and spec.kind is Kind.SESSION:
                outcome = await self._pinned_call(session, message, client)
            elif spec is not None and spec.kind is Kind.CACHEABLE_READ and self.cache is not None:
                outcome, source = await self._cached_read(session, message, client, spec)
            elif self.cache is not None and header.name in locks.LOCK_METHODS:
                outcome = await self._locking(session, message, client)
            elif self.cache is not None and (spec is None or spec.kind is Kind.WRITE):
                outcome = await self._write(session, message, client, spec)
            else:
                oneway = header.name in idl.oneway_methods()  # the metastore sends no reply
                retries = 1 if spec is not None and spec.retryable else 0
                outcome = await self._forward(
                    session, message, client, oneway=oneway, retries=retries
                )
        except ClientGone:
            self.metrics.requests.labels(label, "upstream_error").inc()
            raise
        except ConnectionError as exc:  # the client's side, while it was being answered
            self.metrics.requests.labels(label, "client_gone").inc()
            raise ClientGone(f"client connection lost: {exc}") from exc
        except Exception:
            self.metrics.requests.labels(label, "internal_error").inc()
            log.exception("%s: internal error answering %s", session.peer, header.name)
            await self._fail(
                client, message, AppErrorType.INTERNAL_ERROR, "hms-cache-proxy internal error"
            )
            return
        self.metrics.requests.labels(label, outcome).inc()
        self.metrics.request_duration.labels(label, source).observe(time.perf_counter() - started)

    # -- cached reads ----------------------------------------------------------------------

    async def _cached_read(
        self, session: SessionState, message: Message, client: ClientChannel, spec: MethodSpec
    ) -> tuple[str, str]:
        assert self.cache is not None
        label = method_label(spec.name)
        plan = None
        if session.pinned is None:  # a connection with its own configuration is not shared
            identity = session.identity.args if session.identity else None
            plan = self.cache.plan_read(spec, message, identity)
        if plan is None:
            self.metrics.cache_lookups.labels(label, "bypass").inc()
            return await self._forward(session, message, client, retries=1), "upstream"
        if plan.partitions is not None:
            return await self._partition_read(session, message, client, plan)
        look = await self.cache.lookup(plan)
        self.metrics.cache_lookups.labels(label, look.result.value).inc()
        if plan.table is not None:
            self.activity.looked_up(plan.table, look.result in (Result.HIT, Result.NEGATIVE_HIT))
        if look.result in (Result.HIT, Result.NEGATIVE_HIT):
            await _send_cached(client, look.reply, message.header.seqid)
            return result_outcome(
                MessageType.REPLY, look.reply[_body_at(look.reply) :][:3]
            ), "cache"
        if look.result is Result.BYPASS:
            return await self._forward(session, message, client, retries=1), "upstream"
        fp = await self.cache.fill_fingerprint(plan, look)
        if fp is None:
            return await self._forward(session, message, client, retries=1), "upstream"
        flight = self.cache.join(plan.key, fp)
        if flight is not None:
            shared = await flight
            if shared is not None:
                await _send_cached(client, shared, message.header.seqid)
                return result_outcome(MessageType.REPLY, shared[_body_at(shared) :][:3]), "cache"
            return await self._forward(session, message, client, retries=1), "upstream"
        self.cache.lead(plan.key, fp)
        kept: list[bytes] = []

        async def store(reply: Message) -> None:
            assert self.cache is not None
            if await self.cache.fill(plan, fp, reply):
                kept.append(reply.data)

        async def stale() -> bool:
            """--stale-if-error: while the metastore is unreachable, an expired entry."""
            assert self.cache is not None
            cached = await self.cache.stale(plan)
            if cached is None:
                return False
            self.metrics.stale_replies.labels(label).inc()
            await _send_cached(client, cached, message.header.seqid)
            return True

        try:
            outcome = await self._forward(
                session,
                message,
                client,
                retries=1,
                on_reply=store,
                fallback=stale if self.cache.stale_window > 0 else None,
            )
        finally:
            self.cache.land(plan.key, fp, kept[0] if kept else None)
        return outcome, "upstream"

    async def _partition_read(
        self, session: SessionState, message: Message, client: ClientChannel, plan: ReadPlan
    ) -> tuple[str, str]:
        """get_partitions_by_names: serve what is cached, fetch only what is not."""
        assert self.cache is not None and plan.partitions is not None
        pp, method, label = plan.partitions, plan.method, method_label(plan.method)
        look = await self.cache.lookup_partitions(plan)
        self.metrics.cache_lookups.labels(label, look.result.value).inc()
        self.activity.looked_up(pp.table, look.result is Result.HIT)
        if look.result is Result.BYPASS:
            return await self._forward(session, message, client, retries=1), "upstream"
        seqid = message.header.seqid
        self.metrics.cache_partitions.labels("hit").inc(len(look.known))
        self.metrics.cache_partitions.labels("miss").inc(len(pp.values) - len(look.known))
        if look.result is Result.HIT:
            await self._send_assembled(client, method, seqid, pp.names, pp.values, look.known)
            return "ok", "cache"
        missing = [v for v in pp.values if v not in look.known]
        versions = await self.cache.partition_versions(pp, look.versions)
        whole = len(missing) == len(pp.values)
        if whole:
            request = upstream_request(message)
        else:
            names = [n for n, v in zip(pp.names, pp.values, strict=True) if v not in look.known]
            args = parts.with_names(message.body, pp.names_path, names)
            request = encode_header(method, MessageType.CALL, seqid) + args
        reply = await self._call(session, message, client, hold=True, retries=1, request=request)
        if isinstance(reply, str):  # the client already has its error
            return reply, "upstream"
        got = self._fetched_partitions(reply, missing, whole, pp.names, pp.values)
        if got is None:
            if whole:
                await client.send(client.transport.frame(reply.data))
                return result_outcome(reply.header.type, reply.body[:3]), "upstream"
            # Unexpected shape for a subset: let the HMS answer the whole request instead.
            return await self._forward(session, message, client, retries=1), "upstream"
        if versions is not None:
            await self.cache.fill_partitions(plan, versions, missing, got)
        if whole:
            await client.send(client.transport.frame(reply.data))
        else:
            known = {**look.known, **got}
            await self._send_assembled(client, method, seqid, pp.names, pp.values, known)
        return "ok", "upstream"

    def _fetched_partitions(
        self,
        reply: Message,
        missing: list[tuple[str, ...]],
        whole: bool,
        names: tuple[str, ...],
        values: tuple[tuple[str, ...], ...],
    ) -> dict[tuple[str, ...], bytes] | None:
        """The partitions of a reply by their values, if the reply is what was expected."""
        assert self.cache is not None
        if reply.header.type != MessageType.REPLY:
            return None
        split = parts.split(reply.header.name, reply.body)
        if split is None:
            return None
        wanted = set(missing)
        got: dict[tuple[str, ...], bytes] = {}
        for vals, data in split.partitions:
            if vals not in wanted or vals in got:
                return None  # not a partition we asked for, or twice: do not guess
            got[vals] = data
        if whole:
            name_of = dict(zip(values, names, strict=True))
            order = [name_of[v] for v, _ in split.partitions]
            if order != sorted(order):
                log.warning(
                    "the metastore does not return get_partitions_by_names in partition-name "
                    "order; partitions are no longer cached one by one"
                )
                self.cache.assemble_partitions = False
                return None
        return got

    async def _send_assembled(
        self,
        client: ClientChannel,
        method: str,
        seqid: int,
        names: tuple[str, ...],
        values: tuple[tuple[str, ...], ...],
        known: dict[tuple[str, ...], bytes | None],
    ) -> None:
        present = sorted((n, known[v]) for n, v in zip(names, values, strict=True) if known.get(v))
        body = parts.assemble(method, [data for _, data in present if data is not None])
        reply = encode_header(method, MessageType.REPLY, seqid) + body
        await client.send(client.transport.frame(reply))

    # -- writes ----------------------------------------------------------------------------

    async def _write(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        spec: MethodSpec | None,
    ) -> str:
        """Forward a write, invalidate what it changes, then answer the writer."""
        assert self.cache is not None
        header = message.header
        oneway = header.name in idl.oneway_methods()  # the metastore sends no reply
        if spec is None and header.name.startswith(_READ_PREFIXES):
            return await self._forward(session, message, client, oneway=oneway)
        plan = FLUSH if spec is None else self.cache.plan_write(spec, message)
        if plan.empty:
            return await self._forward(session, message, client, oneway=oneway)
        if spec is not None:
            plan = await self.cache.expand(plan, lambda db: self._list_tables(session, db))
        if spec is None:
            log.warning("unknown method %s may change metadata: the cache is flushed", header.name)
        request = await self._guarded_commit(session, message) if spec is not None else None
        intent = await self.cache.begin_write(plan)
        try:
            reply = await self._call(
                session, message, client, hold=True, oneway=oneway, request=request
            )
        finally:
            # Success or not, the HMS may have changed: invalidate before anyone is answered.
            await self.cache.end_write(plan, intent)
        if isinstance(reply, str):
            return reply
        await client.send(client.transport.frame(reply.data))
        return result_outcome(reply.header.type, reply.body[:3])

    async def _guarded_commit(self, session: SessionState, message: Message) -> bytes | None:
        """An Iceberg commit with the metastore's own check of its base added (see
        :mod:`proxy.iceberg`), or ``None`` to forward the call as it came."""
        h = message.header
        if h.name not in iceberg.GUARDED or self.options.iceberg_expected_location != "on":
            return None
        try:
            args = idl.decode_args(h.name, message.body)
        except ProtocolError:
            return None
        commit = iceberg.commit_shape(h.name, args)
        if commit is None:
            return None
        # Only an alter that moves metadata_location is a commit; one that keeps it (a
        # rename, a property change) must not be checked against its previous location.
        current = await self._current_location(session, commit.db, commit.table)
        if current is None or current == commit.location:
            return None
        body = iceberg.with_expected_location(args, message.body, commit.previous)
        if body is None:
            return None
        log.debug("%s: the metastore checks the base of this Iceberg commit", h.name)
        return encode_header(h.name, h.type, h.seqid) + body

    async def _current_location(self, session: SessionState, db: str, table: str) -> str | None:
        """The table's metadata_location at the metastore now (``None``: unknown)."""
        if session.pinned is not None:
            return None  # its connection is the client's own: leave its calls alone
        try:
            reply = await self.pool.ask(session.identity, "get_table", dbname=db, tbl_name=table)
        except UpstreamError:
            return None
        if reply.header.type != MessageType.REPLY:
            return None
        return iceberg.current_location(reply.body)

    # -- locks -----------------------------------------------------------------------------

    async def _locking(self, session: SessionState, message: Message, client: ClientChannel) -> str:
        """``lock`` and the calls that keep or end it, forwarded untouched: a ``lock`` first
        fences what it names, the replies of all of them settle fences afterwards (see
        :mod:`proxy.cache.locks`)."""
        assert self.cache is not None
        fences = self.cache.locks
        name = message.header.name
        ticket = await fences.before_lock(message.body) if name == "lock" else None
        reply = await self._call(session, message, client, hold=True)
        if isinstance(reply, str):  # no answer: the fence holds until its deadline
            return reply
        fences.after(name, message.body, ticket, reply)  # runs while the reply goes out
        await client.send(client.transport.frame(reply.data))
        return result_outcome(reply.header.type, reply.body[:3])

    async def _list_tables(self, session: SessionState, db: str) -> list[str]:
        """Ask the HMS which tables a database has (before a write drops them)."""
        reply = await self.pool.ask(session.identity, "get_all_tables", db_name=db)
        result = idl.decode_result("get_all_tables", reply.body)
        return list(result.success or [])

    # -- forwarding --------------------------------------------------------------------------

    async def _forward(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        *,
        oneway: bool = False,
        retries: int = 0,
        on_reply: OnReply | None = None,
        fallback: Fallback | None = None,
    ) -> str:
        """Send the call upstream and relay the reply to ``client``; returns the outcome."""
        result = await self._call(
            session,
            message,
            client,
            oneway=oneway,
            retries=retries,
            on_reply=on_reply,
            fallback=fallback,
        )
        assert isinstance(result, str)
        return result

    async def _call(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        *,
        hold: bool = False,
        oneway: bool = False,
        retries: int = 0,
        request: bytes | None = None,
        on_reply: OnReply | None = None,
        fallback: Fallback | None = None,
    ) -> str | Message:
        """Send the call upstream (retrying a stale pooled connection up to ``retries``).

        The reply is relayed to ``client`` and the outcome label returned; with ``hold`` it is
        returned whole instead, for the caller to send. Failures are answered to the client
        either way, and their outcome label returned; unless ``fallback`` answers them (a
        stale cached reply while the metastore is unreachable).
        """
        header = message.header
        request = request if request is not None else upstream_request(message)
        relay_to = None if hold else client
        attempt = 0
        while True:
            try:
                conn = session.pinned or await self.pool.acquire(
                    session.identity, fresh=attempt > 0
                )
            except UpstreamError as exc:
                if fallback is not None and await fallback():
                    return "ok"
                return await self._upstream_failed(client, message, exc)
            try:
                result = await self._exchange(conn, request, message, relay_to, oneway, on_reply)
            except UpstreamError as exc:
                self.pool.discard(conn)
                if session.pinned is conn:
                    session.pinned = None
                    raise ClientGone(f"pinned metastore connection failed: {exc}") from exc
                if exc.stale and attempt < retries:
                    attempt += 1
                    log.info(
                        "%s: pooled metastore connection was stale, retrying %s",
                        session.peer,
                        header.name,
                    )
                    continue
                if exc.started_reply or isinstance(exc, UpstreamClosed):
                    # The HMS hung up on this call (or part of its reply already went out):
                    # the client sees its connection end, as it would talking to the HMS.
                    raise ClientGone(f"metastore ended the call: {exc}") from exc
                if fallback is not None and await fallback():
                    return "ok"
                return await self._upstream_failed(client, message, exc)
            except BaseException:
                # The client went away mid-reply (or the task was cancelled): the reply may be
                # half read off this connection, which therefore cannot serve anyone else.
                self.pool.discard(conn)
                if session.pinned is conn:
                    session.pinned = None
                raise
            self.pool.release(conn, reusable=True)
            return result

    async def _exchange(
        self,
        conn: UpstreamConnection,
        request: bytes,
        message: Message,
        client: ClientChannel | None,
        oneway: bool,
        on_reply: OnReply | None,
    ) -> str | Message:
        """Send ``request`` on ``conn`` and relay (or return) the reply."""
        header = message.header
        label = method_label(header.name)
        started = time.perf_counter()
        try:
            await send(conn, request, self.options)
            if oneway:
                self.metrics.upstream_requests.labels(label, "ok").inc()
                return "ok"
            result = await self._relay(conn, header.name, header.seqid, client, on_reply)
        except UpstreamError as exc:
            self.metrics.upstream_requests.labels(label, exc.outcome).inc()
            raise
        self.metrics.upstream_requests.labels(label, "ok").inc()
        self.metrics.upstream_duration.labels(label).observe(time.perf_counter() - started)
        return result

    async def _relay(
        self,
        conn: UpstreamConnection,
        name: str,
        seqid: int,
        client: ClientChannel | None,
        on_reply: OnReply | None,
    ) -> str | Message:
        """Copy one reply from ``conn``: streamed to a buffered client, or held whole.

        ``on_reply`` gets the whole reply (kept while streaming, up to the cache's entry
        limit); it runs before the last piece is sent when the reply is small.
        """
        reader = conn.replies
        stream = client is not None and client.transport is Transport.BUFFERED
        keep = client is None or not stream or on_reply is not None
        reader.keep = keep
        keep_limit = (
            self.cache.max_entry_bytes if (self.cache and stream) else self.options.max_reply_bytes
        )
        held: list[bytes] = []
        prefix = bytearray()  # header and the first bytes of the result: enough for the outcome
        header_length = 0
        got_bytes = False
        sent = False
        while True:
            try:
                piece = reader.take()
            except ProtocolError as exc:
                raise _mark(UpstreamProtocolError(f"bad reply: {exc}"), sent) from exc
            if piece is not None:
                if not header_length:
                    h = piece.header
                    check_reply_header(name, seqid, h.name, h.type, h.seqid)
                    header_length = h.length
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
                chunk = await receive(conn, self.options, got_bytes=got_bytes)
            except UpstreamError as exc:
                raise _mark(exc, sent) from exc
            got_bytes = True
            reader.feed(chunk)

    async def _upstream_failed(
        self, client: ClientChannel, message: Message, exc: Exception
    ) -> str:
        # An unreachable metastore is logged once by the pool, not once per call.
        (log.debug if isinstance(exc, UpstreamUnreachable) else log.warning)(
            "call %s failed at the metastore: %s", message.header.name, exc
        )
        await self._fail(
            client,
            message,
            AppErrorType.INTERNAL_ERROR,
            f"hms-cache-proxy: metastore call failed: {exc}",
        )
        return "upstream_error"

    async def _fail(
        self, client: ClientChannel, message: Message, kind: AppErrorType, text: str
    ) -> None:
        h = message.header
        if h.type == MessageType.ONEWAY:
            return  # a oneway caller reads no reply
        await client.send(
            client.transport.frame(encode_application_exception(h.name, h.seqid, kind, text))
        )

    # -- connection state ----------------------------------------------------------------------

    async def _set_ugi(self, session: SessionState, message: Message, client: ClientChannel) -> str:
        """``set_ugi``: answer from a bound connection's reply, or bind a connection now."""
        identity = Identity(message.body)
        if session.identity is None and session.pinned is None:
            known = self.pool.ugi_reply(identity)
            if known is not None:
                session.identity = identity
                await client.send(
                    client.transport.frame(
                        with_seqid(known.data, known.header, message.header.seqid)
                    )
                )
                return "ok"
        try:
            conn = session.pinned or await self.pool.acquire(session.identity)
        except UpstreamError as exc:
            return await self._upstream_failed(client, message, exc)
        try:
            reply = await exchange(
                conn, upstream_request(message), "set_ugi", message.header.seqid, self.options
            )
        except UpstreamError as exc:
            self.pool.discard(conn)
            if session.pinned is conn:
                session.pinned = None
            return await self._upstream_failed(client, message, exc)
        if set_ugi_succeeded(reply):
            self.pool.bind(conn, identity)
            self.pool.remember_ugi_reply(identity, reply)
            session.identity = identity
            if session.pinned is None:
                self.pool.release(conn, reusable=True)
        else:
            # The HMS refused (or already had an identity): the connection's state is unknown.
            self.pool.discard(conn)
            if session.pinned is conn:
                session.pinned = None
        await client.send(client.transport.frame(reply.data))
        return result_outcome(reply.header.type, reply.body[:3])

    async def _pinned_call(
        self, session: SessionState, message: Message, client: ClientChannel
    ) -> str:
        """A call that changes its connection's state: from now on this client keeps it."""
        if session.pinned is None:
            try:
                session.pinned = await self.pool.pin(session.identity)
            except UpstreamError as exc:
                return await self._upstream_failed(client, message, exc)
        return await self._forward(session, message, client)

    def end_session(self, session: SessionState) -> None:
        if session.pinned is not None:
            self.pool.discard(session.pinned)
            session.pinned = None


async def _send_cached(client: ClientChannel, cached: bytes, seqid: int) -> None:
    """A cached reply, with the caller's seqid, without copying its body."""
    at = _body_at(cached)
    head = cached[:at]
    await client.send_message(with_seqid(head, _header_of(head), seqid), memoryview(cached)[at:])


def _header_of(head: bytes) -> MessageHeader:
    header = parse_header(head, 0, len(head))
    assert header is not None
    return header


def _body_at(reply: bytes) -> int:
    name_length = int.from_bytes(reply[4:8], "big")
    return 12 + name_length


def _mark(exc: UpstreamError, started_reply: bool) -> UpstreamError:
    exc.started_reply = started_reply
    return exc
