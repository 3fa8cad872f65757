"""What happens to one call: look it up in the catalog, forward it, relay the reply.

The reply to a client is the metastore's reply byte for byte. The proxy forwards the
client's request as it came (old non-strict headers are rewritten to the strict form the HMS
requires, nothing else), so the HMS echoes the client's own seqid and the reply needs no
patching. For a client on the buffered transport the reply is streamed: each piece goes out
as it arrives, so a 100 MB partition list costs neither the wait nor the memory of holding it.

When the metastore cannot be reached or stays silent past the read timeout, the client gets
a ``TApplicationException`` promptly (engines treat it as retryable). When the metastore
hangs up during a call, the client's connection is closed too, which is what the client would
have seen talking to the HMS directly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from proxy import catalog, idl
from proxy.catalog import Kind
from proxy.config import Options
from proxy.metrics import Metrics, method_label
from proxy.upstream import (
    Identity,
    UpstreamClosed,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    UpstreamProtocolError,
    check_reply_header,
    exchange,
    receive,
    send,
    set_ugi_succeeded,
)
from proxy.wire.binary import (
    AppErrorType,
    MessageType,
    encode_application_exception,
    encode_header,
    with_seqid,
)
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, Transport

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client connection must be closed (its reply can no longer be completed)."""


class ClientChannel(Protocol):
    """The client side of a session, as the handler needs it."""

    transport: Transport

    async def send(self, data: bytes) -> None:
        """Write ``data`` (raw bytes, already framed as needed) and respect backpressure."""


@dataclass
class SessionState:
    """What the proxy remembers about one client connection."""

    peer: str
    identity: Identity | None = None
    pinned: UpstreamConnection | None = None
    calls: int = 0
    extra: dict[str, object] = field(default_factory=dict)


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
    def __init__(self, options: Options, pool: UpstreamPool, metrics: Metrics) -> None:
        self.options = options
        self.pool = pool
        self.metrics = metrics

    async def handle(self, session: SessionState, message: Message, client: ClientChannel) -> None:
        """Answer one call. Raises ClientGone when the client connection must be closed."""
        header = message.header
        label = method_label(header.name)
        spec = catalog.lookup(header.name)
        started = time.perf_counter()
        oneway = header.type == MessageType.ONEWAY or header.name in idl.oneway_methods()
        try:
            if header.name == "set_ugi":
                outcome = await self._set_ugi(session, message, client)
            elif spec is not None and spec.kind is Kind.SESSION:
                outcome = await self._pinned_call(session, message, client)
            else:
                retries = 1 if spec is not None and spec.retryable else 0
                outcome = await self._forward(session, message, client, oneway, retries)
        except ClientGone:
            self.metrics.requests.labels(label, "upstream_error").inc()
            raise
        except Exception:
            self.metrics.requests.labels(label, "internal_error").inc()
            log.exception("%s: internal error answering %s", session.peer, header.name)
            await self._fail(
                client, message, AppErrorType.INTERNAL_ERROR, "hms-cache-proxy internal error"
            )
            return
        self.metrics.requests.labels(label, outcome).inc()
        self.metrics.request_duration.labels(label, "upstream").observe(
            time.perf_counter() - started
        )

    # -- plain forwarding --------------------------------------------------------------------

    async def _forward(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        oneway: bool,
        retries: int,
    ) -> str:
        header = message.header
        request = upstream_request(message)
        attempt = 0
        while True:
            try:
                conn = session.pinned or await self.pool.acquire(
                    session.identity, fresh=attempt > 0
                )
            except UpstreamError as exc:
                return await self._upstream_failed(client, message, exc)
            try:
                outcome = await self._exchange(conn, request, message, client, oneway)
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
                return await self._upstream_failed(client, message, exc)
            self.pool.release(conn, reusable=True)
            return outcome

    async def _exchange(
        self,
        conn: UpstreamConnection,
        request: bytes,
        message: Message,
        client: ClientChannel,
        oneway: bool,
    ) -> str:
        """Send ``request`` on ``conn`` and relay the reply to ``client``."""
        header = message.header
        label = method_label(header.name)
        started = time.perf_counter()
        try:
            await send(conn, request, self.options)
            if oneway:
                self.metrics.upstream_requests.labels(label, "ok").inc()
                return "ok"
            outcome = await self._relay(conn, header.name, header.seqid, client)
        except UpstreamError as exc:
            self.metrics.upstream_requests.labels(label, exc.outcome).inc()
            raise
        self.metrics.upstream_requests.labels(label, "ok").inc()
        self.metrics.upstream_duration.labels(label).observe(time.perf_counter() - started)
        return outcome

    async def _relay(
        self, conn: UpstreamConnection, name: str, seqid: int, client: ClientChannel
    ) -> str:
        """Copy one reply from ``conn`` to ``client``: streamed, or whole for framed clients."""
        reader = conn.replies
        stream = client.transport is Transport.BUFFERED
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
                if stream:
                    if piece.data:
                        await client.send(piece.data)
                        sent = True
                else:
                    held.append(piece.data)
                if piece.last:
                    if not stream:
                        await client.send(client.transport.frame(b"".join(held)))
                    return result_outcome(piece.header.type, bytes(prefix[header_length:]))
            try:
                chunk = await receive(conn, self.options, got_bytes=got_bytes)
            except UpstreamError as exc:
                raise _mark(exc, sent) from exc
            got_bytes = True
            reader.feed(chunk)

    async def _upstream_failed(
        self, client: ClientChannel, message: Message, exc: Exception
    ) -> str:
        log.warning("call %s failed at the metastore: %s", message.header.name, exc)
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
        return await self._forward(session, message, client, oneway=False, retries=0)

    def end_session(self, session: SessionState) -> None:
        if session.pinned is not None:
            self.pool.discard(session.pinned)
            session.pinned = None


def _mark(exc: UpstreamError, started_reply: bool) -> UpstreamError:
    exc.started_reply = started_reply
    return exc
