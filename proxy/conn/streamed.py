"""A client connection read through streams: a SASL session, whose bytes are wrapped.

After its SASL negotiation (proxy.sasl.server) a Kerberos or token client's bytes come
through the negotiated security layer (proxy.sasl.stream), a reader and a writer that frame
and wrap them. The same state machine as any connection's (:mod:`.machine`) says what to
do with them; here a loop reads, feeds it, and answers each call in turn, awaiting the
handler (nothing is answered from a callback: the layer's bytes are not the call's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from proxy.client_connection import ClientConnection
from proxy.conn.machine import Call, ClientMachine, Close, Refuse
from proxy.handler import CallHandler, ClientGone, SessionState
from proxy.sasl.stream import ByteReader, ByteWriter
from proxy.wire.framing import Transport

log = logging.getLogger("proxy.server")  # (its lines are the listener's)

READ_SIZE = 64 * 1024


@dataclass(eq=False)
class StreamSession:
    """A connection read through streams, once authenticated: who it is, and whether a call
    of its is being answered (a stop lets that call finish)."""

    state: SessionState
    handling: bool = False


@dataclass(eq=False)
class Streamed:
    """What the listener keeps of a connection read through streams."""

    writer: asyncio.StreamWriter
    session: StreamSession | None = None


async def serve_streams(
    handler: CallHandler,
    session: StreamSession,
    reader: ByteReader,
    writer: ByteWriter,
    machine: ClientMachine,
    report: Callable[[object, Refuse | Close], None],
    stopping: Callable[[], bool],
) -> None:
    """Serve one connection from its streams until it ends (``report``: the listener's
    account of why it closed it; ``stopping``: whether the proxy stops, after the call
    being answered)."""
    loop = asyncio.get_running_loop()
    state = session.state
    transport = machine.limits.transport
    client = ClientConnection(writer, transport)
    decision: Call | Refuse | Close | None = None
    try:
        while not stopping():
            due = machine.due()
            try:
                async with asyncio.timeout(None if due is None else max(0.0, due - loop.time())):
                    data = await reader.read(READ_SIZE)
            except TimeoutError:  # (the read may have stopped mid-frame: the end, whatever)
                assert due is not None
                decision = machine.tick(max(loop.time(), due))
            else:
                now = loop.time()
                decision = machine.received(data, now) if data else machine.ended()
            while isinstance(decision, Call):
                session.handling = True
                try:
                    await handler.handle(state, decision.message, client)
                finally:
                    session.handling = False
                state.calls += 1
                if stopping():
                    return
                decision = machine.answered(loop.time())
            if decision is not None:
                report(state.peer, decision)
                if isinstance(decision, Refuse):
                    await _tell(client, transport, decision)
                return
    except (ConnectionError, ClientGone) as exc:
        log.debug("%s: connection ended: %s", state.peer, exc)
    finally:
        machine.close()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _tell(client: ClientConnection, transport: Transport, refused: Refuse) -> None:
    """Answer the caller of a refused message with why, if it can still be told."""
    reply = refused.reply()
    if reply is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.send(transport.frame(reply)), 1.0)
