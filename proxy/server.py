"""The Thrift listener: one session per client connection, and a graceful stop.

A session reads requests with the sans-I/O :class:`MessageReader` and hands each complete
call to the :class:`CallHandler`, one at a time (a Thrift client waits for each reply). Bad
input closes that session only: a message that breaks the protocol or a size limit, or a
request that stops arriving halfway, gets a ``TApplicationException`` when the header was
readable, one warning in the log, and the connection closed. Memory per session is bounded by
the request size limit and, for replies, by streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import cast

from proxy.cache.ready import Ready
from proxy.config import Options
from proxy.handler import CallHandler, ClientGone, SessionState
from proxy.handler.again import Again
from proxy.handler.flight import Flight
from proxy.handler.forward import Sent
from proxy.handler.identity import authenticated_identity
from proxy.loop import guarded_write
from proxy.metrics import AUTH_MECHANISMS, Metrics
from proxy.sasl.layer import SaslError
from proxy.sasl.server import Authenticated, Refused, SaslAcceptor
from proxy.sasl.stream import ByteReader, ByteWriter
from proxy.tls import server_context
from proxy.wire.binary import (
    AppErrorType,
    MessageHeader,
    MessageType,
    encode_application_exception,
)
from proxy.wire.errors import MessageTooLarge, ProtocolError
from proxy.wire.framing import (
    Message,
    MessageReader,
    Transport,
    call_without_seqid,
    whole_message,
)

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
WRITE_SLICE = 1 << 20
SMALL_MESSAGE = 64 * 1024


_UVLOOP_TCP: dict[type, bool] = {}  # whether a transport's type is uvloop's TCP transport


class ClientConnection:
    """The client side of a session: framing-aware writes with backpressure."""

    def __init__(self, writer: ByteWriter, transport: Transport) -> None:
        self.writer = writer
        self.transport = transport
        # uvloop's TCP transport keeps a reference to what it is given until it is sent (no
        # copy, and nothing moved on each partial send): a message goes to it whole, in one
        # system call if the socket takes it. asyncio's own (and TLS) copy or move their
        # buffer: a big message goes to them in slices. Only a plain stream's writer: a SASL
        # session's frames and wraps what it writes (its raw transport is uvloop's too).
        raw = writer.transport if type(writer) is asyncio.StreamWriter else None
        uvloop_tcp = _UVLOOP_TCP.get(type(raw))
        if uvloop_tcp is None:
            kind = type(raw)
            uvloop_tcp = _UVLOOP_TCP[kind] = (kind.__name__, kind.__module__) == (
                "TCPTransport",
                "uvloop.loop",
            )
        self.whole: asyncio.WriteTransport | None = raw if uvloop_tcp else None
        self.plain = raw  # a plain stream's transport (see write_at_once)
        self.framed = transport is Transport.FRAMED
        # Replies written at once: a bug after one is told from a bug before it.
        self.answered = 0

    async def send(self, data: bytes) -> None:
        self._write(data)
        await self.writer.drain()

    def _write(self, data: bytes | memoryview) -> None:
        """Write to the client, whose connection may be gone: then ConnectionResetError,
        the client gone (on either event loop, see :func:`proxy.loop.guarded_write`)."""
        if self.writer.is_closing():
            raise ConnectionResetError("the client connection is closed")
        guarded_write(self.writer, data)

    def write_at_once(self, message: bytes) -> None:
        """Write one whole message, framed as the client's transport needs, without waiting
        for it to drain: a reply answered at once, written only while nothing else waits to
        be written (see :meth:`_Session.answer_now`). On a plain stream, straight to its
        transport (what ``StreamWriter.write`` does, without its Python steps: they were a
        tenth of the reply's way to the client, from cold memory, docs/benchmarks.md)."""
        if self.framed:
            message = self.transport.prefix(len(message)) + message
        plain = self.plain
        if plain is None:
            self._write(message)
            self.answered += 1
            return
        if plain.is_closing():
            raise ConnectionResetError("the client connection is closed")
        guarded_write(plain, message)
        self.answered += 1

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        """A message given as a head and a view of the rest, written without joining them
        and in slices, so a 100 MB cached reply is neither copied nor buffered whole (asyncio
        moves a transport's whole pending buffer on every partial send)."""
        writer = self.writer
        if self.transport is Transport.FRAMED:
            head = self.transport.prefix(len(head) + len(rest)) + head
        if len(rest) <= SMALL_MESSAGE:  # one write, one system call
            self._write(head + rest)
            await writer.drain()
            return
        if self.whole is not None:
            if writer.is_closing():
                raise ConnectionResetError("the client connection is closed")
            try:
                self.whole.writelines((head, rest))
            except RuntimeError as exc:  # (see guarded_write)
                raise ConnectionResetError(f"the connection is closed: {exc}") from exc
            await writer.drain()
            return
        self._write(head)
        for at in range(0, len(rest), WRITE_SLICE):
            self._write(rest[at : at + WRITE_SLICE])
            await writer.drain()
        await writer.drain()


class ThriftServer:
    def __init__(
        self,
        options: Options,
        handler: CallHandler,
        metrics: Metrics,
        acceptor: SaslAcceptor | None = None,
    ) -> None:
        self.options = options
        self.handler = handler
        self.metrics = metrics
        self.acceptor = acceptor  # SASL (--client-auth kerberos): who each engine is
        self._server: asyncio.Server | None = None
        self._sessions: set[_Session] = set()
        # Connections served by a task from the start (SASL, refused at the limit).
        self._starting: set[asyncio.Task[None]] = set()
        # Calls sent as they arrived, being finished the ordinary way (see _Session).
        self.finishing: set[asyncio.Task[None]] = set()
        self._negotiating = 0  # connections in their SASL negotiation
        self.stopping = False
        self._refusal_logged_at = float("-inf")
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_every = 1.0
        metrics.settle_with(self._settle)
        # Read when scraped: an increment and a decrement per connection took a lock each.
        metrics.client_connections.set_function(lambda: len(self._sessions))

    def _settle(self) -> None:
        """Count the calls answered again and not counted yet (see proxy.handler.again)."""
        for session in self._sessions:
            if session.again is not None:
                session.again.settle()

    async def start(self) -> None:
        context = server_context(self.options)
        loop = asyncio.get_running_loop()

        def protocol() -> _ClientProtocol:
            return _ClientProtocol(self, loop)

        idle = self.options.client_idle_timeout
        if idle:
            self._sweep_every = min(1.0, idle / 4)
            self._sweeper = loop.call_later(self._sweep_every, self._sweep_idle)
        self._server = await loop.create_server(
            protocol,
            self.options.listen.host,
            self.options.listen.port,
            reuse_address=True,
            ssl=context,
            ssl_handshake_timeout=self.options.client_message_timeout if context else None,
        )

    def _sweep_idle(self) -> None:
        """The idle clock of the sessions with no task (a session's task has its own, see
        _Session._read_within): ``--client-idle-timeout`` from the last request answered,
        not counting a call in flight; a connection is closed up to a quarter of the
        timeout (at most a second) after it. One timer for them all: one per connection
        cost ~5 us of each of Trino's calls (docs/benchmarks.md)."""
        idle = self.options.client_idle_timeout
        now = asyncio.get_running_loop().time()
        for session in list(self._sessions):
            if (
                session.task is None
                and session.flight is None
                and now - session.answered_at >= idle
                and not session.writer.is_closing()  # (closed already, not ended yet)
            ):
                session.idle_out(idle)
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every, self._sweep_idle)

    @property
    def ports(self) -> list[int]:
        assert self._server is not None
        return [s.getsockname()[1] for s in self._server.sockets]

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving() and not self.stopping

    def accepted(
        self, protocol: _ClientProtocol, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A connection the listener accepted. Its session starts with no task: its protocol
        answers what it can as it arrives (hits, calls only forwarded) and the session's
        task starts at the first thing that needs one (see :class:`_ClientProtocol`).
        Trino opens a connection per call: most of them then end without a task, whose
        start, reads and end cost more than the hit (docs/benchmarks.md). A SASL
        negotiation, or a connection over the limit, is served by a task from the start.
        Its socket has TCP_NODELAY already: asyncio's and uvloop's TCP transports set it."""
        if self.stopping:
            writer.close()
            return
        limit = self.options.max_client_connections
        if self.acceptor is not None or (limit and len(self._sessions) >= limit):
            task = asyncio.get_running_loop().create_task(self.serve_client(reader, writer))
            self._starting.add(task)
            task.add_done_callback(functools.partial(self._served, writer))
            return
        writer.transport.set_write_buffer_limits(high=WRITE_SLICE, low=WRITE_SLICE // 4)
        session = _Session(self, reader, writer, loop=protocol.loop)
        session.shortcut = writer.transport
        protocol.session = session
        self._sessions.add(session)
        session.waiting = True  # (for its first request, with no task: see _ClientProtocol)
        session.answered_at = session.loop.time()

    def _served(self, writer: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        """A connection's task from the start has ended (a bug in it: logged, closed)."""
        self._starting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s: internal error serving the connection",
                _peer_name(writer),
                exc_info=task.exception(),
            )
            writer.close()

    def ended(self, session: _Session) -> None:
        self._sessions.discard(session)
        session.keep_again(None)

    async def serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One client connection, from its streams, until it ends, with a task from the
        start: a SASL negotiation or a connection over the limit (see :meth:`accepted`);
        tests run it on streams of their own."""
        if self.stopping:
            writer.close()
            return
        # Keep up to a slice queued while the socket drains, so big replies never wait for
        # an empty buffer before the next slice is handed over.
        writer.transport.set_write_buffer_limits(high=WRITE_SLICE, low=WRITE_SLICE // 4)
        limit = self.options.max_client_connections
        if limit and len(self._sessions) + self._negotiating >= limit:
            await self._refuse(reader, writer, limit)
            return
        authenticated = None
        if self.acceptor is not None:
            # Connections still negotiating count against the limit too: each may hold a
            # negotiation message (up to 128 KiB) for --client-message-timeout.
            self._negotiating += 1
            try:
                authenticated = await self._authenticate(reader, writer)
            finally:
                self._negotiating -= 1
            if authenticated is None:
                return
        # (A SASL session's bytes are wrapped: its protocol answers nothing as it arrives.)
        session = _Session(self, reader, writer, authenticated)
        session.task = asyncio.current_task()
        self._sessions.add(session)
        await session.run()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Authenticated | None:
        """The engine's SASL negotiation; on failure one log line, a metric, and the
        connection closed (the engine was told why, as the HMS tells it)."""
        assert self.acceptor is not None
        peer = _peer_name(writer)

        def broken_frame(exc: SaslError) -> None:
            self.metrics.client_errors.labels("protocol").inc()
            log.warning("%s: closing connection: %s", peer, exc)

        try:
            authenticated = await self.acceptor.accept(
                reader, writer, self.options.client_message_timeout, broken_frame
            )
        except Refused as exc:
            if exc.reason == "none":  # a port probe: no negotiation to count
                log.debug("%s: connection closed before SASL negotiation", peer)
            else:
                mechanism = exc.mechanism.lower()
                label = mechanism if mechanism in AUTH_MECHANISMS else "other"
                self.metrics.client_auth.labels(label, exc.reason).inc()
                what = "SASL negotiation" if exc.mechanism == "none" else f"SASL {exc.mechanism}"
                log.warning("%s: closing connection: %s refused: %s", peer, what, exc)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return None
        except (ConnectionError, OSError) as exc:
            log.debug("%s: connection ended during SASL negotiation: %s", peer, exc)
            writer.close()
            return None
        self.metrics.client_auth.labels(authenticated.mechanism.lower(), "ok").inc()
        log.debug(
            "%s: authenticated %s as %s (%s, %s)",
            peer,
            authenticated.principal,
            authenticated.user,
            authenticated.mechanism,
            authenticated.qop,
        )
        return authenticated

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int
    ) -> None:
        """One connection over the limit: answer its first call with an error that says why
        (a Thrift client cannot be told anything before it asks), then close."""
        self.metrics.client_errors.labels("connection_limit").inc()
        now = asyncio.get_running_loop().time()
        if now - self._refusal_logged_at > 10:  # a flood of refusals is one line per 10 s
            self._refusal_logged_at = now
            log.warning(
                "refusing client connections: %d open, the limit (--max-client-connections)",
                limit,
            )
        if self.acceptor is not None:  # a SASL engine reads no Thrift before negotiating
            writer.close()
            return
        requests = MessageReader(self.options.client_transport, 64 * 1024)
        header: MessageHeader | None = None
        try:
            async with asyncio.timeout(min(5.0, self.options.client_message_timeout)):
                while header is None:
                    data = await reader.read(READ_SIZE)
                    if not data:
                        return
                    requests.feed(data)
                    with contextlib.suppress(ProtocolError):
                        message = requests.next_message()
                        header = message.header if message is not None else requests.header
            reply = encode_application_exception(
                header.name,
                header.seqid,
                AppErrorType.INTERNAL_ERROR,
                f"hms-cache-proxy: too many client connections (limit {limit}); retry later",
            )
            guarded_write(writer, self.options.client_transport.frame(reply))
            await asyncio.wait_for(writer.drain(), 1.0)
        except (TimeoutError, ConnectionError, ProtocolError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def stop(self, drain_timeout: float) -> None:
        """Stop accepting, let calls in flight finish (up to ``drain_timeout``), close the rest."""
        self.stopping = True
        until = asyncio.get_running_loop().time() + drain_timeout
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for session in list(self._sessions):
            session.keep_again(None)
            if not session.busy:
                session.close()
        ending = [session.ending() for session in self._sessions]
        if ending:
            _, pending = await asyncio.wait(ending, timeout=drain_timeout)
            if pending:
                log.warning(
                    "drain timeout: closing %d connections with calls in flight", len(pending)
                )
            tasks = []
            for session in list(self._sessions):
                session.close()
                if session.task is not None:
                    session.task.cancel()
                    tasks.append(session.task)
                else:
                    session.end()  # (its call in flight is abandoned)
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.finishing:  # (their sessions ended first: nothing waited for them)
            left = max(0.0, until - asyncio.get_running_loop().time())
            _, pending = await asyncio.wait(self.finishing, timeout=left)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


class _ClientProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, with its session's first steps here, as bytes arrive.

    A request that arrives whole while its session waits for the next one, and that is a
    cache hit needing no await (or a call only forwarded), is answered here, without waking
    the session's task (on the hot path, that task's wake-up, its read and its coroutines
    cost more than the hit itself). A session starts with no task at all
    (:meth:`ThriftServer.accepted`): while it has none, its idle clock is a timer and its
    end is the connection's. Anything else starts the task (a request in parts, a call
    that awaits, a client that pipelines or leaves while a call is in flight) and is fed
    to its stream, as asyncio would; the task then serves the connection to its end."""

    session: _Session | None = None
    transport: asyncio.WriteTransport | None = None

    def __init__(self, server: ThriftServer, loop: asyncio.AbstractEventLoop) -> None:
        # (No callback: no task at connect. The base keeps only a weak reference to the
        # stream it feeds; the protocol keeps it alive.)
        self.reader = asyncio.StreamReader(READ_SIZE, loop)
        super().__init__(self.reader, None, loop)
        self.server = server
        self.loop = loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio's classes, but have their methods)
        self.transport = cast(asyncio.WriteTransport, transport)
        super().connection_made(transport)
        # What asyncio.start_server gives its callback; the session's task, if it has one,
        # reads and writes through them as ever.
        writer = asyncio.StreamWriter(self.transport, self, self.reader, self.loop)
        self.server.accepted(self, self.reader, writer)

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is not None:
            if session.waiting and session.flight is None:
                try:
                    # The call answered last, asked again (proxy.handler.again): first, in
                    # as few steps as can be.
                    again = session.again or session.asked_again()
                    if again is not None and again.answer(data, self.transport):  # type: ignore[arg-type]
                        session.state.calls += 1
                        session.answered_at = session.loop.time()
                        return
                    answered = session.answer_now(data, self.transport)
                except ClientGone as exc:
                    log.debug("%s: connection ended: %s", session.state.peer, exc)
                    return  # (closed: the session's read, or the connection's end, ends it)
                except Exception:
                    # A bug in Again.answer, before its write (answer_now handles its own,
                    # told apart by whether it wrote).
                    session.broke()
                    return
                if answered:
                    return
                session.declined = True  # (its task need not try these bytes again)
            # The session's read gets these bytes: nothing is answered here before they are
            # (a call in flight meanwhile, say); what it does may change what this
            # connection is answered.
            session.waiting = False
            session.keep_again(None)
            super().data_received(data)
            if session.task is None:
                session.start_task()
            return
        super().data_received(data)

    def eof_received(self) -> bool | None:
        keep_open = super().eof_received()
        session = self.session
        if session is not None and session.task is None:
            if session.flight is None:
                return False  # the transport closes: its connection_lost ends the session
            session.start_task()  # (it answers the call in flight first, as ever)
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        session = self.session
        if session is not None and session.task is None:
            if session.flight is None:
                session.end()
            else:  # (answered to nobody, counted, its connection given back, as ever)
                session.start_task()


