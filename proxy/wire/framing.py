"""Message boundaries on a Thrift byte stream, for both transports (sans-I/O).

Thrift has two ways to put messages on a socket. *Framed* prefixes each message with its
length. *Buffered* (Hive's default, what Trino, Presto and Spark speak) sends the bare
message, so the only way to find its end is to walk the struct inside it; that is the
scanner's job, and it is done once per byte however the message is cut into reads.

:class:`MessageReader` is fed bytes and hands out either whole messages (requests, and replies
the proxy keeps, and every reply since issue 42: one is sent only once whole, so that one
too big for a client is answered with an error) or the bytes of the message in progress as
they arrive, dropping them once taken (a bridged reply rewritten as it comes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from proxy.wire import binary
from proxy.wire.binary import MessageHeader, Scanner, StructScanner, parse_header
from proxy.wire.errors import LimitExceeded, MessageTooLarge, ProtocolError

_FRAME = struct.Struct(">i")


class Transport(StrEnum):
    BUFFERED = "buffered"
    FRAMED = "framed"

    def frame(self, message: bytes) -> bytes:
        """``message`` as it goes on the wire with this transport."""
        if self is Transport.FRAMED:
            return _FRAME.pack(len(message)) + message
        return message

    def prefix(self, length: int) -> bytes:
        """What precedes a message of ``length`` bytes on the wire."""
        return _FRAME.pack(length) if self is Transport.FRAMED else b""


class Message(NamedTuple):
    """One message (a named tuple: made for every request, and a frozen dataclass costs
    several times as much to build)."""

    header: MessageHeader
    data: bytes  # header and struct exactly as received, without any frame prefix

    @property
    def body(self) -> bytes:
        """The struct after the header: call arguments, or a result."""
        return self.data[self.header.length :]


@dataclass(frozen=True, slots=True)
class Piece:
    """Part of a message being streamed; see :meth:`MessageReader.take`."""

    header: MessageHeader
    data: bytes
    last: bool
    message: Message | None  # the whole message, on the last piece in ``keep`` mode


def whole_message(data: bytes, transport: Transport, max_size: int) -> Message | None:
    """The one complete message ``data`` holds, if it holds exactly one and nothing more
    (what a client waiting for each reply sends in one piece); ``None`` otherwise, bad bytes
    included: a :class:`MessageReader` then takes ``data`` the ordinary way and says why."""
    framed = transport is Transport.FRAMED
    header = whole_header(data, framed, max_size)
    return None if header is None else Message(header, data[4:] if framed else data)


def py_whole_header(data: bytes, framed: bool, max_size: int) -> MessageHeader | None:
    """The header of the one complete message ``data`` holds (see :func:`whole_message`;
    ``framed``: on the framed transport), ``None`` if it does not hold exactly one:
    :data:`whole_header`'s Python twin."""
    start = 4 if framed else 0
    end = len(data)
    if end - start > max_size:
        return None
    if framed and (end < 4 or _FRAME.unpack_from(data, 0)[0] != end - 4):
        return None
    try:
        header = binary.py_parse_header(data, start, end)
        if header is None:
            return None
        scanner = binary.PyStructScanner(start + header.length, end)
        if not scanner.scan(data, end) or scanner.pos != end:
            return None
    except (ProtocolError, LimitExceeded):
        return None
    return header


def call_without_seqid(data: bytes, transport: Transport) -> tuple[bytes, int] | None:
    """(the message's bytes without its seqid, the seqid) if ``data`` is one small strict
    call on ``transport`` (see :func:`binary.seqid_offset`): what a client repeating a call
    sends again but for the seqid. A framed one must fill its frame exactly. ``None``: not
    such a call."""
    return without_seqid(data, transport is Transport.FRAMED)


def py_without_seqid(data: bytes, framed: bool) -> tuple[bytes, int] | None:
    """:data:`without_seqid`'s Python twin (see :func:`call_without_seqid`)."""
    start = _call_start(data, framed)
    at = None if start is None else binary.seqid_offset(data, start)
    if start is None or at is None:
        return None
    return data[start:at] + data[at + 4 :], _FRAME.unpack_from(data, at)[0]


def seqid_offset(data: bytes, transport: Transport) -> int | None:
    """Where the seqid is in ``data``, if it is one small strict call on ``transport`` (as
    :func:`call_without_seqid` knows it)."""
    start = _call_start(data, transport is Transport.FRAMED)
    return None if start is None else binary.seqid_offset(data, start)


def _call_start(data: bytes, framed: bool) -> int | None:
    if framed:
        if len(data) < 4 or _FRAME.unpack_from(data, 0)[0] != len(data) - 4:
            return None
        return 4
    return 0


whole_header: Callable[[bytes, bool, int], MessageHeader | None] = py_whole_header
without_seqid: Callable[[bytes, bool], tuple[bytes, int] | None] = py_without_seqid
if binary.ACCELERATED:  # the C twins (see _scanner.c): a request's first steps, one call each
    from proxy.wire._scanner import whole_header as _c_whole_header
    from proxy.wire._scanner import without_seqid as _c_without_seqid

    whole_header, without_seqid = _c_whole_header, _c_without_seqid


