"""Thrift's binary protocol, as far as a proxy needs it.

Three things live here, all pure functions over bytes:

* message headers: parse (strict and old non-strict form) and encode (always strict, which
  is what every HMS server since Hive 0.x writes and what it requires on read);
* :class:`StructScanner`, which finds where a struct ends in a stream of bytes that arrives
  in pieces, in one pass, without decoding anything;
* encoding of ``TApplicationException`` messages, the one reply the proxy writes itself.

The compact protocol, if it is ever needed, gets a sibling module with the same three parts.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Final, NamedTuple, Protocol

from proxy.wire.errors import LimitExceeded, ProtocolError


class TType(IntEnum):
    STOP = 0
    VOID = 1
    BOOL = 2
    BYTE = 3
    DOUBLE = 4
    I16 = 6
    I32 = 8
    I64 = 10
    STRING = 11
    STRUCT = 12
    MAP = 13
    SET = 14
    LIST = 15
    UUID = 16


class MessageType(IntEnum):
    CALL = 1
    REPLY = 2
    EXCEPTION = 3
    ONEWAY = 4


class AppErrorType(IntEnum):
    """``TApplicationException.type`` codes, as every Thrift language binding numbers them."""

    UNKNOWN = 0
    UNKNOWN_METHOD = 1
    INVALID_MESSAGE_TYPE = 2
    WRONG_METHOD_NAME = 3
    BAD_SEQUENCE_ID = 4
    MISSING_RESULT = 5
    INTERNAL_ERROR = 6
    PROTOCOL_ERROR = 7


VERSION_1: Final = 0x80010000
VERSION_MASK: Final = 0xFFFF0000
TYPE_MASK: Final = 0x000000FF

# Longest method name accepted in a header. HMS names are under 60 bytes; the limit only has
# to stop a garbage length from looking like a name.
MAX_NAME_LENGTH: Final = 1024

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_unpack_i32 = _I32.unpack_from

# Bytes a value of each fixed-size type occupies.
FIXED_SIZE: Final[dict[int, int]] = {
    TType.BOOL: 1,
    TType.BYTE: 1,
    TType.DOUBLE: 8,
    TType.I16: 2,
    TType.I32: 4,
    TType.I64: 8,
    TType.UUID: 16,
}
# Smallest encoding of one value of each type, used to reject absurd container sizes before
# any of their bytes arrive.
MIN_SIZE: Final[dict[int, int]] = {
    **FIXED_SIZE,
    TType.STRING: 4,
    TType.STRUCT: 1,
    TType.MAP: 6,
    TType.SET: 5,
    TType.LIST: 5,
}
_VALUE_TYPES: Final = frozenset(MIN_SIZE)


class MessageHeader(NamedTuple):
    """A message's header (a named tuple: made for every request, and a frozen dataclass
    costs several times as much to build)."""

    name: str
    type: int
    seqid: int
    strict: bool
    length: int  # bytes the header occupies; the struct body starts right after it


def py_parse_header(
    buf: bytes | bytearray | memoryview, start: int, end: int
) -> MessageHeader | None:
    """Parse a message header at ``buf[start:end]``; ``None`` if more bytes are needed
    (:data:`parse_header`: its C twin where it is built)."""
    if end - start < 4:
        return None
    first = _unpack_i32(buf, start)[0]
    if first < 0:
        if (first & 0xFFFFFFFF) & VERSION_MASK != VERSION_1:
            raise ProtocolError(f"bad protocol version 0x{first & 0xFFFFFFFF:08x}")
        mtype = first & TYPE_MASK
        name_start = start + 8
        if end < name_start:
            return None
        name_len = _unpack_i32(buf, start + 4)[0]
        _check_name_length(name_len)
        seq_at = name_start + name_len
        if end < seq_at + 4:
            return None
        name = _decode_name(buf, name_start, seq_at)
        return MessageHeader(name, mtype, _unpack_i32(buf, seq_at)[0], True, seq_at + 4 - start)
    # Old clients (TBinaryProtocol with strictWrite off) start with the name's length.
    _check_name_length(first)
    name_start = start + 4
    type_at = name_start + first
    if end < type_at + 5:
        return None
    name = _decode_name(buf, name_start, type_at)
    seqid = _unpack_i32(buf, type_at + 1)[0]
    return MessageHeader(name, buf[type_at], seqid, False, type_at + 5 - start)


def _check_name_length(length: int) -> None:
    if not 0 < length <= MAX_NAME_LENGTH:
        raise ProtocolError(f"implausible method name length {length}")


def _decode_name(buf: bytes | bytearray | memoryview, start: int, end: int) -> str:
    try:
        return bytes(buf[start:end]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("method name is not UTF-8") from exc


# A call is told apart by its bytes only up to this size (see framing.call_without_seqid):
# enough for an engine's get_partitions_by_names: Trino's batches of up to 100 names a few
# levels deep are 3-8 KB, Spark's of 300 (its fallback, hms-wire) up to ~50 bytes a name.
# At 4 KiB each repeat of such a request was looked up: ~90 us more of the proxy's time in
# process (bench.repeat_size, docs/benchmarks.md). The C twin (_scanner.c) has the same.
REPEAT_BYTES: Final = 16384


def seqid_offset(data: bytes, start: int) -> int | None:
    """Where the seqid is in the strict CALL message at ``data[start:]``, for calls of at
    most :data:`REPEAT_BYTES`. ``None``: not a small strict call. Nothing is checked beyond
    the header: the caller knows these bytes (or not) as a message seen whole."""
    end = len(data)
    if end - start > REPEAT_BYTES or end - start < 12:
        return None
    if data[start] != 0x80 or data[start + 1] != 0x01 or data[start + 3] != MessageType.CALL:
        return None
    at: int = start + 8 + _unpack_i32(data, start + 4)[0]
    if not start + 8 < at <= end - 4:
        return None
    return at


def encode_header(name: str, mtype: int, seqid: int) -> bytes:
    """A strict header, the form every HMS accepts."""
    raw = name.encode("utf-8")
    return b"".join((_U32.pack(VERSION_1 | mtype), _I32.pack(len(raw)), raw, _I32.pack(seqid)))


def with_seqid(message: bytes, header: MessageHeader, seqid: int) -> bytes:
    """``message`` with its seqid replaced; everything else byte for byte the same."""
    at = header.length - 4
    return b"".join((message[:at], _I32.pack(seqid), message[header.length :]))


def reseq(message: bytes | memoryview, seqid: int) -> tuple[bytes, int, int]:
    """(header with ``seqid`` in place of its own, where the body starts, message type) of a
    whole message this proxy holds: a cache hit's, on every hit, so a strict header (what
    every HMS writes) is read in place, without decoding its name."""
    if message[0] == 0x80 and len(message) >= 12:
        at = 12 + _unpack_i32(message, 4)[0]
        if 12 < at <= len(message):
            return bytes(message[: at - 4]) + _I32.pack(seqid), at, message[3]
    header = parse_header(message, 0, len(message))
    if header is None:
        raise ProtocolError("not a whole message")
    return with_seqid(bytes(message[: header.length]), header, seqid), header.length, header.type


def encode_application_exception(name: str, seqid: int, kind: AppErrorType, text: str) -> bytes:
    """An EXCEPTION message carrying ``TApplicationException{1: message, 2: type}``."""
    raw = text.encode("utf-8")
    body = b"".join(
        (
            bytes((TType.STRING,)),
            b"\x00\x01",
            _I32.pack(len(raw)),
            raw,
            bytes((TType.I32,)),
            b"\x00\x02",
            _I32.pack(int(kind)),
            b"\x00",
        )
    )
    return encode_header(name, MessageType.EXCEPTION, seqid) + body


# Frame kinds on the scanner's stack.
_IN_STRUCT: Final = 0
_IN_SEQUENCE: Final = 1  # list or set: [kind, remaining, element type, unused]
_IN_MAP: Final = 2  # [kind, remaining keys+values, key type, value type]
_NOTHING_PENDING: Final = -1


class PyStructScanner:
    """Finds the end of one binary-encoded struct in bytes that arrive in pieces.

    Call :meth:`scan` after each piece with the buffer so far; it resumes where it stopped,
    so every byte is examined at most once however the message is cut (a 10 MB reply of
    10,000 partitions arriving in 64 KB pieces costs one pass, not 160). Nothing is decoded:
    strings and fixed-size values are skipped by arithmetic, and lists of fixed-size values
    in one step. Positions are absolute offsets into the caller's buffer; :meth:`rebase`
    follows the caller when it drops bytes from the front.

    Hostile input is rejected as soon as it is visible: unknown type codes, negative sizes,
    declared lengths that would pass ``limit``, and nesting deeper than ``max_depth``.
    """

    __slots__ = ("_pending", "_stack", "limit", "max_depth", "pos")

    def __init__(self, pos: int, limit: int, max_depth: int = 64) -> None:
        self.pos = pos
        self.limit = limit
        self.max_depth = max_depth
        self._stack: list[list[int]] = [[_IN_STRUCT, 0, 0, 0]]
        self._pending = _NOTHING_PENDING

    @property
    def done(self) -> bool:
        return not self._stack

    def rebase(self, dropped: int) -> None:
        """The caller removed ``dropped`` bytes from the front of its buffer."""
        self.pos -= dropped
        self.limit -= dropped

    def scan(self, buf: bytes | bytearray, end: int) -> bool:
        """Advance over ``buf[:end]``; ``True`` once the struct is complete (``pos`` is its end)."""
        stack = self._stack
        if not stack:
            return True
        pos = self.pos
        limit = self.limit
        pending = self._pending
        unpack = _unpack_i32
        fixed = FIXED_SIZE
        frame = stack[-1]
        try:
            while True:
                if pending < 0:
                    kind = frame[0]
                    if kind == _IN_STRUCT:
                        if pos >= end:
                            return False
                        ftype = buf[pos]
                        if ftype == 0:
                            pos += 1
                            stack.pop()
                            if not stack:
                                return True
                            frame = stack[-1]
                            continue
                        if pos + 3 > end:
                            return False
                        pos += 3
                        pending = ftype
                    else:
                        remaining = frame[1]
                        if remaining == 0:
                            stack.pop()
                            frame = stack[-1]
                            continue
                        frame[1] = remaining - 1
                        if kind == _IN_SEQUENCE or remaining % 2 == 0:
                            pending = frame[2]
                        else:
                            pending = frame[3]
                # Consume one value of type ``pending``.
                if pending == TType.STRING:
                    if pos + 4 > end:
                        return False
                    size = unpack(buf, pos)[0]
                    if size < 0:
                        raise ProtocolError(f"negative string length {size}")
                    pos += 4 + size
                    if pos > limit:
                        raise LimitExceeded("string runs past the message size limit")
                elif pending == TType.STRUCT:
                    if len(stack) >= self.max_depth:
                        raise ProtocolError(f"structs nested deeper than {self.max_depth}")
                    frame = [_IN_STRUCT, 0, 0, 0]
                    stack.append(frame)
                elif pending == TType.LIST or pending == TType.SET:
                    if pos + 5 > end:
                        return False
                    etype = buf[pos]
                    size = unpack(buf, pos + 1)[0]
                    pos += 5
                    pos = self._open_container(stack, pos, size, etype, 0, _IN_SEQUENCE)
                    frame = stack[-1]
                elif pending == TType.MAP:
                    if pos + 6 > end:
                        return False
                    ktype = buf[pos]
                    vtype = buf[pos + 1]
                    size = unpack(buf, pos + 2)[0]
                    pos += 6
                    pos = self._open_container(stack, pos, size, ktype, vtype, _IN_MAP)
                    frame = stack[-1]
                else:
                    width = fixed.get(pending)
                    if width is None:
                        raise ProtocolError(f"unknown field type {pending}")
                    pos += width
                    if pos > limit:
                        raise LimitExceeded("value runs past the message size limit")
                pending = _NOTHING_PENDING
        finally:
            self.pos = pos
            self._pending = pending

    def _open_container(
        self, stack: list[list[int]], pos: int, size: int, t1: int, t2: int, kind: int
    ) -> int:
        """Push a list/set/map frame, or skip it whole when its items have a fixed size."""
        if size < 0:
            raise ProtocolError(f"negative container size {size}")
        if t1 not in _VALUE_TYPES or (kind == _IN_MAP and t2 not in _VALUE_TYPES):
            if size == 0:
                return pos  # Java writes a zero type for the element of some empty containers
            raise ProtocolError(f"unknown element type {t1 if t1 not in _VALUE_TYPES else t2}")
        item = MIN_SIZE[t1] + (MIN_SIZE[t2] if kind == _IN_MAP else 0)
        if pos + size * item > self.limit:
            raise LimitExceeded(f"container of {size} items cannot fit the message size limit")
        if size == 0:
            return pos
        w1 = FIXED_SIZE.get(t1)
        w2 = FIXED_SIZE.get(t2) if kind == _IN_MAP else 0
        if w1 is not None and w2 is not None:
            return pos + size * (w1 + w2)
        if len(stack) >= self.max_depth:
            raise ProtocolError(f"containers nested deeper than {self.max_depth}")
        stack.append([kind, size * 2 if kind == _IN_MAP else size, t1, t2])
        return pos


class Scanner(Protocol):
    """What both scanners offer (see :class:`PyStructScanner`)."""

    pos: int
    limit: int

    def __init__(self, pos: int, limit: int, max_depth: int = 64) -> None: ...

    @property
    def done(self) -> bool: ...

    def scan(self, buf: bytes | bytearray, end: int) -> bool: ...

    def rebase(self, dropped: int) -> None: ...


parse_header: Callable[[bytes | bytearray | memoryview, int, int], MessageHeader | None]
try:  # The C twins are ~100x faster; the Python ones stay as reference and fallback.
    from proxy.wire._scanner import StructScanner as _CStructScanner
    from proxy.wire._scanner import configure_header
    from proxy.wire._scanner import parse_header as _c_parse_header
except ImportError:  # pragma: no cover - only where the extension could not be built
    StructScanner: type[Scanner] = PyStructScanner
    parse_header = py_parse_header
    ACCELERATED = False
else:
    configure_header(MessageHeader)
    StructScanner = _CStructScanner
    parse_header = _c_parse_header
    ACCELERATED = True
