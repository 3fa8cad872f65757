"""A client connection's session: the calls it makes, answered one at a time.

A session reads requests with the sans-I/O :class:`MessageReader` and hands each complete
call to the :class:`CallHandler`, one at a time (a Thrift client waits for each reply). Bad
input closes that session only: a message that breaks the protocol or a size limit, or a
request that stops arriving halfway, gets a ``TApplicationException`` when the header was
readable, one warning in the log, and the connection closed. Memory per session is bounded by
the request size limit and, for replies, by streaming.

What it can, it answers as requests arrive, from its connection's protocol, with no task
(proxy.protocols): a hit needing no await, the call answered last asked again, a call only
forwarded (sent at once; its reply written as it arrives, see proxy.handler.flight). The
rest is its task's: made when first needed, it reads the connection through its streams
until the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING

from proxy.cache.l1 import Item
from proxy.client_connection import ClientConnection
from proxy.handler import ClientGone, SessionState
from proxy.handler.again import Again, replaced
from proxy.handler.flight import Flight
from proxy.handler.forward import Sent
from proxy.handler.identity import authenticated_identity
from proxy.handler.session import PeerName
from proxy.protocols import READ_SIZE, StreamProtocol, TasklessProtocol, open_streams
from proxy.sasl.server import Authenticated
from proxy.sasl.stream import ByteReader, ByteWriter
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
    call_without_seqid,
    whole_message,
)

if TYPE_CHECKING:
    from proxy.server import ThriftServer

log = logging.getLogger("proxy.server")  # (its lines are the listener's)


class ClientSession:
    """One client connection's session (see the module's docstring). ``reader`` and
    ``writer``: its streams, if it has them from the start; else it has none until it needs
    them (:meth:`streams`), and answers what it can from its protocol, on ``transport``."""

    def __init__(
        self,
        server: ThriftServer,
        transport: asyncio.WriteTransport,
        loop: asyncio.AbstractEventLoop,
        reader: ByteReader | None = None,
        writer: ByteWriter | None = None,
        authenticated: Authenticated | None = None,
    ) -> None:
        self.server = server
        self.options = server.options
        self.reader = reader
        self.writer = writer
        self.state = SessionState(peer=PeerName(transport))
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
        # (With no streams yet, replies written at once go to the connection's transport;
        # a SASL session's only through its writer, which wraps them.)
        plain = transport if self.writer is None else None
        self.client = ClientConnection(self.writer, self.options.client_transport, plain)
        self.requests: MessageReader  # (the task's: made when it starts, see run)
        self.handling = False
        self._message_deadline = 0.0  # when the request being received must be complete
        # Set while the session waits for a request with nothing buffered: then its
        # protocol may answer a hit as it arrives (see proxy.protocols and answer_now).
        self.waiting = False
        # Its protocol's transport, if the protocol answers hits as they arrive (a session
        # with no streams at first): then so does the task, for what it reads that the
        # protocol did not try (_answered_by_task).
        self.shortcut = transport if writer is None else None
        self._streams: StreamProtocol | None = None
        self.declined = False  # the protocol tried the bytes its task reads next, in vain
        self.answered_at = 0.0  # when a request was last answered that way (idle clock)
        # The call answered last that way (see answer_now), as every connection shares it.
        self.again: Again | None = None
        # A call only forwarded, sent as it arrived, whose reply has not gone out yet; and
        # what the session's task waits on meanwhile, if it has a request of its own.
        self.flight: Flight | None = None
        self.ended = False  # a call in flight found its client gone: the session ends
        self._after_flight: asyncio.Future[None] | None = None
        self.loop = loop
        # The task serving the connection, once it needs one (see proxy.protocols).
        self.task: asyncio.Task[None] | None = None
        self.over = False  # ended (see end)
        self._ending: asyncio.Future[None] | None = None  # what a stop waits on

    def keep_again(self, again: Again | None) -> None:
        """Answer calls again with ``again`` from now on (see :func:`.again.replaced`)."""
        before, self.again = self.again, again
        replaced(before, again)

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
            answered = self._answer_looked_up(data, transport)
        except ClientGone as exc:
            log.debug("%s: connection ended: %s", self.state.peer, exc)
            self.close()  # the connection's end, or the session's read, then ends it
            return True
        except Exception:
            self.broke(written=self.client.answered != before)
            return True
        if answered:
            self.state.calls += 1
            self.answered_at = self.loop.time()
        return answered

    def _answer_looked_up(self, data: bytes, stream: asyncio.WriteTransport) -> bool:
        handler = self.server.handler
        known_calls = handler.known
        transport = self.client.transport
        write = self.client.write_at_once
        if known_calls is None:  # nothing is a hit: a call only forwarded may go at once
            return self._forward_now(data, None)
        # A call made before, on any connection, byte for byte but for the seqid, is known
        # without finding its end or decoding it (the same bytes were one whole message then),
        # and answered again as it was, if it still may be (see proxy.handler.known_calls).
        repeat = call_without_seqid(data, transport)
        hit: Item | bool | None = False
        message: Message | None = None
        known = None
        if repeat is not None:
            known = known_calls.get(self.state, repeat[0])
            if known is not None:
                again = known.again
                if again is not None and again is not self.again and again.answer(data, stream):
                    self.keep_again(again)
                    return True
                hit = handler.serve_known_now(known, repeat[1], write)
        if hit is False:  # not known by its bytes (None: known, and not answered at once)
            message = whole_message(data, transport, self.options.max_request_bytes)
            if message is None:
                return False
            bytes_known = repeat[0] if repeat is not None else None
            hit = handler.serve_hit_now(self.state, message, write, bytes_known)
            if bytes_known is not None and isinstance(hit, Item):
                known = known_calls.get(self.state, bytes_known)  # (kept with its plan)
        if isinstance(hit, Item):
            again = known.again if known is not None else None
            if known is not None and (again is None or not again.answers_from(hit)):
                # (once per hit judged, not per call: ~5 us; git log -p docs/benchmarks.md)
                again = handler.again(hit, data, transport)
                if again is not None:
                    known_calls.answer_with(known, again)
            self.keep_again(again)
            return True
        self.keep_again(None)
        if hit is True:  # assembled from partitions, nothing to keep
            return True
        return self._forward_now(data, message)  # not a hit: only forwarded, maybe

    def _forward_now(self, data: bytes, message: Message | None) -> bool:
        """Send a call only forwarded to the metastore at once (see proxy.handler.flight);
        ``message``: what ``data`` holds, if it was found already."""
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
        """The call in flight is finished the ordinary way, in a task of its own (which
        writes to the session's stream)."""
        self.streams()
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
            self.close()
        waiting = self._after_flight
        if waiting is not None and not waiting.done():  # (not if a stop cancelled it)
            waiting.set_result(None)
        if self.server.stopping:
            self.close()  # (as the ordinary way ends a session after its call)

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
        if self.writer is not None:
            self.writer.close()
        elif self.shortcut is not None:
            self.shortcut.close()

    def closing(self) -> bool:
        """Closed, or closing (its end may not have come yet)."""
        if self.writer is not None:
            return self.writer.is_closing()
        return self.shortcut is None or self.shortcut.is_closing()

    def streams(self) -> StreamProtocol:
        """The session's streams, made now if it has none (its connection's protocol then
        becomes their :class:`StreamProtocol`)."""
        if self._streams is None:
            transport = self.shortcut
            assert transport is not None  # (a session given streams has them)
            before = transport.get_protocol()
            paused = isinstance(before, TasklessProtocol) and before.paused
            self._streams, self.reader, writer = open_streams(transport, self.loop, self, paused)
            self.writer = writer
            self.client.streams(writer)
        return self._streams

    def idle_out(self, idle: float) -> None:
        """Close the connection, idle for ``idle`` seconds (the connection's end then ends
        the session)."""
        self.server.idle_out(self.state.peer, idle, self.close)

    def start_task(self) -> None:
        """The session needs its task from now on (see proxy.protocols); none once it has
        ended (a stop that gave up on its call in flight, say)."""
        if self.over:
            return
        self.streams()
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
        try:
            flight, self.flight = self.flight, None  # (no task is started for it after this)
            if flight is not None:  # (cancelled by a stop while it waited for it)
                flight.abandon()
            self.server.handler.end_session(self.state)
        finally:  # (a bug above must not leave it counted, nor a stop waiting for it)
            self.close()
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
            if self.writer is not None:
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
        self.close()

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
        else:
            timeout = self.options.client_idle_timeout or None
        try:
            data = await self._read_within(timeout, partial)
        except TimeoutError:
            if partial:
                self.server.metrics.client_errors.labels("timeout").inc()
                log.warning(
                    "%s: closing connection: request incomplete after %g s (%d bytes received)",
                    self.state.peer,
                    self.options.client_message_timeout,
                    self.requests.buffered,
                )
            else:
                self.idle_out(self.options.client_idle_timeout)
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
        reader = self.reader
        assert reader is not None  # (the task's: see start_task)
        if partial:
            async with asyncio.timeout(timeout):
                return await reader.read(READ_SIZE)
        loop = asyncio.get_running_loop()
        self.answered_at = loop.time()
        idle = timeout
        while True:
            self.waiting = True
            try:
                async with asyncio.timeout(timeout):
                    return await reader.read(READ_SIZE)
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
