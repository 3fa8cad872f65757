"""A client connection's I/O: one ``asyncio.Protocol`` for its whole life.

What arrives is fed to the connection's state machine (:mod:`.machine`), and the protocol
does what it says. A call that arrives whole, alone in its chunk, while the connection is
idle, is first tried as it stands, from this callback, with no task and no coroutine: the
call answered last asked again (an ``Again``, compared in place), a call the proxy knows
by its bytes, a hit needing no await, a call only forwarded (a ``Flight``, whose reply is
written as it arrives). Trino opens a connection per call: most of its connections are
served that way from start to end, and with no session made (who the client is, its
writer: made at the first call that needs them; made and ended, they cost ~4 us of such a
call, ``git log -p docs/benchmarks.md``).

A call that must wait (a miss, a write, a call in parts, one kept after another) gets a
task of its own, which runs the handler and then hands the machine its answer (uvicorn's
shape: one protocol, a task per request). There is one such call at a time: a Thrift
client waits for each reply, and what a client that pipelines sends meanwhile waits in
the machine. Replies answered at once go straight to the transport, and only while nothing
waits to be written there (a task's writes, with their backpressure, keep the order and
bound memory); a task's go through :class:`.writer.ProtocolWriter`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from enum import Enum
from typing import TYPE_CHECKING, cast

from proxy.cache.l1 import Item
from proxy.client_connection import ClientConnection
from proxy.conn.machine import ENDED, Call, ClientMachine, Decision, Refuse
from proxy.conn.writer import ProtocolWriter
from proxy.handler import ClientGone, SessionState
from proxy.handler.again import Again, replaced
from proxy.handler.flight import Flight
from proxy.handler.forward import Sent
from proxy.handler.session import PeerName
from proxy.wire.framing import Message, call_without_seqid, whole_message

if TYPE_CHECKING:
    from proxy.server import ThriftServer

log = logging.getLogger("proxy.server")  # (its lines are the listener's)


class AtOnce(Enum):
    """What became of a chunk tried as one whole call, from the callback."""

    ANSWERED = "answered"  # written
    FLYING = "flying"  # sent to the metastore; its reply is written as it arrives
    ENDED = "ended"  # the connection is closed (its client gone, or a bug)


class ClientProtocol(asyncio.Protocol):
    """One client connection (see the module's docstring). ``at_once``: whether calls may
    be answered from the callback (``--fast-paths``); ``refusing``: the connection limit it
    came over (its first call is told so, then it is closed)."""

    # Made for every connection, Trino's one call each among them: what most never set is
    # a class default, not set for each.
    transport: asyncio.Transport | None = None
    machine: ClientMachine
    refusing = 0  # the connection limit it came over (its first call is told so)
    # Made when a call first needs them (see the module's docstring).
    state: SessionState | None = None
    client: ClientConnection | None = None
    writer: ProtocolWriter | None = None
    # What answered its last call at once, to answer it again (proxy.handler.again).
    again: Again | None = None
    flight: Flight | None = None  # a call forwarded as it arrived, not answered yet
    task: asyncio.Task[None] | None = None  # a call that had to wait
    reading = True
    paused_writing = False
    lost = False
    over = False
    _ending: asyncio.Future[None] | None = None

    def __init__(
        self,
        server: ThriftServer,
        loop: asyncio.AbstractEventLoop,
        at_once: bool = True,
    ) -> None:
        self.server = server
        self.loop = loop
        self.at_once = at_once

    # -- asyncio's callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio's classes, but have their methods)
        self.transport = cast(asyncio.Transport, transport)
        self.machine = ClientMachine(self.server.limits, self.loop.time())
        self.server.accepted(self)

    def data_received(self, data: bytes) -> None:
        machine = self.machine
        tried = False
        if self.at_once and machine.whole_chunk_welcome():
            done = self._answered_whole(data)
            if done is AtOnce.ANSWERED:
                machine.answered_whole(self.loop.time())
                return
            if done is AtOnce.FLYING:
                machine.answering_whole()
                return
            if done is AtOnce.ENDED:
                return
            tried = True
        self._act(machine.received(data, self.loop.time(), tried=tried))

    def eof_received(self) -> bool | None:
        transport = self.transport
        assert transport is not None
        decision = self.machine.ended()
        if decision is None:
            # A call is being answered: its reply still goes out (TLS cannot half-close:
            # the transport closes, and the call ends answered to nobody).
            return transport.get_extra_info("sslcontext") is None
        if decision is not ENDED and not self.refusing:  # (the usual end: nothing to say)
            self.server.report(self._peer(), decision)
        # The transport closes, and connection_lost ends the connection; but only once what
        # is written has gone out, which a client that reads nothing more never lets happen:
        # then it ends now (not counted open, nor waited for by a stop, meanwhile).
        if decision is not ENDED or transport.get_write_buffer_size():
            self.end()
        return False

    def pause_writing(self) -> None:
        if self.writer is not None:
            self.writer.pause()
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        if self.writer is not None:
            self.writer.resume()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.writer is not None:
            self.writer.lost(exc)
        if self.task is None and self.flight is None:
            self.end()
        else:
            self.machine.close()
        # (Else the call under way ends as ever: answered to nobody, counted, its metastore
        # connection given back; then the connection's end, see _after.)

    # -- what the machine says -------------------------------------------------------------

    def _act(self, decision: Decision | None) -> None:
        transport = self.transport
        assert transport is not None
        machine = self.machine
        if self.reading == machine.full and not self.lost:  # (what is kept bounds reading)
            self.reading = not machine.full
            if self.reading:
                transport.resume_reading()
            else:
                transport.pause_reading()
        if decision is None:
            if self.refusing and machine.header is not None:  # (its header is enough)
                self.server.refused(self, machine.header)
                self.end()
            return
        if isinstance(decision, Call):
            if self.refusing:
                self.server.refused(self, decision.message.header)
                self.end()
                return
            whole = decision.whole
            if whole is not None and self.at_once and not decision.tried:
                # (A call that came alone while another was answered, its turn come.)
                done = self._answered_whole(whole)
                if done is AtOnce.ANSWERED:
                    self._act(self.machine.answered(self.loop.time()))
                    return
                if done is not None:  # (flying, or the connection closed)
                    return
            self._start(decision.message)
        elif isinstance(decision, Refuse):
            if self.refusing:
                self.server.refused(self, decision.header)
            else:
                self.server.report(self._peer(), decision)
                reply = decision.reply()
                if reply is not None:
                    transport.write(self.server.options.client_transport.frame(reply))
            self.end()  # (closed: its reply goes out if the client reads it)
        else:
            if not self.refusing:  # (one over the limit was counted when it came)
                self.server.report(self._peer(), decision)
            if decision.reason in ("idle", "timeout"):
                transport.abort()  # (nothing owed: a client reading nothing cannot hold it)
            self.end()

    def tick(self, now: float) -> None:
        """The connection's clocks (the listener's sweep, see ThriftServer)."""
        decision = self.machine.tick(now)
        if decision is not None:
            self._act(decision)

    # -- a call that must wait -------------------------------------------------------------

    def _start(self, message: Message) -> None:
        self.session()
        self.again_with(None)  # (its calls go the ordinary way from here: see _call)
        self.task = self.loop.create_task(self._call(message))
        self.task.add_done_callback(self._task_done)

    async def _call(self, message: Message, sent: Sent | None = None) -> None:
        state, client = self.state, self.client
        assert state is not None and client is not None
        gone = False
        try:
            await self.server.handler.handle(state, message, client, sent)
            state.calls += 1
        except (ConnectionError, ClientGone) as exc:
            log.debug("%s: connection ended: %s", state.peer, exc)
            gone = True
        except Exception:  # (a bug: nothing more of this connection is answered)
            log.exception("%s: internal error serving the connection", state.peer)
            gone = True
        finally:
            self.task = None
            self._after(gone)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # (a bug: logged)
            log.error(
                "%s: internal error serving the connection",
                self._peer(),
                exc_info=task.exception(),
            )
            if self.task is task:
                self.task = None
            self.end()

    def _after(self, gone: bool) -> None:
        """The call under way was answered (``gone``: or its client found gone, or a bug
        ended it): the next, if the client sent one meanwhile, or the connection's end."""
        if gone or self.lost:
            self.end()
            return
        if self.server.stopping:
            self.close()
        if self.transport is not None and self.transport.is_closing():
            return  # (its end comes with connection_lost)
        self._act(self.machine.answered(self.loop.time()))

    # -- answered at once ------------------------------------------------------------------

    def _answered_whole(self, data: bytes) -> AtOnce | None:
        """Answer ``data``, one whole call alone in its chunk, from this callback if it can
        be (see the module's docstring); ``None``: nothing was done with it."""
        transport = self.transport
        assert transport is not None
        if self.server.stopping:
            return None
        audit = self.server.handler.audit
        started = time.perf_counter() if audit is not None else 0.0
        try:
            # The call it answered last, asked again (compared in place), first: an engine's
            # kept connection repeats its calls. (Again.answer checks the transport.)
            again = self.again
            if again is not None and again.answer(data, transport):
                if self.state is not None:
                    self.state.calls += 1
                if audit is not None:
                    audit.again(self.state, transport, again, started)
                return AtOnce.ANSWERED
            if self.state is None:  # a connection that has said nothing before
                known_calls = self.server.handler.known
                if known_calls is not None:
                    repeat = call_without_seqid(data, self.server.limits.transport)
                    known = known_calls.first(repeat[0]) if repeat is not None else None
                    again = known.again if known is not None else None
                    if again is not None and again.answer(data, transport):
                        self.again_with(again)
                        if audit is not None:
                            audit.again(None, transport, again, started)
                        return AtOnce.ANSWERED
        except ClientGone as exc:  # (its transport closed)
            return self._ended_at_once(exc)
        except Exception:  # (a bug, before its write)
            return self._ended_at_once(None)
        return self._answered_now(data, transport)

    def _answered_now(self, data: bytes, transport: asyncio.Transport) -> AtOnce | None:
        """:meth:`_answered_whole` past the answers kept: a hit needing no await, or a call
        only forwarded; these need the session. Only while nothing waits to be written (a
        task's writes, with their backpressure, keep the order and bound memory)."""
        if transport.get_write_buffer_size() or transport.is_closing():
            return None
        state = self.session()
        client = self.client
        assert client is not None
        before = client.answered
        try:
            done = self._looked_up(data, transport, state, client)
        except ClientGone as exc:
            return self._ended_at_once(exc)
        except Exception:
            if client.answered != before:  # (after its reply: the connection goes on)
                log.exception("%s: internal error after answering at once", state.peer)
                state.calls += 1
                return AtOnce.ANSWERED
            return self._ended_at_once(None)
        if done is AtOnce.ANSWERED:
            state.calls += 1
        return done

    def _ended_at_once(self, gone: ClientGone | None) -> AtOnce:
        """Answering at once ended the connection: its client was ``gone``, or (``None``,
        called while handling it) a bug struck before the reply was written. The call may
        have gone nowhere, or to the metastore already (a call only forwarded): the
        connection is closed, as a lost one is, rather than left waiting for a reply that
        may never come, or the call sent twice."""
        if gone is not None:
            log.debug("%s: connection ended: %s", self._peer(), gone)
        else:
            log.exception(
                "%s: internal error answering at once: closing the connection", self._peer()
            )
        self.end()
        return AtOnce.ENDED

    def _looked_up(
        self,
        data: bytes,
        transport: asyncio.Transport,
        state: SessionState,
        client: ClientConnection,
    ) -> AtOnce | None:
        handler = self.server.handler
        known_calls = handler.known
        write = client.write_at_once
        if known_calls is None:  # nothing is a hit: a call only forwarded may go at once
            return self._forward_now(data, None)
        # A call made before, on any connection, byte for byte but for the seqid, is known
        # without finding its end or decoding it, and answered again as it was, if it still
        # may be (see proxy.handler.known_calls).
        repeat = call_without_seqid(data, client.transport)
        hit: Item | bool | None = False
        message: Message | None = None
        known = None
        if repeat is not None:
            known = known_calls.get(state, repeat[0])
            if known is not None:
                again = known.again
                audit = handler.audit
                started = time.perf_counter() if audit is not None else 0.0
                if again is not None and again is not self.again and again.answer(data, transport):
                    self.again_with(again)
                    if audit is not None:
                        audit.again(state, transport, again, started)
                    return AtOnce.ANSWERED
                hit = handler.serve_known_now(known, repeat[1], write, state)
        if hit is False:  # not known by its bytes (None: known, and not answered at once)
            message = whole_message(data, client.transport, self.server.options.max_request_bytes)
            if message is None:
                return None
            bytes_known = repeat[0] if repeat is not None else None
            hit = handler.serve_hit_now(state, message, write, bytes_known)
            if bytes_known is not None and isinstance(hit, Item):
                known = known_calls.get(state, bytes_known)  # (kept with its plan)
        if isinstance(hit, Item):
            again = known.again if known is not None else None
            if known is not None and (again is None or not again.answers_from(hit)):
                # (once per hit judged, not per call: ~5 us; git log -p docs/benchmarks.md)
                again = handler.again(hit, data, client.transport)
                if again is not None:
                    known_calls.answer_with(known, again)
            self.again_with(again)
            return AtOnce.ANSWERED
        self.again_with(None)
        if hit is True:  # assembled from partitions, nothing to keep
            return AtOnce.ANSWERED
        return self._forward_now(data, message)  # not a hit: only forwarded, maybe

    def _forward_now(self, data: bytes, message: Message | None) -> AtOnce | None:
        """Send a call only forwarded to the metastore at once (see proxy.handler.flight);
        ``message``: what ``data`` holds, if it was found already."""
        state, client = self.state, self.client
        assert state is not None and client is not None
        if message is None:
            message = whole_message(data, client.transport, self.server.options.max_request_bytes)
            if message is None:
                return None
        handover = functools.partial(self._hand_over, message)
        flight = self.server.handler.forward_now(
            state, message, client.write_at_once, handover, self._landed
        )
        if flight is None:
            return None
        self.flight = flight
        return AtOnce.FLYING

    def _hand_over(self, message: Message, sent: Sent) -> None:
        """The call in flight is finished the ordinary way, in a task of its own."""
        self.flight = None
        self.task = self.loop.create_task(self._call(message, sent))
        self.task.add_done_callback(self._task_done)

    def _landed(self, gone: bool = False) -> None:
        """The call in flight was answered (``gone``: or its client found gone)."""
        self.flight = None
        if self.state is not None and not gone:
            self.state.calls += 1
        self._after(gone)

    # -- the session -----------------------------------------------------------------------

    def session(self) -> SessionState:
        """Who the client is and its writer, made when first needed."""
        state = self.state
        if state is None:
            transport = self.transport
            assert transport is not None
            state = self.state = SessionState(peer=PeerName(transport))
            self.writer = ProtocolWriter(transport, self.loop)
            if self.paused_writing:
                self.writer.pause()
            self.client = ClientConnection(
                self.writer, self.server.options.client_transport, transport
            )
        return state

    def again_with(self, again: Again | None) -> None:
        """Answer calls again with ``again`` from now on (see :func:`.again.replaced`)."""
        before, self.again = self.again, again
        replaced(before, again)

    @property
    def busy(self) -> bool:
        """A call is being answered (by a task, or in flight)."""
        return self.task is not None or self.flight is not None

    def _peer(self) -> object:
        return self.state.peer if self.state is not None else PeerName(self.transport)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def ending(self) -> asyncio.Future[None]:
        """Done when the connection has ended."""
        if self._ending is None:
            self._ending = self.loop.create_future()
            if self.over:
                self._ending.set_result(None)
        return self._ending

    def end(self) -> None:
        """The connection's end (once): its session's, what answered it again counted."""
        if self.over:
            return
        self.over = True
        self.machine.close()
        try:
            if self.flight is not None:  # (a stop gave up on it)
                flight, self.flight = self.flight, None
                flight.abandon()
            if self.state is not None:
                self.server.handler.end_session(self.state)
        finally:  # (a bug above must not leave it counted, nor a stop waiting for it)
            if self.again is not None:
                self.again_with(None)
            if not self.lost:
                self.close()
            self.server.ended(self)
            ending = self._ending
            if ending is not None and not ending.done():
                ending.set_result(None)