class MessageReader:
    """Splits bytes from one peer into messages.

    :meth:`next_message` returns each complete message (several may arrive in one read when
    a client pipelines). :meth:`take` serves streaming instead: it hands out the bytes of the
    message in progress as they arrive; with ``keep=False`` it forgets them once handed out.
    Either way ``max_size`` bounds what one message may claim, enforced as soon as a declared
    length shows it is exceeded.
    """

    def __init__(self, transport: Transport, max_size: int, *, keep: bool = True) -> None:
        self.transport = transport
        self.max_size = max_size
        self.keep = keep
        self._buf = bytearray()
        self._reset()

    def _reset(self) -> None:
        self.header: MessageHeader | None = None
        self._start = 4 if self.transport is Transport.FRAMED else 0  # payload offset
        self._frame_end: int | None = None
        self._scanner: Scanner | None = None
        self._end: int | None = None  # payload end, once the scanner has found it
        self._taken = self._start

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned: non-zero means a message is under way."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def _advance(self) -> bool:
        """Make progress on the current message; ``True`` once its end is known."""
        if self._end is not None:
            return True
        buf = self._buf
        if self.transport is Transport.FRAMED and self._frame_end is None:
            if len(buf) < 4:
                return False
            length = _FRAME.unpack_from(buf, 0)[0]
            if length <= 0:
                raise ProtocolError(f"bad frame length {length}")
            if length > self.max_size:
                raise MessageTooLarge(f"frame of {length} bytes exceeds {self.max_size}")
            self._frame_end = 4 + length
        limit = self._frame_end if self._frame_end is not None else self._start + self.max_size
        if self.header is None:
            header = parse_header(buf, self._start, min(len(buf), limit))
            if header is None:
                if len(buf) - self._start > self.max_size:
                    raise MessageTooLarge(f"message exceeds {self.max_size} bytes")
                return False
            self.header = header
            self._scanner = StructScanner(self._start + header.length, limit)
        scanner = self._scanner
        assert scanner is not None
        limit = scanner.limit  # rebased with the scanner when streamed bytes are dropped
        try:
            finished = scanner.scan(buf, min(len(buf), limit))
        except LimitExceeded as exc:
            if self._frame_end is not None:
                raise ProtocolError(f"struct runs past the end of its frame ({exc})") from exc
            raise MessageTooLarge(f"message exceeds {self.max_size} bytes ({exc})") from exc
        if not finished:
            if self._frame_end is not None and len(buf) >= self._frame_end:
                raise ProtocolError("struct runs past the end of its frame")
            if len(buf) >= limit:
                # Every byte up to the limit was scanned and the struct goes on (a token
                # ended exactly on the limit, so no declared length gave it away).
                raise MessageTooLarge(f"message exceeds {self.max_size} bytes")
            return False
        end = scanner.pos
        if self._frame_end is not None and end != self._frame_end:
            raise ProtocolError("frame carries bytes after its message")
        self._end = end
        return True

    def complete(self) -> bool:
        """Whether the message under way has arrived whole (then :attr:`header` is its
        header, and :meth:`take` hands it out in one piece); raises ProtocolError as
        :meth:`take` would."""
        return self._advance()

    def next_message(self) -> Message | None:
        """The next complete message, or ``None`` until more bytes arrive (``keep`` mode)."""
        assert self.keep, "next_message() needs keep=True"
        if not self._advance():
            return None
        assert self.header is not None and self._end is not None
        with memoryview(self._buf) as view:
            message = Message(self.header, bytes(view[self._start : self._end]))
        del self._buf[: self._end]
        self._reset()
        return message

    def take(self) -> Piece | None:
        """Bytes of the message in progress that arrived since the last call.

        ``None`` until the header is parsed, so a caller can check the header before it
        forwards anything. A piece never reaches past the message's end; the one that ends
        it has ``last`` set, carries the whole :class:`Message` in ``keep`` mode, and leaves
        the reader ready for the next message. In streaming mode (``keep=False``) the bytes
        are dropped from memory once taken.
        """
        self._advance()
        header = self.header
        if header is None:
            return None
        stop = len(self._buf) if self._end is None else self._end
        if self._frame_end is not None:
            stop = min(stop, self._frame_end)
        with memoryview(self._buf) as view:
            data = bytes(view[self._taken : stop])  # one copy (a bytearray slice makes two)
        self._taken = stop
        if self._end is not None:
            message = None
            if self.keep:
                with memoryview(self._buf) as view:
                    message = Message(header, bytes(view[self._start : self._end]))
            del self._buf[: self._end]
            self._reset()
            return Piece(header, data, True, message)
        if not self.keep:
            # Drop what was handed out, except bytes of a token the scanner has not finished
            # reading yet (say, the first half of a string's length).
            assert self._scanner is not None
            dropped = min(stop, self._scanner.pos) - self._start
            if dropped > 0:
                del self._buf[self._start : self._start + dropped]
                self._scanner.rebase(dropped)
                self._taken -= dropped
                if self._frame_end is not None:
                    self._frame_end -= dropped
        return Piece(header, data, False, None)
