"""A client connection's protocols: what runs as its bytes arrive, before any task.

A connection the listener accepts starts with :class:`TasklessProtocol`: no session, no
streams, no task. A call the answer kept for it answers (proxy.handler.known_calls) is
answered with no session at all (:func:`answered_before_a_session`); the first that is not
gets the connection its session. A request that arrives whole and is a cache hit needing no
await, or a call only forwarded, is answered from its ``data_received``
(:func:`answered_at_once`); a client that
ends its connection ends its session from ``eof_received`` and ``connection_lost``. Trino
opens a connection per call, so most of its connections are served that way from start to
end: asyncio's streams and a task (made, started, read through, woken at the end) cost more
than the hit itself (git log -p docs/benchmarks.md).

Anything else (a request in parts, a call that awaits, a client that pipelines, ends its
side or resets while a call is in flight) gives the session its streams: the connection's
protocol becomes a :class:`StreamProtocol`, asyncio's stream protocol, which feeds what
arrives to the session's task and still answers at once what arrives while that task waits
with nothing buffered (the task's wake-up, its read and its coroutines cost more than a
hit). Connections served by a task from the start (SASL, refused at the limit) have their
streams at once (:func:`open_streams`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from proxy.handler import ClientGone
from proxy.handler.again import replaced
from proxy.handler.session import PeerName
from proxy.wire.framing import call_without_seqid

if TYPE_CHECKING:
    from proxy.client_session import ClientSession
    from proxy.handler.again import Again
    from proxy.server import ThriftServer

log = logging.getLogger("proxy.server")  # (its lines are the listener's)

READ_SIZE = 64 * 1024


def answered_at_once(
    session: ClientSession, data: bytes, transport: asyncio.WriteTransport
) -> bool:
    """Answer ``data`` as it arrives if it can be: as the call answered last, asked again
    (proxy.handler.again), first, in as few steps as can be; else as a hit or a call only
    forwarded (:meth:`ClientSession.answer_now`). ``False``: nothing was done with it
    (and the session's task need not try it again: ``declined``)."""
    try:
        again = session.again
        if again is not None and again.answer(data, transport):
            session.state.calls += 1
            session.answered_at = session.loop.time()
            return True
        answered = session.answer_now(data, transport)
    except ClientGone as exc:
        log.debug("%s: connection ended: %s", session.state.peer, exc)
        return True  # (closed: the connection's end, or the task's read, ends the session)
    except Exception:
        # A bug in Again.answer, before its write (answer_now handles its own, told apart
        # by whether it wrote).
        session.broke()
        return True
    if not answered:
        session.declined = True
    return answered


def answered_before_a_session(protocol: TasklessProtocol, data: bytes) -> bool:
    """Answer ``data``, on a connection with no session yet, with the answer kept for the
    same call (:class:`proxy.handler.known_calls.KnownCalls`), if it still holds; ``False``: nothing
    was done with it. Trino's connections ask one call each: most are answered and closed
    with no session made at all (its objects, made and ended, cost ~4 us of such a call,
    git log -p docs/benchmarks.md). A connection with no session has said nothing before:
    no identity, no connection of its own to the metastore."""
    server, transport = protocol.server, protocol.transport
    known_calls = server.handler.known
    if known_calls is None or server.stopping or transport is None:
        return False
    try:
        # The call it answered last, asked again (compared in place), first: an engine's
        # kept connection repeats its calls.
        again = protocol.again
        if again is None or not again.answer(data, transport):
            repeat = call_without_seqid(data, server.options.client_transport)
            known = known_calls.first(repeat[0]) if repeat is not None else None
            again = known.again if known is not None else None
            if again is None or not again.answer(data, transport):
                return False
            before, protocol.again = protocol.again, again
            replaced(before, again)  # (let go for every connection meanwhile: counted now)
    except ClientGone as exc:  # (its transport closed: the connection's end follows)
        log.debug("%s: connection ended: %s", PeerName(transport), exc)
        return True
    except Exception:  # (a bug, before its write: told as answer_now tells it)
        log.exception(
            "%s: internal error answering at once: closing the connection", PeerName(transport)
        )
        transport.close()
        return True
    protocol.answered_at = protocol.loop.time()
    return True


class TasklessProtocol(asyncio.Protocol):
    """A connection's protocol while its session has neither streams nor a task (see the
    module's docstring). Until it needs one, the connection has no session at all: its
    calls that an answer kept for them answers are answered without one
    (:func:`answered_before_a_session`)."""

    def __init__(self, server: ThriftServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.session: ClientSession | None = None
        self.transport: asyncio.WriteTransport | None = None
        self.paused = False  # (handed on to the stream protocol)
        self.answered_at = 0.0  # (the idle clock, while it has no session)
        self.again: Again | None = None  # what answered its last call, while it has none

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio's classes, but have their methods)
        self.transport = cast(asyncio.WriteTransport, transport)
        self.server.accepted(self, self.transport)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None:
            if answered_before_a_session(self, data):
                return
            session = self.server.open_session(self)
        assert self.transport is not None  # (see accepted)
        if session.flight is None and answered_at_once(session, data, self.transport):
            return
        # The session's task reads these bytes: nothing is answered here before they are
        # (a call in flight meanwhile, say); what it does may change what this connection
        # is answered.
        session.waiting = False
        session.keep_again(None)
        session.streams().data_received(data)  # (and its task starts)

    def eof_received(self) -> bool | None:
        session = self.session
        if session is None or session.over or session.flight is None:
            return False  # the transport closes: its connection_lost ends the session
        return session.streams().eof_received()  # (its task answers the call in flight)

    def connection_lost(self, exc: Exception | None) -> None:
        session = self.session
        if session is None:
            self.server.sessionless_lost(self)
            return
        if session.over:
            return
        if session.flight is None:
            session.end()
        else:  # (its task: answered to nobody, counted, its connection given back)
            session.streams().connection_lost(exc)


class StreamProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, for a session with streams: what arrives while its task
    waits for a request with nothing buffered, and is answered at once, is answered here,
    without waking the task; everything else is fed to the task's stream, as asyncio would
    (and starts the task, if the session has none yet)."""

    transport: asyncio.WriteTransport | None = None

    def __init__(
        self,
        reader: asyncio.StreamReader,
        loop: asyncio.AbstractEventLoop,
        session: ClientSession | None,
    ) -> None:
        # (The base keeps only a weak reference to the stream it feeds.)
        super().__init__(reader, None, loop)
        self.reader = reader
        self.session = session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None:
            super().data_received(data)
            return
        if session.waiting and session.flight is None:
            assert self.transport is not None
            if answered_at_once(session, data, self.transport):
                return
        session.waiting = False
        session.keep_again(None)
        super().data_received(data)
        if session.task is None:
            session.start_task()

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


def open_streams(
    transport: asyncio.WriteTransport,
    loop: asyncio.AbstractEventLoop,
    session: ClientSession | None = None,
    paused: bool = False,
) -> tuple[StreamProtocol, asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams on a connection, as ``asyncio.start_server`` gives its callback: its protocol
    becomes a :class:`StreamProtocol` (``session``'s, if given; ``paused``: the transport
    told the protocol before it to stop writing)."""
    reader = asyncio.StreamReader(READ_SIZE, loop)
    protocol = StreamProtocol(reader, loop, session)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if paused:
        protocol.pause_writing()
    return protocol, reader, asyncio.StreamWriter(transport, protocol, reader, loop)