def _peer_name(writer: ByteWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


class _Session:
    def __init__(
        self,
        server: ThriftServer,
        reader: ByteReader,
        writer: ByteWriter,
        authenticated: Authenticated | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.server = server
        self.options = server.options
        self.reader: ByteReader = reader
        self.writer: ByteWriter = writer
        self.state = SessionState(peer=_peer_name(writer))
        if authenticated is not None:
            self.reader, self.writer = authenticated.reader, authenticated.writer
            self.state.user = authenticated.user
            self.state.mechanism = authenticated.mechanism
            self.state.principal = authenticated.principal
            self.state.identity = authenticated_identity(
                authenticated.user,
                end_user=self.options.upstream_identity == "end-user",
                upstream_sasl=self.options.upstream_auth == "kerberos",
            )
        self.client = ClientConnection(self.writer, self.options.client_transport)
        self.requests: MessageReader  # (the task's: made when it starts, see run)
        self.handling = False
        self._message_deadline = 0.0  # when the request being received must be complete
        # Set while the session waits for a request with nothing buffered: then its
        # protocol may answer a hit as it arrives (see _ClientProtocol and answer_now).
        self.waiting = False
        # Its protocol's transport, if the protocol answers hits as they arrive: then so
        # does the task, for what it reads that the protocol did not try (_answered_by_task).
        self.shortcut: asyncio.WriteTransport | None = None
        self.declined = False  # the protocol tried the bytes its task reads next, in vain
        self.answered_at = 0.0  # when a request was last answered that way (idle clock)
        self.again: Again | None = None  # the call answered last that way (see answer_now)
        # What makes it, until the connection asks again (see asked_again).
        self._again_from: tuple[Ready, bytes] | None = None
        # A call only forwarded, sent as it arrived, whose reply has not gone out yet; and
        # what the session's task waits on meanwhile, if it has a request of its own.
        self.at_once = self.options.forward_at_once == "on"
        self.flight: Flight | None = None
        self.ended = False  # a call in flight found its client gone: the session ends
        self._after_flight: asyncio.Future[None] | None = None
        self.loop = loop or asyncio.get_running_loop()
        # The task serving the connection, once it needs one (see _ClientProtocol); until
        # then, the idle clock's timer.
        self.task: asyncio.Task[None] | None = None
        self.over = False  # ended (see end)
        self._ending: asyncio.Future[None] | None = None  # what a stop waits on

    def keep_again(self, again: Again | None) -> None:
        """Answer calls again with ``again`` from now on; the one before counts its answers."""
        self._again_from = None
        before, self.again = self.again, again
        if before is not None:
            before.settle()

    def asked_again(self) -> Again | None:
        """The :class:`Again` of the call answered last at once, made now that the
        connection asks something again: made with its answer, it cost ~5 us of each of
        Trino's calls, which are never asked again on their connection."""
        made = self._again_from
        if made is None:
            return None
        self._again_from = None
        self.again = again = self.server.handler.again(*made, self.client.transport)
        return again

    @property
    def busy(self) -> bool:
        """A call is being answered (the session's own, or one in flight)."""
        return self.handling or self.flight is not None

    def answer_now(self, data: bytes, transport: asyncio.WriteTransport | None) -> bool:
        """Answer ``data`` at once if it is one whole request that is a hit needing no await
        (:meth:`CallHandler.serve_hit_now`); ``False``: nothing was done with it. Only while
        the client's connection has nothing waiting to be written (else the session's own
        writes, with their backpressure, keep the order and bound memory)."""
        if (
            self.server.stopping
            or transport is None
            or transport.get_write_buffer_size()
            or transport.is_closing()
        ):
            return False
        before = self.client.answered
        try:
            answered = self._answer_looked_up(data)
        except ClientGone as exc:
            log.debug("%s: connection ended: %s", self.state.peer, exc)
            self.writer.close()  # the session's read then ends it
            return True
        except Exception:
            self.broke(written=self.client.answered != before)
            return True
        if answered:
            self.state.calls += 1
            self.answered_at = self.loop.time()
        return answered

    def _answer_looked_up(self, data: bytes) -> bool:
        handler = self.server.handler
        transport = self.client.transport
        if handler.cache is None:  # nothing is a hit: a call only forwarded may go at once
            return self._forward_now(data, None)
        # A call the client made before, byte for byte but for the seqid, is known without
        # finding its end or decoding it (the same bytes were one whole message then).
        repeat = call_without_seqid(data, transport)
        ready: Ready | bool | None = False
        message: Message | None = None
        if repeat is not None:
            ready = handler.serve_repeat_now(self.state, *repeat, self.client.write_at_once)
        if ready is False:  # not known by its bytes (None: known, and not answered at once)
            message = whole_message(data, transport, self.options.max_request_bytes)
            if message is None:
                return False
            known = repeat[0] if repeat is not None else None
            ready = handler.serve_hit_now(self.state, message, self.client.write_at_once, known)
        if isinstance(ready, Ready):
            self.keep_again(None)
            self._again_from = (ready, data)  # (made if asked again: see asked_again)
            return True
        self.keep_again(None)
        if ready is True:  # assembled from partitions, nothing to keep
            return True
        return self._forward_now(data, message)  # not a hit: only forwarded, maybe

    def _forward_now(self, data: bytes, message: Message | None) -> bool:
        """Send a call only forwarded to the metastore at once (see proxy.handler.flight);
        ``message``: what ``data`` holds, if it was found already."""
        if not self.at_once:
            return False
        if message is None:
            message = whole_message(data, self.client.transport, self.options.max_request_bytes)
            if message is None:
                return False
        handover = functools.partial(self._hand_over, message)
        flight = self.server.handler.forward_now(
            self.state, message, self.client.write_at_once, handover, self._landed
        )
        if flight is None:
            return False
        self.flight = flight
        return True

    def _hand_over(self, message: Message, sent: Sent) -> None:
        """The call in flight is finished the ordinary way, in a task of its own."""
        task = self.loop.create_task(self._finish(message, sent))
        self.server.finishing.add(task)
        task.add_done_callback(self.server.finishing.discard)

    async def _finish(self, message: Message, sent: Sent) -> None:
        gone = False
        try:
            await self.server.handler.handle(self.state, message, self.client, sent)
        except (ConnectionError, ClientGone) as exc:
            log.debug("%s: connection ended: %s", self.state.peer, exc)
            gone = True
        finally:
            self._landed(gone)

    def _landed(self, gone: bool = False) -> None:
        """The call in flight was answered (``gone``: or its client found gone, which ends
        the session, as the ordinary way's ClientGone does): the session may go on."""
        self.flight = None
        self.answered_at = self.loop.time()
        if gone:
            self.ended = True
            self.writer.close()
        waiting = self._after_flight
        if waiting is not None and not waiting.done():  # (not if a stop cancelled it)
            waiting.set_result(None)
        if self.server.stopping:
            self.writer.close()  # (as the ordinary way ends a session after its call)

    async def _flight_landed(self) -> bool:
        """Wait for the call in flight to be answered (bytes came meanwhile: a client that
        pipelines, or ends its side, is answered first); whether there was one."""
        if self.flight is None:
            return False
        self._after_flight = self.loop.create_future()
        try:
            await self._after_flight
        finally:
            self._after_flight = None
        return True

    def close(self) -> None:
        self.writer.close()

    def idle_out(self, idle: float) -> None:
        """Close the connection, idle for ``idle`` seconds (the connection's end then ends
        the session)."""
        self.server.metrics.client_errors.labels("idle").inc()
        log.info("%s: closing connection idle for %g s", self.state.peer, idle)
        self.writer.close()

    def start_task(self) -> None:
        """The session needs its task from now on (see _ClientProtocol)."""
        self.task = self.loop.create_task(self.run())
        self.task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # (a bug: logged)
            log.error(
                "%s: internal error serving the connection",
                self.state.peer,
                exc_info=task.exception(),
            )

    def ending(self) -> asyncio.Future[None]:
        """Done when the session has ended."""
        if self._ending is None:
            self._ending = self.loop.create_future()
            if self.over:
                self._ending.set_result(None)
        return self._ending

    def end(self) -> None:
        """The session's end (once): by its task's end, or, with no task, its connection's
        (a stop that gives up on a call in flight abandons it)."""
        if self.over:
            return
        self.over = True
        if self.flight is not None:  # (cancelled by a stop while it waited for it)
            self.flight.abandon()
        self.server.handler.end_session(self.state)
        self.writer.close()
        self.server.ended(self)
        if self._ending is not None and not self._ending.done():
            self._ending.set_result(None)

    async def run(self) -> None:
        self.requests = MessageReader(self.options.client_transport, self.options.max_request_bytes)
        try:
            await self._serve()
        except (ConnectionError, ClientGone) as exc:
            log.debug("%s: connection ended: %s", self.state.peer, exc)
            # A call in flight meanwhile (the client reset its connection, say) ends as the
            # ordinary way's would: answered to nobody, counted, its connection given back.
            await self._flight_landed()
        finally:
            self.end()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _serve(self) -> None:
        while True:
            try:
                message = self.requests.next_message()
            except ProtocolError as exc:
                await self._reject(exc)
                return
            if message is None:
                if self.server.stopping:
                    return
                data = await self._read()
                if await self._flight_landed():
                    if self.server.stopping or self.ended:
                        return  # (as the ordinary way stops after its call, or its client)
                    # What came meanwhile is the start of the next request: its clock
                    # starts now, as it would have had the call been answered first.
                    self._message_deadline = self.loop.time() + self.options.client_message_timeout
                if data is None:
                    return
                if self.shortcut is not None and self._answered_by_task(data):
                    continue
                self.requests.feed(data)
                continue
            if message.header.type not in (MessageType.CALL, MessageType.ONEWAY):
                await self._reject(
                    ProtocolError(f"message type {message.header.type} is not a call"),
                    message.header,
                    AppErrorType.INVALID_MESSAGE_TYPE,
                )
                return
            self.handling = True
            try:
                await self.server.handler.handle(self.state, message, self.client)
            finally:
                self.handling = False
            self.state.calls += 1
            if self.server.stopping:
                return

    def _answered_by_task(self, data: bytes) -> bool:
        """Answer ``data`` at once as the protocol answers what arrives while the task waits
        (:meth:`answer_now`), if the protocol did not try it: bytes the task reads with
        everything before them answered, such as a request sent with its connection (Trino
        opens one per call; under uvloop it is read before the task first waits) or one
        that came while an earlier call was answered. ``False``: nothing was done with it."""
        if self.declined:  # (tried by the protocol, and not a call to answer that way)
            self.declined = False
            return False
        if self.requests.buffered or self.flight is not None:
            return False  # (the rest of a request; a flight has landed before any read ends)
        return self.answer_now(data, self.shortcut)  # (a bug in it: see broke)

    def broke(self, written: bool = False) -> None:
        """A bug in answering a call at once (logged). After its reply was ``written`` the
        connection goes on. Before it, the call may have gone nowhere, or to the metastore
        already (a call only forwarded): the connection is closed, as a lost connection
        is, rather than left waiting for a reply that may never come, or the call sent
        twice."""
        if written:
            log.exception("%s: internal error after answering at once", self.state.peer)
            return
        log.exception(
            "%s: internal error answering at once: closing the connection", self.state.peer
        )
        self.writer.close()

    async def _read(self) -> bytes | None:
        """Next bytes from the client; ``None`` when the session should end.

        Two clocks: a request that has started must be complete within
        ``--client-message-timeout`` of its first byte, however the bytes trickle in (a
        deadline, not a per-read timeout, or a slow-loris client could hold the connection
        forever); between requests, a connection may idle for ``--client-idle-timeout``.
        """
        loop = asyncio.get_running_loop()
        partial = self.requests.buffered > 0
        if partial:
            timeout: float | None = self._message_deadline - loop.time()
            reason = "timeout"
        else:
            timeout = self.options.client_idle_timeout or None
            reason = "idle"
        try:
            data = await self._read_within(timeout, partial)
        except TimeoutError:
            self.server.metrics.client_errors.labels(reason).inc()
            if partial:
                log.warning(
                    "%s: closing connection: request incomplete after %g s (%d bytes received)",
                    self.state.peer,
                    self.options.client_message_timeout,
                    self.requests.buffered,
                )
            else:
                log.info(
                    "%s: closing connection idle for %g s",
                    self.state.peer,
                    self.options.client_idle_timeout,
                )
            return None
        if not data:
            if partial:
                log.warning(
                    "%s: connection closed in the middle of a request (%d bytes received)",
                    self.state.peer,
                    self.requests.buffered,
                )
            return None
        if not partial:
            self._message_deadline = loop.time() + self.options.client_message_timeout
        return data

    async def _read_within(self, timeout: float | None, partial: bool) -> bytes:
        """The next bytes, within ``timeout``. Between requests the protocol may answer hits
        meanwhile (``waiting``): the idle clock then runs from the last of them."""
        if partial:
            async with asyncio.timeout(timeout):
                return await self.reader.read(READ_SIZE)
        loop = asyncio.get_running_loop()
        self.answered_at = loop.time()
        idle = timeout
        while True:
            self.waiting = True
            try:
                async with asyncio.timeout(timeout):
                    return await self.reader.read(READ_SIZE)
            except TimeoutError:
                if idle is None:
                    raise
                left = self.answered_at + idle - loop.time()
                if left <= 0 and self.flight is None:
                    raise
                timeout = left if left > 0 else idle  # answered meanwhile, or in flight
            finally:
                self.waiting = False

    async def _reject(
        self,
        exc: ProtocolError,
        header: MessageHeader | None = None,
        kind: AppErrorType = AppErrorType.PROTOCOL_ERROR,
    ) -> None:
        """Close the session for bad input, replying first when the caller can be named."""
        reason = "too_large" if isinstance(exc, MessageTooLarge) else "protocol"
        if kind is AppErrorType.INVALID_MESSAGE_TYPE:
            reason = "bad_message_type"
        self.server.metrics.client_errors.labels(reason).inc()
        log.warning("%s: closing connection: %s", self.state.peer, exc)
        if header is None:
            header = self.requests.header  # parsed before the error was found, if it was
        if header is not None:
            reply = encode_application_exception(
                header.name, header.seqid, kind, f"hms-cache-proxy: {exc}"
            )
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.send(self.client.transport.frame(reply)), 1.0)
