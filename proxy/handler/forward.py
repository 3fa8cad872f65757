"""Forwarding a call to the metastore: a pooled (or the client's own) connection, one retry
of a stale pooled connection, the reply relayed, and every failure answered.

When the metastore cannot be reached or stays silent past the read timeout, the client gets
a ``TApplicationException`` promptly (engines treat it as retryable). When the metastore
hangs up during a call, the client's connection is closed too, which is what the client
would have seen talking to the HMS directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proxy import bridge
from proxy.guard import answers
from proxy.guard.calls import table_named
from proxy.guard.gate import Admitted, Gate
from proxy.handler.session import ClientGone, SessionState
from proxy.metrics import Metrics, method_label
from proxy.upstream import (
    ClientChannel,
    Timeouts,
    UpstreamClosed,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    UpstreamUnreachable,
    relay,
)
from proxy.upstream.admission import ANONYMOUS
from proxy.upstream.errors import ReplyTooLarge, UpstreamProtocolError, started
from proxy.upstream.hazards import spoils_connection
from proxy.upstream.relay import UNREFUSED_REPLY_BYTES, OnReply, result_outcome, send
from proxy.wire.binary import (
    AppErrorType,
    MessageType,
    encode_application_exception,
    encode_header,
    parse_header,
)
from proxy.wire.framing import Message, Transport

log = logging.getLogger(__name__)

ADMITTED = Admitted(ANONYMOUS)  # a call no gate looked at

# Answers a failed call instead, if it can (a stale cached reply): True if it did.
Fallback = Callable[[], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Sent:
    """A call that went out on ``conn`` as it arrived (:mod:`proxy.handler.flight`) and
    did not end there: its reply begun or not, its next bytes due by ``deadline`` (the
    loop's time: the read timeout from the last bytes heard), or ``error``, what went wrong
    with it. ``started``: when it went out (perf_counter)."""

    conn: UpstreamConnection
    deadline: float
    started: float
    error: UpstreamError | None = None


def upstream_request(message: Message) -> bytes:
    """The request as the HMS must see it: strict header, body untouched."""
    h = message.header
    if h.strict:
        return message.data
    return encode_header(h.name, h.type, h.seqid) + message.body


class Forwarder:
    def __init__(
        self,
        pool: UpstreamPool,
        metrics: Metrics,
        timeouts: Timeouts,
        keep_limit: int,
        gate: Gate | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.timeouts = timeouts
        self.keep_limit = keep_limit  # the largest bridged reply kept whole while rewritten
        # What a client's read must pass before it goes (None: everything goes, as one
        # tenant: the proxy's own tests of the relay alone).
        self.gate = gate
        # Metastores known to lack a removed method (HMS 4.0.1's get_table): bridged.
        self.removals = bridge.Removals()

    async def forward(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        *,
        oneway: bool = False,
        write: bool = False,
        retries: int = 0,
        keep: OnReply | None = None,
        fallback: Fallback | None = None,
        sent: Sent | None = None,
    ) -> str:
        """Send the call upstream and relay the reply to ``client``; returns the outcome.
        ``sent``: the call went out already, as it arrived, and is finished here."""
        result = await self.call(
            session,
            message,
            client,
            oneway=oneway,
            write=write,
            retries=retries,
            keep=keep,
            fallback=fallback,
            sent=sent,
        )
        assert isinstance(result, str)
        return result

    async def call(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        *,
        hold: bool = False,
        oneway: bool = False,
        write: bool = False,
        retries: int = 0,
        request: bytes | None = None,
        keep: OnReply | None = None,
        fallback: Fallback | None = None,
        sent: Sent | None = None,
    ) -> str | Message:
        """Send the call upstream (retrying a stale pooled connection up to ``retries``);
        ``write``: it may change metadata (the pool keeps connections for writes).
        ``sent``: its first attempt went out already (see :class:`Sent`).

        The reply is relayed to ``client`` and the outcome label returned; with ``hold`` it is
        returned whole instead, for the caller to send. Failures are answered to the client
        either way, and their outcome label returned; unless ``fallback`` answers them (a
        stale cached reply while the metastore is unreachable).
        """
        request = request if request is not None else upstream_request(message)
        relay_to = None if hold else client
        admitted = ADMITTED
        gate = self.gate
        if gate is not None and not write and sent is None:
            admitted = await gate.admit(session, message)
            if admitted.refusal is not None:
                return await refuse(gate, client, admitted)
        attempt = 0
        while True:
            conn: UpstreamConnection | None = None
            first = sent if attempt == 0 else None
            try:
                async with self.pool.connection(
                    session.identity,
                    fresh=attempt > 0,
                    write=write,
                    pinned=first.conn if first is not None else session.pinned,
                    lane=admitted.lane,
                ) as conn:
                    return await self._exchange(
                        conn, request, message, relay_to, oneway, keep, first, write=write
                    )
            except ReplyTooLarge as exc:
                # (Its connection was closed with its reply half read; not sent again.)
                if session.lost_pin():  # (the client's own, with its state: as any failure)
                    raise ClientGone(f"pinned metastore connection failed: {exc}") from exc
                return await self._too_large(session, client, message, exc, admitted)
            except UpstreamError as exc:
                if conn is None:  # no connection to be had
                    return await self._failed(client, message, exc, fallback)
                if session.lost_pin():
                    raise ClientGone(f"pinned metastore connection failed: {exc}") from exc
                if exc.stale and attempt < retries:
                    attempt += 1
                    log.info(
                        "%s: pooled metastore connection was stale, retrying %s",
                        session.peer,
                        message.header.name,
                    )
                    continue
                if exc.started_reply or isinstance(exc, UpstreamClosed):
                    # The HMS hung up on this call (or part of its reply already went out):
                    # the client sees its connection end, as it would talking to the HMS.
                    raise ClientGone(f"metastore ended the call: {exc}") from exc
                return await self._failed(client, message, exc, fallback)
            except BaseException:
                # The client went away mid-reply (or the task was cancelled): the pool closed
                # the connection, whose reply may be half read.
                session.lost_pin()
                raise

    async def _exchange(
        self,
        conn: UpstreamConnection,
        request: bytes,
        message: Message,
        client: ClientChannel | None,
        oneway: bool,
        keep: OnReply | None,
        sent: Sent | None = None,
        *,
        write: bool = False,
    ) -> str | Message:
        """Send ``request`` on ``conn`` (unless it was ``sent``) and relay (or return) the
        reply (a ``write``'s whatever its size: the metastore applied it)."""
        header = message.header
        if spoils_connection(message):
            conn.spoilt = True  # closed after this call, not given to another
        bridgeable = header.name in bridge.REPLACEMENTS and not oneway
        known = sent is None and self.removals.replacement(conn.endpoint, header.name)
        if bridgeable and known:
            bridged = bridge.request(message)
            if bridged is not None:
                return await self._bridged(conn, bridged, message, client, keep)
        result = await self._call(
            conn,
            request,
            header.name,
            header.seqid,
            client,
            oneway,
            keep,
            hold_exception=bridgeable and client is not None,
            sent=sent,
            write=write,
        )
        if not isinstance(result, Message):
            return result
        # A reply held whole (an exception held back for a look, or a held call): does this
        # metastore lack the method?
        lacks = bridgeable and bridge.unknown_method(result)
        bridged = bridge.request(message) if lacks else None
        if bridged is not None:
            if self.removals.learn(conn.endpoint, header.name):
                log.warning(
                    "bridging %s as %s for %s: the metastore does not serve %s (HMS 4.0.1 or "
                    "later); old clients' calls of it go as %s from now on",
                    header.name,
                    bridge.REPLACEMENTS[header.name],
                    conn.endpoint,
                    header.name,
                    bridge.REPLACEMENTS[header.name],
                )
            return await self._bridged(conn, bridged, message, client, keep)
        if client is None:
            return result
        return await answer(client, result, keep)

    async def _bridged(
        self,
        conn: UpstreamConnection,
        request: bytes,
        message: Message,
        client: ClientChannel | None,
        keep: OnReply | None,
    ) -> str | Message:
        """A removed method's call, sent as its ``_req`` form; the reply in the old shape:
        streamed to a buffered client (held whole up to the keep limit, see
        :class:`bridge.ReplyStream`), held whole otherwise."""
        header = message.header
        upstream = bridge.REPLACEMENTS[header.name]
        self.metrics.bridged_calls.labels(header.name).inc()
        if client is None or client.transport is not Transport.BUFFERED:
            held = await self._call(conn, request, upstream, header.seqid, None, False, None)
            assert isinstance(held, Message)
            try:
                reply = _message(bridge.reply(header.name, header.seqid, held))
            except bridge.BridgeError as exc:
                raise started(UpstreamProtocolError(str(exc)), False) from exc
            return reply if client is None else await answer(client, reply, keep)
        channel = _Rewritten(client, bridge.ReplyStream(header.name, header.seqid, self.keep_limit))

        async def kept(whole: Message) -> None:  # the cache keeps what the client gets
            assert keep is not None
            await keep(_message(bridge.reply(header.name, header.seqid, whole)))

        on_reply = kept if keep is not None else None
        try:
            outcome = await self._call(
                conn, request, upstream, header.seqid, channel, False, on_reply
            )
            assert isinstance(outcome, str)
            await channel.finish()
        except bridge.BridgeError as exc:
            raise started(UpstreamProtocolError(str(exc)), channel.sent) from exc
        return outcome

    async def _call(
        self,
        conn: UpstreamConnection,
        request: bytes,
        name: str,
        seqid: int,
        client: ClientChannel | None,
        oneway: bool,
        keep: OnReply | None,
        *,
        hold_exception: bool = False,
        sent: Sent | None = None,
        write: bool = False,
    ) -> str | Message:
        """One exchange on ``conn``, counted under the method the metastore was sent."""
        label = method_label(name)
        started_at = time.perf_counter() if sent is None else sent.started
        try:
            if sent is None:
                await send(conn, request, self.timeouts.read)
            elif sent.error is not None:
                raise sent.error
            if oneway:
                self.metrics.upstream_requests.labels(label, "ok").inc()
                return "ok"
            result = await relay(
                conn,
                name,
                seqid,
                client,
                self.timeouts.read,
                on_reply=keep,
                hold_exception=hold_exception,
                deadline=sent.deadline if sent is not None else None,
                limit=UNREFUSED_REPLY_BYTES if write else None,
            )
        except UpstreamError as exc:
            self.metrics.upstream_requests.labels(label, exc.outcome).inc()
            raise
        self.metrics.upstream_requests.labels(label, "ok").inc()
        self.metrics.upstream_duration.labels(label).observe(time.perf_counter() - started_at)
        return result

    async def _too_large(
        self,
        session: SessionState,
        client: ClientChannel,
        message: Message,
        exc: ReplyTooLarge,
        admitted: Admitted,
    ) -> str:
        """Answer a call whose reply was over the client's limit with a MetaException that
        says so, naming the table (and its partitions, if they were counted)."""
        name = message.header.name
        table = table_named(message)
        partitions = admitted.estimate.partitions
        log.warning(
            "%s: the reply to %s of %s is over --max-reply-bytes (%d bytes)%s: refused",
            session.peer,
            name,
            table or "?",
            exc.limit,
            f", {partitions} partitions" if partitions is not None else "",
        )
        text = answers.reply_too_large_text(name, table, exc.limit, partitions)
        self.metrics.refused.labels("reply_too_large", admitted.lane.group).inc()
        await client.send(client.transport.frame(answers.refusal(name, message.header.seqid, text)))
        return "refused"

    async def _failed(
        self,
        client: ClientChannel,
        message: Message,
        exc: UpstreamError,
        fallback: Fallback | None,
    ) -> str:
        if fallback is not None and await fallback():
            return "ok"
        return await self.upstream_failed(client, message, exc)

    async def upstream_failed(self, client: ClientChannel, message: Message, exc: Exception) -> str:
        # An unreachable metastore is logged once by the pool, not once per call.
        (log.debug if isinstance(exc, UpstreamUnreachable) else log.warning)(
            "call %s failed at the metastore: %s", message.header.name, exc
        )
        await fail(
            client,
            message,
            AppErrorType.INTERNAL_ERROR,
            f"hms-cache-proxy: metastore call failed: {exc}",
        )
        return "upstream_error"


async def answer(client: ClientChannel, reply: Message, keep: OnReply | None = None) -> str:
    """Send a reply held whole (kept first, as a relayed one would be); its outcome."""
    if keep is not None:
        await keep(reply)
    await client.send(client.transport.frame(reply.data))
    return result_outcome(reply.header.type, reply.body[:3])


def _message(data: bytes) -> Message:
    header = parse_header(data, 0, len(data))
    assert header is not None
    return Message(header, data)


class _Rewritten:
    """A client channel that passes a bridged reply through its :class:`bridge.ReplyStream`."""

    transport = Transport.BUFFERED

    def __init__(self, client: ClientChannel, rewrite: bridge.ReplyStream) -> None:
        self.client = client
        self.rewrite = rewrite
        self.sent = False  # whether any byte of the reply reached the client

    async def send(self, data: bytes) -> None:
        out = self.rewrite.feed(data)
        if out:
            self.sent = True
            await self.client.send(out)

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        await self.send(head + bytes(rest))

    async def finish(self) -> None:
        out = self.rewrite.finish()
        self.sent = True
        await self.client.send(out)


async def refuse(gate: Gate, client: ClientChannel, refused: Admitted) -> str:
    """Answer a call the gate refused, and count it."""
    assert refused.refusal is not None
    gate.refused(refused)
    await client.send(client.transport.frame(refused.refusal))
    return "refused"


async def fail(client: ClientChannel, message: Message, kind: AppErrorType, text: str) -> None:
    """Answer the call with a ``TApplicationException`` (a oneway caller reads no reply)."""
    h = message.header
    if h.type == MessageType.ONEWAY:
        return
    await client.send(
        client.transport.frame(encode_application_exception(h.name, h.seqid, kind, text))
    )
