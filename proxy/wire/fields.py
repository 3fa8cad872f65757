"""Byte spans of the fields of a binary-encoded struct (sans-I/O).

Used to compute keys over "all arguments but one", to rewrite one field of a request without
decoding and re-encoding the rest (so fields this proxy's IDL does not know survive
untouched), and to move a reply's fields (the bridge). Only the top level is walked here;
struct values are skipped by the message scanner.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from proxy.wire import binary
from proxy.wire.binary import FIXED_SIZE, StructScanner, TType
from proxy.wire.errors import ProtocolError

_I32 = struct.Struct(">i")
_FIELD = struct.Struct(">bh")


@dataclass(frozen=True, slots=True)
class FieldSpan:
    fid: int
    ttype: int
    start: int  # the field header
    value: int  # the value, after the 3-byte header
    end: int


def skip_value(buf: bytes, pos: int, ttype: int, depth: int = 0) -> int:
    """The offset just past one value of ``ttype`` at ``pos``."""
    if depth > 64:
        raise ProtocolError("nested too deeply")
    width = FIXED_SIZE.get(ttype)
    if width is not None:
        end = pos + width
    elif ttype == TType.STRING:
        (size,) = _I32.unpack_from(buf, pos)
        if size < 0:
            raise ProtocolError("negative string length")
        end = pos + 4 + size
    elif ttype == TType.STRUCT:
        end = _skip_struct(buf, pos, depth + 1)
    elif ttype in (TType.LIST, TType.SET):
        etype = buf[pos]
        (count,) = _I32.unpack_from(buf, pos + 1)
        if count < 0:  # (as the message scanner and the HMS's own decoder refuse it)
            raise ProtocolError(f"negative container size {count}")
        end = pos + 5
        if etype == TType.STRING:  # (names of partitions, hundreds of them: no call each)
            end = skip_strings(buf, end, count, len(buf))
        else:
            for _ in range(count):
                end = skip_value(buf, end, etype, depth + 1)
    elif ttype == TType.MAP:
        ktype, vtype = buf[pos], buf[pos + 1]
        (count,) = _I32.unpack_from(buf, pos + 2)
        if count < 0:
            raise ProtocolError(f"negative container size {count}")
        end = pos + 6
        for _ in range(count):
            end = skip_value(buf, end, ktype, depth + 1)
            end = skip_value(buf, end, vtype, depth + 1)
    else:
        raise ProtocolError(f"unknown type {ttype}")
    if end > len(buf):
        raise ProtocolError("value runs past the end of the buffer")
    return end


def py_skip_strings(buf: bytes, pos: int, count: int, limit: int) -> int:
    """The end of ``count`` binary strings from ``pos``, none past ``limit``."""
    return _walk_strings(buf, pos, count, limit, None)


def py_read_strings(buf: bytes, pos: int, count: int, limit: int) -> list[bytes]:
    """``count`` binary strings from ``pos``, none past ``limit``, as bytes."""
    out: list[bytes] = []
    _walk_strings(buf, pos, count, limit, out)
    return out


def _walk_strings(buf: bytes, pos: int, count: int, limit: int, out: list[bytes] | None) -> int:
    # (The C twin's checks, in its order: its callers pass bytes and 32-bit counts.)
    limit = min(limit, len(buf))
    if pos < 0 or pos > limit:
        raise ProtocolError("a string list starts past its end")
    if count < 0:
        raise ProtocolError(f"negative container size {count}")
    unpack = _I32.unpack_from
    for _ in range(count):
        if pos + 4 > limit:
            raise ProtocolError("a string runs past its end")
        (size,) = unpack(buf, pos)
        if size < 0 or pos + 4 + size > limit:
            raise ProtocolError("a string runs past its end")
        if out is not None:
            out.append(buf[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return pos


read_strings: Callable[[bytes, int, int, int], list[bytes]] = py_read_strings
skip_strings: Callable[[bytes, int, int, int], int] = py_skip_strings
try:  # C twins (see _scanner.c): a hundred partition names, no Python call each
    from proxy.wire import _scanner
except ImportError:  # pragma: no cover - only where the extension could not be built
    pass
else:
    read_strings, skip_strings = _scanner.read_strings, _scanner.skip_strings


def only_field(buf: bytes, fid: int) -> tuple[int, int, int] | None:
    """(start, value, end) of the top-level field ``fid`` of the struct that is the whole of
    ``buf``, if it is there exactly once; ``None`` if it is not, or twice (as a field sent
    twice is read differently by different decoders). One walk, no spans kept."""
    found = None
    pos, limit = 0, len(buf)
    while True:
        if pos >= limit:
            raise ProtocolError("struct has no end")
        ttype = buf[pos]
        if ttype == TType.STOP:
            if pos + 1 != limit:
                raise ProtocolError("bytes after the struct's end")
            return found
        end = skip_value(buf, pos + 3, ttype)
        if _FIELD.unpack_from(buf, pos)[1] == fid:
            if found is not None:
                return None
            found = (pos, pos + 3, end)
        pos = end


def without_strings(buf: bytes, span: tuple[int, int, int]) -> tuple[bytes, list[bytes]] | None:
    """``buf`` without the field at ``span`` (its start, value and end, as :func:`only_field`
    gives them) and the strings it holds, if it is a list of strings (a set is skipped by
    the decoders); ``None`` if not. Raises as :func:`read_strings` does."""
    start, value, end = span
    if buf[start] != TType.LIST or buf[value] != TType.STRING:
        return None
    (count,) = _I32.unpack_from(buf, value + 1)
    return buf[:start] + buf[end:], read_strings(buf, value + 5, count, end)


def py_names_list(buf: bytes, fid: int) -> tuple[bytes, list[bytes]] | None:
    """``buf`` without its top-level field ``fid`` and that field's strings, if ``buf`` is
    one whole struct holding the field exactly once (see :func:`only_field`) as a list of
    strings; ``None`` if not, bad bytes included. The reference for its C twin (in
    ``_scanner.c``), which :func:`names_list` is where it is built."""
    try:
        found = only_field(buf, fid)
        return None if found is None else without_strings(buf, found)
    except (ProtocolError, struct.error, IndexError):
        return None


names_list: Callable[[bytes, int], tuple[bytes, list[bytes]] | None] = py_names_list
if binary.ACCELERATED:  # (the C twin: the walk, the copy and the names in one call)
    from proxy.wire._scanner import names_list as _c_names_list

    names_list = _c_names_list


def field_spans(buf: bytes, start: int = 0, depth: int = 0) -> tuple[list[FieldSpan], int]:
    """The fields of the struct at ``start``, and the offset just past its STOP byte."""
    if depth > 64:
        raise ProtocolError("nested too deeply")
    spans: list[FieldSpan] = []
    pos = start
    while True:
        if pos >= len(buf):
            raise ProtocolError("struct has no end")
        ttype = buf[pos]
        if ttype == TType.STOP:
            return spans, pos + 1
        _, fid = _FIELD.unpack_from(buf, pos)
        end = skip_value(buf, pos + 3, ttype, depth)
        spans.append(FieldSpan(fid, ttype, pos, pos + 3, end))
        pos = end


def _skip_struct(buf: bytes, pos: int, depth: int) -> int:
    """The end of a struct value, found by the message scanner (in C where it is built: a
    nested ``Table`` has hundreds of fields, which this module would walk one by one)."""
    scanner = StructScanner(pos, len(buf), max(1, 65 - depth))
    if not scanner.scan(buf, len(buf)):
        raise ProtocolError("value runs past the end of the buffer")
    return scanner.pos


def struct_end(buf: bytes, start: int, depth: int = 0) -> int:
    return field_spans(buf, start, depth)[1]


def find(spans: list[FieldSpan], fid: int) -> FieldSpan | None:
    return next((s for s in spans if s.fid == fid), None)


def encode_string_list_field(fid: int, items: list[str]) -> bytes:
    """A ``list<string>`` field (header, element type, count, items)."""
    out = [_FIELD.pack(TType.LIST, fid), bytes((TType.STRING,)), _I32.pack(len(items))]
    for item in items:
        raw = item.encode("utf-8")
        out.append(_I32.pack(len(raw)))
        out.append(raw)
    return b"".join(out)
