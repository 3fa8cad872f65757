"""The Thrift listener: a session per client connection once it needs one
(proxy.client_session, proxy.protocols), the connection limit, SASL negotiation, the idle
clock of connections with no task, and a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable

from proxy.client_connection import WRITE_SLICE
from proxy.client_session import ClientSession
from proxy.config import Options
from proxy.handler import CallHandler
from proxy.handler.again import replaced
from proxy.handler.session import PeerName, peer_name
from proxy.loop import guarded_write
from proxy.metric_table import AUTH_MECHANISMS
from proxy.metrics import Metrics
from proxy.protocols import READ_SIZE, TasklessProtocol, open_streams
from proxy.sasl.layer import SaslError
from proxy.sasl.server import Authenticated, Refused, SaslAcceptor
from proxy.tls import server_context
from proxy.wire.binary import AppErrorType, MessageHeader, encode_application_exception
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import MessageReader

log = logging.getLogger(__name__)


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
        self._sessions: set[ClientSession] = set()
        # Connections with no session yet: each answered, so far, by an answer kept for its
        # call (proxy.protocols.answered_before_a_session), or silent.
        self._sessionless: set[TasklessProtocol] = set()
        # Connections served by a task from the start (SASL, refused at the limit), with
        # their writers: a stop closes those with no session yet.
        self._starting: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        # Calls sent as they arrived, being finished the ordinary way (see ClientSession).
        self.finishing: set[asyncio.Task[None]] = set()
        self._negotiating = 0  # connections in their SASL negotiation
        self.stopping = False
        self._refusal_logged_at = float("-inf")
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_every = 1.0
        metrics.settle_with(self._settle)
        # Read when scraped: an increment and a decrement per connection took a lock each.
        metrics.client_connections.set_function(self.connections)

    def connections(self) -> int:
        """The client connections open (but those negotiating SASL or being refused)."""
        return len(self._sessions) + len(self._sessionless)

    def _settle(self) -> None:
        """Count the calls answered again and not counted yet (see proxy.handler.again)."""
        for session in self._sessions:
            if session.again is not None:
                session.again.settle()
        for protocol in self._sessionless:
            if protocol.again is not None:
                protocol.again.settle()

    async def start(self) -> None:
        context = server_context(self.options)
        loop = asyncio.get_running_loop()

        def protocol() -> TasklessProtocol:
            return TasklessProtocol(self, loop)

        self._server = await loop.create_server(
            protocol,
            self.options.listen.host,
            self.options.listen.port,
            reuse_address=True,
            ssl=context,
            ssl_handshake_timeout=self.options.client_message_timeout if context else None,
        )
        idle = self.options.client_idle_timeout
        if idle:
            self._sweep_every = min(1.0, idle / 4)
            self._sweeper = loop.call_later(self._sweep_every, self._sweep_idle)

    def _sweep_idle(self) -> None:
        """The idle clock of the sessions with no task (a session's task has its own, see
        ClientSession._read_within): ``--client-idle-timeout`` from the last request answered,
        not counting a call in flight; a connection is closed up to a quarter of the
        timeout (at most a second) after it. One timer for them all: one per connection
        cost ~5 us of each of Trino's calls (git log -p docs/benchmarks.md)."""
        idle = self.options.client_idle_timeout
        loop = asyncio.get_running_loop()
        try:
            now = loop.time()
            for session in list(self._sessions):
                if (
                    session.task is None
                    and session.flight is None
                    and now - session.answered_at >= idle
                    and not session.closing()  # (closed already, not ended yet)
                ):
                    session.idle_out(idle)
            for protocol in list(self._sessionless):
                transport = protocol.transport
                if (
                    transport is not None
                    and now - protocol.answered_at >= idle
                    and not transport.is_closing()
                ):
                    self.idle_out(PeerName(transport), idle, transport.close)
        except Exception:  # (a bug: logged; the clock goes on for the others)
            log.exception("the idle clock of connections with no task")
        finally:
            if not self.stopping:
                self._sweeper = loop.call_later(self._sweep_every, self._sweep_idle)

    @property
    def ports(self) -> list[int]:
        assert self._server is not None
        return [s.getsockname()[1] for s in self._server.sockets]

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving() and not self.stopping

    def accepted(self, protocol: TasklessProtocol, transport: asyncio.WriteTransport) -> None:
        """A connection the listener accepted. Its session starts with neither streams nor
        a task: its protocol answers what it can as it arrives (hits, calls only forwarded)
        and the session gets them at the first thing that needs them (see
        proxy.protocols). Trino opens a connection per call: most of them then end with
        neither. A SASL negotiation, a connection over the limit, and every connection
        with ``--fast-paths off`` are served by a task from the start. Its socket has
        TCP_NODELAY already: asyncio's and uvloop's TCP transports set it."""
        if self.stopping:
            transport.close()
            return
        limit = self.options.max_client_connections
        if (
            self.acceptor is not None
            or (limit and self.connections() >= limit)
            or self.options.fast_paths == "off"
        ):
            _, reader, writer = open_streams(transport, protocol.loop)
            task = protocol.loop.create_task(self.serve_client(reader, writer))
            self._starting[task] = writer
            task.add_done_callback(functools.partial(self._served, writer))
            return
        transport.set_write_buffer_limits(high=WRITE_SLICE, low=WRITE_SLICE // 4)
        self._sessionless.add(protocol)  # (its session made when needed: open_session)
        protocol.answered_at = protocol.loop.time()

    def open_session(self, protocol: TasklessProtocol) -> ClientSession:
        """The session of a connection that had none (see :meth:`accepted`)."""
        self.sessionless_lost(protocol)
        assert protocol.transport is not None
        session = ClientSession(self, protocol.transport, protocol.loop)
        protocol.session = session
        self._sessions.add(session)
        session.waiting = True  # (for its first request, with no task: see proxy.protocols)
        session.answered_at = protocol.answered_at
        return session

    def sessionless_lost(self, protocol: TasklessProtocol) -> None:
        """A connection with no session ended, or has one now: what answered its last call
        counts its answers, unless still kept for every connection (proxy.handler.again)."""
        self._sessionless.discard(protocol)
        again, protocol.again = protocol.again, None
        replaced(again, None)

    def idle_out(self, peer: object, idle: float, close: Callable[[], None]) -> None:
        """Close a connection idle for ``idle`` seconds: counted, logged."""
        self.metrics.client_errors.labels("idle").inc()
        log.info("%s: closing connection idle for %g s", peer, idle)
        close()

    def _served(self, writer: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        """A connection's task from the start has ended (a bug in it: logged, closed)."""
        self._starting.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s: internal error serving the connection",
                peer_name(writer),
                exc_info=task.exception(),
            )
            writer.close()

    def ended(self, session: ClientSession) -> None:
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
        if limit and self.connections() + self._negotiating >= limit:
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
        session = ClientSession(
            self, writer.transport, asyncio.get_running_loop(), reader, writer, authenticated
        )
        session.task = asyncio.current_task()
        self._sessions.add(session)
        await session.run()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Authenticated | None:
        """The engine's SASL negotiation; on failure one log line, a metric, and the
        connection closed (the engine was told why, as the HMS tells it)."""
        assert self.acceptor is not None
        peer = peer_name(writer)

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
        loop = asyncio.get_running_loop()
        until = loop.time() + drain_timeout
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        starting = self._close_starting()
        for protocol in list(self._sessionless):  # (nothing of theirs in flight)
            if protocol.transport is not None:
                protocol.transport.close()
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
            left = max(0.0, until - loop.time())
            _, pending = await asyncio.wait(self.finishing, timeout=left)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*starting, return_exceptions=True)
        if self.handler.known is not None:  # (the answers kept, not counted yet)
            self.handler.known.settle()
        if self._server is not None:
            await self._server.wait_closed()

    def _close_starting(self) -> list[asyncio.Task[None]]:
        """Close the connections that have no session yet, and cancel their tasks: those
        negotiating SASL, and those over the limit waiting to be told so. Nothing of theirs
        is in flight."""
        sessions = {session.task for session in self._sessions}
        cancelled = [task for task in self._starting if task not in sessions]
        for task in cancelled:
            self._starting[task].close()
            task.cancel()
        return cancelled
