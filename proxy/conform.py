"""Check that a struct's bytes say what the IDL says, before thriftpy2 decodes them.

thriftpy2's decoder trusts the IDL over the wire: a map whose wire key type is STRING is
read as the IDL's key type, a value of a type it does not know (VOID, Thrift 0.19's UUID) is
"skipped" as zero bytes, and lengths read from bytes it has thereby misplaced are believed
(a 4 GB allocation for a 68-byte request, a 2**31-element loop, and reads past the end of
the buffer, which its memory transport does not refuse). None of that can happen to bytes
that pass :func:`check`: every value has a type the decoder knows, every container's element
types are the ones the IDL declares where the IDL declares them, and every length fits in
the bytes that are there. A struct that fails is not decoded: the proxy then does not cache
the call (reads) or invalidates everything (writes), and forwards it unchanged.

The walk is pure Python over ``bytes``; engines repeat calls byte for byte and plans are
memoised on the bytes, so it runs once per distinct request.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from proxy.wire.binary import FIXED_SIZE, MIN_SIZE, TType
from proxy.wire.errors import ProtocolError

# Wire types as the scanner knows them, less the one the decoder does not (UUID, which it
# "skips" as zero bytes).
_FIXED: Final[dict[int, int]] = {int(t): n for t, n in FIXED_SIZE.items() if t != TType.UUID}
_MIN_SIZE: Final[dict[int, int]] = {int(t): n for t, n in MIN_SIZE.items() if t != TType.UUID}
_KNOWN: Final = frozenset(_MIN_SIZE)
_STRING: Final = int(TType.STRING)
_STRUCT: Final = int(TType.STRUCT)
_MAP: Final = int(TType.MAP)
_SET: Final = int(TType.SET)
_LIST: Final = int(TType.LIST)
# thriftpy2 spells the IDL's ``binary`` 18 in its specs; it is STRING on the wire.
_SPEC_TO_WIRE: Final[dict[int, int]] = {18: _STRING}
MAX_DEPTH: Final = 64

_i32 = struct.Struct(">i").unpack_from
_i16 = struct.Struct(">h").unpack_from


def check(cls: Any, data: bytes) -> None:
    """Raise :class:`ProtocolError` unless ``data`` is exactly one struct that the decoder
    will read as the wire says, for the thriftpy2 class ``cls``."""
    end = _Walk(data).struct(0, getattr(cls, "thrift_spec", None), 0)
    if end != len(data):
        raise ProtocolError(f"{len(data) - end} bytes after the struct")


def _split(spec: Any) -> tuple[int, Any]:
    """``(wire type, nested spec)`` of an element spec: an int, or ``(type, nested)``."""
    ttype: int
    if isinstance(spec, tuple):
        ttype, nested = spec[0], spec[1]
    else:
        ttype, nested = spec, None
    return _SPEC_TO_WIRE.get(ttype, ttype), nested


class _Walk:
    __slots__ = ("data", "size")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)

    def _need(self, pos: int, count: int) -> None:
        if count < 0 or pos + count > self.size:
            raise ProtocolError("a length runs past the end of the struct")

    def struct(self, pos: int, spec: dict[int, tuple[Any, ...]] | None, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise ProtocolError("structs nested too deeply")
        data, end = self.data, self.size
        while True:
            if pos >= end:
                raise ProtocolError("a struct runs past the end of the bytes")
            ftype = data[pos]
            if ftype == 0:
                return pos + 1
            if pos + 3 > end:
                raise ProtocolError("a struct runs past the end of the bytes")
            pos += 3
            if ftype == _STRING:  # most fields: inline, the walk's hot spot
                if pos + 4 > end:
                    raise ProtocolError("a length runs past the end of the struct")
                length: int = _i32(data, pos)[0]
                pos += 4 + length
                if length < 0 or pos > end:
                    raise ProtocolError("a length runs past the end of the struct")
                continue
            size = _FIXED.get(ftype)
            if size is not None:
                pos += size  # a short value shows at the next field header
                continue
            fid = _i16(data, pos - 2)[0]
            field = spec.get(fid) if spec is not None else None
            nested = None
            if field is not None:
                declared, _ = _split(field[0])
                # thriftpy2 skips a known field of another wire type, which is safe for the
                # types it knows; the element specs only apply when the types agree.
                if declared == ftype and len(field) == 4:
                    nested = field[2]
            pos = self.value(pos, ftype, nested, depth + 1)

    def value(self, pos: int, ttype: int, spec: Any, depth: int) -> int:
        size = _FIXED.get(ttype)
        if size is not None:
            self._need(pos, size)
            return pos + size
        if ttype == _STRING:
            self._need(pos, 4)
            length: int = _i32(self.data, pos)[0]
            self._need(pos + 4, length)
            return pos + 4 + length
        if ttype == _STRUCT:
            return self.struct(pos, getattr(spec, "thrift_spec", None), depth)
        if ttype in (_LIST, _SET):
            self._need(pos, 5)
            etype = self.data[pos]
            count = _i32(self.data, pos + 1)[0]
            pos += 5
            nested = None
            if spec is not None:
                expected, nested = _split(spec)
                if etype != expected and count:
                    raise ProtocolError(f"list of type {etype} where the IDL has {expected}")
            return self._elements(pos, count, (etype,), (nested,), depth)
        if ttype == _MAP:
            self._need(pos, 6)
            ktype, vtype = self.data[pos], self.data[pos + 1]
            count = _i32(self.data, pos + 2)[0]
            pos += 6
            kspec = vspec = None
            if spec is not None:
                (kexp, kspec), (vexp, vspec) = _split(spec[0]), _split(spec[1])
                if (ktype, vtype) != (kexp, vexp) and count:
                    raise ProtocolError(f"map of {ktype}->{vtype} where the IDL has {kexp}->{vexp}")
            return self._elements(pos, count, (ktype, vtype), (kspec, vspec), depth)
        raise ProtocolError(f"a value of type {ttype}, which the decoder cannot read")

    def _elements(
        self, pos: int, count: int, types: tuple[int, ...], specs: tuple[Any, ...], depth: int
    ) -> int:
        if count == 0:
            return pos
        if any(t not in _KNOWN for t in types):
            raise ProtocolError(f"a container of type {types}, which the decoder cannot read")
        self._need(pos, count * sum(_MIN_SIZE[t] for t in types))
        if depth > MAX_DEPTH:
            raise ProtocolError("containers nested too deeply")
        if len(types) == 1:
            etype, espec = types[0], specs[0]
            size = _FIXED.get(etype)
            if size is not None:
                return pos + count * size  # already bounded above
            if etype == _STRING:
                data, end, i32 = self.data, self.size, _i32
                for _ in range(count):
                    if pos + 4 > end:
                        raise ProtocolError("a length runs past the end of the struct")
                    length = i32(data, pos)[0]
                    pos += 4 + length
                    if length < 0 or pos > end:
                        raise ProtocolError("a length runs past the end of the struct")
                return pos
        for _ in range(count):
            for etype, espec in zip(types, specs, strict=True):
                pos = self.value(pos, etype, espec, depth + 1)
        return pos
