"""A client connection as a state machine, sans-I/O: bytes and times in, what to do out.

The machine opens no socket and awaits nothing: the connection's protocol feeds it what
arrives and the time, and does what it says (h11's ``Connection``, for Thrift calls). Its
states:

``IDLE``
    Between calls, nothing of the next one received. The idle clock runs: the connection
    may stay so for ``--client-idle-timeout`` after the last call was answered.
``RECEIVING``
    Part of a call received. Its deadline runs: the whole call must arrive within
    ``--client-message-timeout`` of its first byte, however the bytes trickle in (a
    deadline, not a timeout per read, or a slow client could hold the connection forever).
``ANSWERING``
    A whole call is being answered: at once, by a call forwarded as it arrived, or by a
    task. A Thrift client waits for each reply; what a client that pipelines sends
    meanwhile is kept, unread, for after it. No clock of the machine's runs (the call has
    its own bounds at the metastore).
``CLOSED``
    Ended: the client left, sent what breaks the protocol or a limit, or a clock ran out;
    or the proxy closed it.

What the protocol does with the bytes of a call is its own (the cache decides): the machine
says when a call has arrived, and whether its bytes came in one piece with nothing before
them (:attr:`Call.whole`), which is when a call may be answered from those very bytes
without being scanned (a call asked again, compared in place; see proxy.handler.again).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.wire.binary import (
    AppErrorType,
    MessageHeader,
    MessageType,
    encode_application_exception,
)
from proxy.wire.errors import MessageTooLarge, ProtocolError
from proxy.wire.framing import Message, MessageReader, Transport


class State(enum.Enum):
    IDLE = "idle"
    RECEIVING = "receiving"
    ANSWERING = "answering"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Call:
    """A whole call to answer (the machine is ``ANSWERING`` it until
    :meth:`ClientMachine.answered`). ``whole``: the bytes it arrived in (its frame too),
    when they were exactly this call with nothing before it; else ``None`` (received in
    parts, or kept after another). ``tried``: those bytes were offered whole and declined
    (:meth:`ClientMachine.received`)."""

    message: Message
    whole: bytes | None = None
    tried: bool = False


@dataclass(frozen=True, slots=True)
class Refuse:
    """Bad input: say why (``reason``, a metric label; ``text``, one log line), answer
    ``header``'s caller with an error if it could be read, and close."""

    reason: str  # "protocol", "too_large", "bad_message_type"
    text: str
    header: MessageHeader | None

    def reply(self) -> bytes | None:
        """The error its caller is answered with (unframed), if it can be named."""
        header = self.header
        if header is None:
            return None
        kind = (
            AppErrorType.INVALID_MESSAGE_TYPE
            if self.reason == "bad_message_type"
            else AppErrorType.PROTOCOL_ERROR
        )
        return encode_application_exception(
            header.name, header.seqid, kind, f"hms-cache-proxy: {self.text}"
        )


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection: ``reason`` ("idle", "timeout", "ended", "ended_mid_call"),
    ``text``, one log line (empty: nothing worth a line)."""

    reason: str
    text: str = ""


Decision = Call | Refuse | Close

ENDED = Close("ended")  # (the usual end, between calls: made once)


@dataclass(frozen=True, slots=True)
class Limits:
    """What every connection of a listener is held to (made once, shared)."""

    transport: Transport
    max_request_bytes: int
    message_timeout: float  # a call whole within this of its first byte
    idle_timeout: float | None  # IDLE for longer: closed (None: never)
    # What is kept for after the call being answered before reading pauses (see full).
    keep_at_most: int

    @classmethod
    def of(
        cls,
        transport: Transport,
        *,
        max_request_bytes: int,
        message_timeout: float,
        idle_timeout: float | None,
    ) -> Limits:
        keep = max(64 * 1024, min(max_request_bytes, 1 << 20))
        return cls(transport, max_request_bytes, message_timeout, idle_timeout or None, keep)


class ClientMachine:
    """One client connection's state (see the module's docstring). ``IDLE`` has nothing
    buffered, ever: bytes that arrive make it ``RECEIVING`` (or are kept, ``ANSWERING``).
    Made for every connection, Trino's one call each among them: small, and its reader
    made only when a call must be scanned."""

    __slots__ = (
        "_deadline",
        "_ended",
        "_idle_since",
        "_kept_whole",
        "_reader",
        "calls",
        "limits",
        "state",
    )

    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        self.state = State.IDLE
        self.calls = 0  # answered
        self._reader: MessageReader | None = None  # (made when first needed: _requests)
        self._idle_since = now  # the last call answered (IDLE)
        self._deadline = 0.0  # when the call under way must be whole (RECEIVING)
        self._ended = False  # the client ended its side (what it sent is still answered)
        # A chunk that came alone while a call was answered, with nothing kept before it:
        # handed out as whole bytes if it holds exactly the next call.
        self._kept_whole: bytes | None = None

    # -- what arrives ----------------------------------------------------------------------

    @property
    def _requests(self) -> MessageReader:
        reader = self._reader
        if reader is None:
            limits = self.limits
            reader = self._reader = MessageReader(limits.transport, limits.max_request_bytes)
        return reader

    @property
    def buffered(self) -> int:
        """Bytes received and not handed out yet (a call under way, or kept for later)."""
        return self._reader.buffered if self._reader is not None else 0

    def whole_chunk_welcome(self) -> bool:
        """Whether bytes arriving now may be tried as one whole call before they are
        scanned (:attr:`Call.whole`): the machine is ``IDLE`` (so nothing is buffered)."""
        return self.state is State.IDLE

    def answered_whole(self, now: float) -> None:
        """A chunk offered whole (:meth:`whole_chunk_welcome`) was one call, answered at
        once: the connection stays idle, its clock restarted."""
        assert self.state is State.IDLE
        self.calls += 1
        self._idle_since = now

    def answering_whole(self) -> None:
        """A chunk offered whole (:meth:`whole_chunk_welcome`) was one call, being answered
        (forwarded as it arrived): ``ANSWERING`` until :meth:`answered`."""
        assert self.state is State.IDLE
        self.state = State.ANSWERING

    def received(self, data: bytes, now: float, *, tried: bool = False) -> Decision | None:
        """``data`` arrived (``tried``: offered whole and declined). A call is whole: the
        :class:`Call` to answer; bad input: :class:`Refuse`; else ``None`` (more is
        needed, or a call is being answered and ``data`` waits for it)."""
        if self.state is State.CLOSED or not data:
            return None
        alone = self.state is State.IDLE
        requests = self._requests
        if alone:
            self._deadline = now + self.limits.message_timeout  # (the call's first byte)
            self.state = State.RECEIVING
        if self.state is State.ANSWERING:
            self._kept_whole = data if not requests.buffered else None
            requests.feed(data)
            return None
        requests.feed(data)
        decision = self._next()
        if isinstance(decision, Call) and alone and not requests.buffered:
            # (Nothing before it, nothing after it: the chunk was this call, frame and all.)
            return Call(decision.message, None if tried else data, tried)
        return decision

    @property
    def header(self) -> MessageHeader | None:
        """The header of the call under way, once it could be read."""
        return self._reader.header if self._reader is not None else None

    @property
    def full(self) -> bool:
        """Whether the connection should stop reading for now: a call is being answered and
        what is kept for after it reached a request's size, or 1 MiB if that is less (a
        client that pipelines without end is not read into memory). Read again once
        :meth:`answered`."""
        return self.state is State.ANSWERING and self.buffered >= self.limits.keep_at_most

    def ended(self) -> Close | None:
        """The client ended its side: close now, unless a call is being answered (then at
        :meth:`answered`, once that call's reply is out)."""
        if self.state is State.IDLE:  # (the usual end: nothing of a call received)
            self.state = State.CLOSED
            return ENDED
        self._ended = True
        if self.state is State.ANSWERING or self.state is State.CLOSED:
            return None
        return self._end_of_input()

    def _end_of_input(self) -> Close:
        self.state = State.CLOSED
        if self.buffered:
            return Close(
                "ended_mid_call",
                f"connection closed in the middle of a request ({self.buffered} bytes received)",
            )
        return ENDED

    # -- what the protocol did -------------------------------------------------------------

    def answered(self, now: float) -> Decision | None:
        """The call being answered was answered: the next call if one is kept (a client
        that pipelines), or the end if the client ended its side; else ``None``."""
        if self.state is not State.ANSWERING:
            return None
        self.calls += 1
        self._idle_since = now
        self.state = State.IDLE
        kept, self._kept_whole = self._kept_whole, None
        if self.buffered:
            # (What came meanwhile is the start of the next call: its clock starts now, as
            # it would have had the call been answered before it was sent.)
            self.state = State.RECEIVING
            self._deadline = now + self.limits.message_timeout
            decision = self._next()
            if isinstance(decision, Call) and kept is not None and not self.buffered:
                return Call(decision.message, kept)  # (it came alone: the chunk was it)
            if decision is not None or not self._ended:
                return decision
        if self._ended:
            return self._end_of_input()
        return None

    def close(self) -> None:
        """The proxy closes the connection (a stop, a bug, the client gone)."""
        self.state = State.CLOSED

    # -- the clocks ------------------------------------------------------------------------

    def due(self) -> float | None:
        """When :meth:`tick` next has something to say (``None``: no clock runs)."""
        if self.state is State.RECEIVING:
            return self._deadline
        idle = self.limits.idle_timeout
        if self.state is State.IDLE and idle is not None:
            return self._idle_since + idle
        return None

    def tick(self, now: float) -> Close | None:
        """The clocks at ``now``: a call not whole by its deadline, or a connection idle for
        the idle timeout, is closed."""
        due = self.due()
        if due is None or now < due:
            return None
        if self.state is State.RECEIVING:
            self.state = State.CLOSED
            return Close(
                "timeout",
                f"request incomplete after {self.limits.message_timeout:g} s "
                f"({self.buffered} bytes received)",
            )
        self.state = State.CLOSED
        return Close("idle", f"idle for {self.limits.idle_timeout:g} s")

    # -- inside ----------------------------------------------------------------------------

    def _next(self) -> Call | Refuse | None:
        """The next whole call buffered (``RECEIVING`` then), if there is one."""
        requests = self._requests
        try:
            message = requests.next_message()
        except ProtocolError as exc:
            self.state = State.CLOSED
            reason = "too_large" if isinstance(exc, MessageTooLarge) else "protocol"
            return Refuse(reason, str(exc), requests.header)
        if message is None:
            return None
        header = message.header
        if header.type not in (MessageType.CALL, MessageType.ONEWAY):
            self.state = State.CLOSED
            return Refuse("bad_message_type", f"message type {header.type} is not a call", header)
        self.state = State.ANSWERING
        return Call(message)
