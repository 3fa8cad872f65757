"""The Thrift listener: a protocol per client connection (proxy.conn), the connection limit,
SASL negotiation, the connections' clocks, and a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from proxy.client_connection import WRITE_SLICE
from proxy.config import Options
from proxy.conn.machine import ClientMachine, Close, Limits, Refuse
from proxy.conn.protocol import ClientProtocol
from proxy.conn.streamed import READ_SIZE, Streamed, StreamSession, serve_streams
from proxy.handler import CallHandler, SessionState
from proxy.handler.identity import authenticated_identity
from proxy.handler.session import PeerName, peer_name
from proxy.metric_table import AUTH_MECHANISMS
from proxy.metrics import Metrics
from proxy.sasl.layer import SaslError
from proxy.sasl.server import Authenticated, Refused, SaslAcceptor
from proxy.sasl.stream import ByteReader, ByteWriter
from proxy.tls import server_context
from proxy.wire.binary import AppErrorType, MessageHeader, encode_application_exception

log = logging.getLogger(__name__)

# A connection over the limit is told so at its first call, or closed after this long.
REFUSAL_PATIENCE = 5.0
REFUSAL_READ_BYTES = 64 * 1024


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
        self._fast_paths = options.fast_paths != "off"
        # A rule of --limits-file that counts hits charges them the ordinary way: no call
        # is answered from a callback while one is in force (on every connection, as soon
        # as the file says so).
        self._at_once = self._fast_paths and not handler.gate.limits.counts_hits
        handler.gate.limits.watchers.append(self._limits_changed)
        # What every connection is held to; one over the limit, to less (its call's header
        # is all it is read for, within a few seconds).
        self.limits = Limits.of(
            options.client_transport,
            max_request_bytes=options.max_request_bytes,
            message_timeout=options.client_message_timeout,
            idle_timeout=options.client_idle_timeout,
        )
        self.refusal_limits = Limits.of(
            options.client_transport,
            max_request_bytes=REFUSAL_READ_BYTES,
            message_timeout=min(REFUSAL_PATIENCE, options.client_message_timeout),
            idle_timeout=REFUSAL_PATIENCE,
        )
        self._server: asyncio.Server | None = None
        # Connections served by their protocol (proxy.conn.protocol), and those over the
        # limit waiting to be told so.
        self._connections: set[ClientProtocol] = set()
        self._refusing: set[ClientProtocol] = set()
        # Connections read through streams (SASL, or a test's): their writers and, once
        # authenticated, their sessions (counted as connections).
        self._streamed: dict[asyncio.Task[None], Streamed] = {}
        self._stream_sessions = 0
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
        return len(self._connections) + self._stream_sessions

    def _settle(self) -> None:
        """Count the calls answered again and not counted yet (see proxy.handler.again)."""
        for conn in self._connections:
            if conn.again is not None:
                conn.again.settle()

    async def start(self) -> None:
        context = server_context(self.options)
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.BaseProtocol:
            if self.acceptor is not None:  # (its bytes are wrapped: read through streams)
                reader = asyncio.StreamReader(READ_SIZE, loop)
                return asyncio.StreamReaderProtocol(reader, self._stream_connected, loop)
            return self.protocol(loop)

        self._server = await loop.create_server(
            protocol,
            self.options.listen.host,
            self.options.listen.port,
            reuse_address=True,
            ssl=context,
            ssl_handshake_timeout=self.options.client_message_timeout if context else None,
        )
        clocks = [self.options.client_message_timeout / 4, 1.0]
        if self.options.client_idle_timeout:
            clocks.append(self.options.client_idle_timeout / 4)
        self._sweep_every = max(0.01, min(clocks))
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)

    def protocol(self, loop: asyncio.AbstractEventLoop) -> ClientProtocol:
        """The protocol of a plain connection (``--fast-paths off``: nothing is answered
        from its callbacks, every call waits in a task; so too while a rule of
        ``--limits-file`` counts hits, which are charged the ordinary way)."""
        return ClientProtocol(self, loop, self._at_once)

    def _limits_changed(self) -> None:
        at_once = self._fast_paths and not self.handler.gate.limits.counts_hits
        if at_once != self._at_once:
            self._at_once = at_once
            for conn in self._connections:
                conn.at_once = at_once

    def _sweep(self) -> None:
        """The clocks of the connections served by their protocol (see
        proxy.conn.machine): a call not whole by its deadline, a connection idle too long,
        closed up to a quarter of the timeout (at most a second) late. One timer for them
        all: one per connection cost ~5 us of each of Trino's calls (git log -p
        docs/benchmarks.md)."""
        loop = asyncio.get_running_loop()
        try:
            now = loop.time()
            for conn in [*self._connections, *self._refusing]:
                due = conn.machine.due()
                if due is not None and due <= now:
                    conn.tick(now)
            # The limits file, read again if it changed, even while every call is a hit
            # answered from a callback (which never looks).
            self.handler.gate.limits.look(time.monotonic())
        except Exception:  # (a bug: logged; the clock goes on for the others)
            log.exception("the clocks of client connections")
        finally:
            if not self.stopping:
                self._sweeper = loop.call_later(self._sweep_every, self._sweep)

    @property
    def ports(self) -> list[int]:
        assert self._server is not None
        return [s.getsockname()[1] for s in self._server.sockets]

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving() and not self.stopping

    def accepted(self, conn: ClientProtocol) -> None:
        """A connection the listener accepted (its protocol's first callback). Over the
        limit, it is told so at its first call (a Thrift client cannot be told anything
        before it asks), then closed. Its socket has TCP_NODELAY already: asyncio's and
        uvloop's TCP transports set it."""
        transport = conn.transport
        assert transport is not None
        if self.stopping:
            transport.close()
            return
        limit = self.options.max_client_connections
        if limit and self.connections() + self._negotiating >= limit:
            conn.refusing = limit
            conn.at_once = False
            # Its call's header is all it is read for, within a few seconds.
            conn.machine = ClientMachine(self.refusal_limits, asyncio.get_running_loop().time())
            self._refusing.add(conn)
            self._count_refusal(limit)
            return
        # Keep up to a slice queued while the socket drains, so big replies never wait for
        # an empty buffer before the next slice is handed over.
        transport.set_write_buffer_limits(high=WRITE_SLICE, low=WRITE_SLICE // 4)
        self._connections.add(conn)

    def _count_refusal(self, limit: int) -> None:
        self.metrics.client_errors.labels("connection_limit").inc()
        now = asyncio.get_running_loop().time()
        if now - self._refusal_logged_at > 10:  # a flood of refusals is one line per 10 s
            self._refusal_logged_at = now
            log.warning(
                "refusing client connections: %d open, the limit (--max-client-connections)",
                limit,
            )

    def refused(self, conn: ClientProtocol, header: MessageHeader | None) -> None:
        """A connection over the limit asked its first call (``header``, if it could be
        read): answered with an error that says why, then closed."""
        transport = conn.transport
        assert transport is not None
        if header is not None:
            reply = encode_application_exception(
                header.name,
                header.seqid,
                AppErrorType.INTERNAL_ERROR,
                f"hms-cache-proxy: too many client connections (limit {conn.refusing}); "
                "retry later",
            )
            transport.write(self.options.client_transport.frame(reply))
        transport.close()

    def report(self, peer: object, decision: Refuse | Close) -> None:
        """Why a connection is closed, counted and logged (see proxy.conn.machine)."""
        if isinstance(decision, Refuse):
            self.metrics.client_errors.labels(decision.reason).inc()
            log.warning("%s: closing connection: %s", peer, decision.text)
        elif decision.reason == "idle":
            self.metrics.client_errors.labels("idle").inc()
            log.info("%s: closing connection %s", peer, decision.text)
        elif decision.reason == "timeout":
            self.metrics.client_errors.labels("timeout").inc()
            log.warning("%s: closing connection: %s", peer, decision.text)
        elif decision.reason == "ended_mid_call":
            log.warning("%s: %s", peer, decision.text)

    def ended(self, conn: ClientProtocol) -> None:
        if conn.refusing:
            self._refusing.discard(conn)
        else:
            self._connections.discard(conn)

    def _stream_connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection read through streams (SASL): served by a task of its own."""
        task = asyncio.get_running_loop().create_task(self.serve_client(reader, writer))
        self._streamed[task] = Streamed(writer)
        task.add_done_callback(functools.partial(self._served, writer))

    def _served(self, writer: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        """A connection read through streams has ended (a bug in it: logged, closed)."""
        self._streamed.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s: internal error serving the connection",
                peer_name(writer),
                exc_info=task.exception(),
            )
            writer.close()

    async def serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One client connection read through streams, until it ends: a SASL negotiation,
        then its session (see proxy.conn.streamed); tests run it on streams of their own."""
        if self.stopping:
            writer.close()
            return
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
        state = SessionState(peer=PeerName(writer.transport))
        byte_reader: ByteReader = reader
        byte_writer: ByteWriter = writer
        if authenticated is not None:
            byte_reader, byte_writer = authenticated.reader, authenticated.writer
            state.user = authenticated.user
            state.mechanism = authenticated.mechanism
            state.principal = authenticated.principal
            state.identity = authenticated_identity(
                authenticated.user,
                end_user=self.options.upstream_identity == "end-user",
                upstream_sasl=self.options.upstream_auth == "kerberos",
            )
        machine = ClientMachine(self.limits, asyncio.get_running_loop().time())
        session = StreamSession(state)
        entry = self._streamed.get(asyncio.current_task())  # type: ignore[arg-type]
        if entry is not None:
            entry.session = session
        self._stream_sessions += 1
        try:
            await serve_streams(
                self.handler,
                session,
                byte_reader,
                byte_writer,
                machine,
                self.report,
                lambda: self.stopping,
            )
        finally:
            self._stream_sessions -= 1
            self.handler.end_session(state)

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
        """A connection read through streams over the limit: a SASL engine reads no Thrift
        before negotiating, so it is closed at once."""
        self._count_refusal(limit)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    async def stop(self, drain_timeout: float) -> None:
        """Stop accepting, let calls under way finish (up to ``drain_timeout``), close the
        rest."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self._refusing):  # (nothing of theirs under way)
            conn.close()
        for conn in list(self._connections):
            conn.again_with(None)
            if not conn.busy:
                conn.close()
        streamed = []
        for task, entry in list(self._streamed.items()):
            if entry.session is None:  # negotiating, or over the limit: nothing under way
                entry.writer.close()
                task.cancel()
            elif not entry.session.handling:
                entry.writer.close()
            streamed.append(task)
        ending: list[asyncio.Future[None]] = [conn.ending() for conn in self._connections]
        waited = [*ending, *streamed]
        if waited:
            _, pending = await asyncio.wait(waited, timeout=drain_timeout)
            if pending:
                log.warning(
                    "drain timeout: closing %d connections with calls under way", len(pending)
                )
            tasks = []
            for conn in list(self._connections):
                conn.close()
                if conn.task is not None:
                    conn.task.cancel()
                    tasks.append(conn.task)
                conn.end()  # (a call in flight is abandoned)
            for task, entry in list(self._streamed.items()):
                entry.writer.close()
                task.cancel()
                tasks.append(task)
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.handler.known is not None:  # (the answers kept, not counted yet)
            self.handler.known.settle()
        if self._server is not None:
            await self._server.wait_closed()
