"""A call the proxy only forwards, answered from protocol callbacks as its bytes arrive.

A forwarded call taken the ordinary way wakes the client session's task for the request,
awaits a pooled connection, and wakes the task again for each piece of the reply: four
turns of the event loop and a dozen coroutines around one metastore round trip, which
measured ~300 us of Python per call (``git log -p docs/benchmarks.md``, the eighth step of
issue 16).
A call that needs nothing of the proxy but forwarding (:meth:`CallHandler.forwards_plainly`)
and arrives whole while an idle pooled connection stands ready is instead written to that
connection from the client's ``data_received``, and its reply, once whole, written to the
client from the connection's (:class:`~proxy.upstream.streams.DivertingProtocol`): no task,
no await, what a do-nothing relay does plus the framing and the metrics.

Only the common case is done here. Anything else (a reply bigger than
:data:`~proxy.upstream.relay.STORE_BEFORE_REPLY_BYTES`, a reply header that does not
match, bad bytes, the connection ending, the read timeout) is handed over as it stands to
the ordinary way, which finishes the call on the same connection (its reply may have begun
in the connection's reader) and answers every failure as it always does: the same retry of
a stale pooled connection, the same errors, the same metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from proxy.metrics import Metrics, method_label
from proxy.upstream import UpstreamConnection, UpstreamPool, UpstreamProtocolError
from proxy.upstream.relay import STORE_BEFORE_REPLY_BYTES, check_reply_header, result_outcome
from proxy.upstream.streams import DivertingProtocol
from proxy.wire.binary import MessageHeader, MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Transport, whole_header

from .forward import Sent


class Flight:
    """One call under way on ``conn``, written already; its reply goes to ``write`` (which
    frames it for the client and raises ConnectionError when the client is gone). Ends with
    ``landed(gone)`` once answered (``gone``: the client was not there to take it), or
    with ``hand_over(sent)`` when the ordinary way must finish it (and then call
    ``landed``)."""

    __slots__ = (
        "audit",
        "conn",
        "count_call",
        "framed",
        "hand_over",
        "header",
        "heard",
        "landed",
        "look_at_exceptions",
        "loop",
        "metrics",
        "pool",
        "protocol",
        "started",
        "timeout",
        "timer",
        "write",
    )

    def __init__(
        self,
        conn: UpstreamConnection,
        protocol: DivertingProtocol,
        header: MessageHeader,
        pool: UpstreamPool,
        metrics: Metrics,
        count_call: Callable[[str, str, str | None, float], None],
        write: Callable[[bytes], None],
        hand_over: Callable[[Sent], None],
        landed: Callable[[bool], None],
        timeout: float,
        *,
        look_at_exceptions: bool = False,
        audit: Callable[[bytes, str, float], None] | None = None,
    ) -> None:
        self.conn = conn
        self.protocol = protocol
        self.header = header
        self.pool = pool
        self.metrics = metrics
        self.count_call = count_call  # (CallHandler.count_call)
        self.write = write
        self.hand_over = hand_over
        self.landed = landed
        # A removed method's exception is looked at the ordinary way (proxy.bridge).
        self.look_at_exceptions = look_at_exceptions
        self.audit = audit  # (its reply, outcome and time, for the audit log)
        self.started = time.perf_counter()
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.timeout = timeout  # how long the metastore may stay silent (as relay's reads)
        self.heard = loop.time()  # when it last sent something (or the call went out)
        self.timer: asyncio.TimerHandle | None = loop.call_at(self.heard + timeout, self._due)
        conn.replies.keep = False  # (the reply is taken whole, in one piece)
        self.framed = conn.replies.transport is Transport.FRAMED
        protocol.receiver = self

    def data_received(self, data: bytes) -> None:
        replies = self.conn.replies
        header = None
        if not replies.buffered and len(data) <= STORE_BEFORE_REPLY_BYTES:
            # The usual: the whole reply in one read, taken as it came (no copy, no scan
            # resumed, nothing left in the reader).
            header = whole_header(data, self.framed, replies.max_size)
        if header is None:
            self._piece_received(data)
            return
        if not self._expected(header):
            replies.feed(data)  # (where the ordinary way reads it)
            self._let_go()
            return
        self._answer(header, data[4:] if self.framed else data)

    def _piece_received(self, data: bytes) -> None:
        """A reply that comes in pieces (or bad bytes), gathered in the connection's reader."""
        replies = self.conn.replies
        replies.feed(data)
        if replies.buffered > STORE_BEFORE_REPLY_BYTES:
            self.heard = self.loop.time()
            self._let_go()  # a big reply: read whole the ordinary way (checked for size)
            return
        try:
            whole = replies.complete()
        except ProtocolError as exc:
            self._let_go(UpstreamProtocolError(f"bad reply: {exc}"))
            return
        if not whole:
            self.heard = self.loop.time()  # (the timer is moved on when it comes due)
            return
        header = replies.header
        assert header is not None
        if not self._expected(header):
            self._let_go()
            return
        piece = replies.take()
        assert piece is not None and piece.last
        self._answer(header, piece.data)

    def _expected(self, header: MessageHeader) -> bool:
        """Whether a reply with ``header`` is answered here; if not, the ordinary way looks
        at it (and checks it again, and answers what is wrong)."""
        asked = self.header
        try:
            check_reply_header(asked.name, asked.seqid, header.name, header.type, header.seqid)
        except UpstreamProtocolError:
            return False
        # (A removed method's UNKNOWN_METHOD is bridged the ordinary way.)
        return not (self.look_at_exceptions and header.type == MessageType.EXCEPTION)

    def _answer(self, header: MessageHeader, data: bytes) -> None:
        """Write the whole reply (``data``, unframed) to the client, then let the connection
        go and count the call."""
        # The reply first: the client runs on from here (on another core) while the
        # connection is given back and the call counted.
        try:
            self.write(data)
            outcome = result_outcome(header.type, data[header.length : header.length + 3])
        except ConnectionError:
            outcome = "client_gone"
        took = time.perf_counter() - self.started
        self._stop()
        self.pool.release(self.conn, reusable=True)
        label = method_label(self.header.name)
        gone = outcome == "client_gone"
        self.count_call(label, outcome, None if gone else "upstream", took)
        if not gone:  # (counted as the ordinary way counts them)
            self.metrics.upstream_requests.labels(label, "ok").inc()
            self.metrics.upstream_duration.labels(label).observe(took)
        if self.audit is not None:
            self.audit(data, outcome, took)
        self.landed(gone)

    def ended(self) -> None:
        """The connection ended before the whole reply: the ordinary way says how (a stale
        pooled connection is retried there, as any is)."""
        self._let_go()

    def abandon(self) -> None:
        """Its session was cancelled (a stop's drain timeout): the connection is closed, its
        reply may still come. Nothing if the ordinary way has it (or it was answered)."""
        if self.protocol.receiver is self:
            self._stop()
            self.pool.discard(self.conn)

    def _due(self) -> None:
        """The read timeout since the call went out, or since bytes last came."""
        due = self.heard + self.timeout
        if due > self.loop.time():
            self.timer = self.loop.call_at(due, self._due)
            return
        self.timer = None
        self._let_go()  # (silent past the read timeout: the ordinary way times out at once)

    def _stop(self) -> None:
        self.protocol.receiver = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _let_go(self, error: UpstreamProtocolError | None = None) -> None:
        self._stop()
        self.hand_over(Sent(self.conn, self.heard + self.timeout, self.started, error))
