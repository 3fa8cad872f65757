"""A small model of binary-protocol Thrift values, for building and mutating fuzz inputs.

Written apart from ``proxy.wire`` on purpose (as ``tests/thrift_values.py`` is): inputs made
with the proxy's own understanding of the protocol could not catch a misunderstanding in it.
Values are mutable trees; :func:`parse` reads one from bytes, :func:`encode` writes it back
(and can report where the length fields and type bytes landed, so mutations can aim there),
:func:`generate` makes one from a thriftpy2 ``thrift_spec`` with every container populated.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any

STOP, BOOL, BYTE, DOUBLE, I16, I32, I64 = 0, 2, 3, 4, 6, 8, 10
STRING, STRUCT, MAP, SET, LIST, UUID = 11, 12, 13, 14, 15, 16
BINARY = 18  # thriftpy2's spec code for ``binary``; ``STRING`` on the wire

FIXED = {BOOL: 1, BYTE: 1, DOUBLE: 8, I16: 2, I32: 4, I64: 8, UUID: 16}
VALUE_TYPES = (*FIXED, STRING, STRUCT, MAP, SET, LIST)

_I32 = struct.Struct(">i")
_FIELD = struct.Struct(">bh")


@dataclass
class Scalar:
    ttype: int
    raw: bytes  # fixed-size types: the value's bytes; STRING: the content (no length)


@dataclass
class Field:
    ftype: int
    fid: int
    value: Value


@dataclass
class Struct:
    fields: list[Field] = field(default_factory=list)
    ttype: int = STRUCT


@dataclass
class Seq:
    ttype: int  # LIST or SET
    etype: int
    items: list[Value] = field(default_factory=list)


@dataclass
class Map:
    ktype: int
    vtype: int
    items: list[tuple[Value, Value]] = field(default_factory=list)
    ttype: int = MAP


Value = Scalar | Struct | Seq | Map


class Malformed(Exception):
    """The bytes are not a value this model can read."""


# -- parsing ---------------------------------------------------------------------------------


def parse(data: bytes, ttype: int = STRUCT, pos: int = 0) -> tuple[Value, int]:
    """One value of ``ttype`` at ``pos``, and the offset just past it."""
    try:
        return _parse(data, ttype, pos, 0)
    except (struct.error, IndexError) as exc:
        raise Malformed(str(exc)) from exc


def _parse(data: bytes, ttype: int, pos: int, depth: int) -> tuple[Value, int]:
    if depth > 80:
        raise Malformed("too deep")
    width = FIXED.get(ttype)
    if width is not None:
        if pos + width > len(data):
            raise Malformed("short value")
        return Scalar(ttype, data[pos : pos + width]), pos + width
    if ttype == STRING:
        (size,) = _I32.unpack_from(data, pos)
        if size < 0 or pos + 4 + size > len(data):
            raise Malformed("bad string")
        return Scalar(STRING, data[pos + 4 : pos + 4 + size]), pos + 4 + size
    if ttype == STRUCT:
        out = Struct()
        while True:
            ftype = data[pos]
            if ftype == STOP:
                return out, pos + 1
            _, fid = _FIELD.unpack_from(data, pos)
            value, pos = _parse(data, ftype, pos + 3, depth + 1)
            out.fields.append(Field(ftype, fid, value))
    if ttype in (LIST, SET):
        etype = data[pos]
        (count,) = _I32.unpack_from(data, pos + 1)
        if count < 0 or count > len(data):
            raise Malformed("bad count")
        seq = Seq(ttype, etype)
        pos += 5
        for _ in range(count):
            item, pos = _parse(data, etype, pos, depth + 1)
            seq.items.append(item)
        return seq, pos
    if ttype == MAP:
        ktype, vtype = data[pos], data[pos + 1]
        (count,) = _I32.unpack_from(data, pos + 2)
        if count < 0 or count > len(data):
            raise Malformed("bad count")
        mapping = Map(ktype, vtype)
        pos += 6
        for _ in range(count):
            key, pos = _parse(data, ktype, pos, depth + 1)
            value, pos = _parse(data, vtype, pos, depth + 1)
            mapping.items.append((key, value))
        return mapping, pos
    raise Malformed(f"type {ttype}")


# -- encoding --------------------------------------------------------------------------------


@dataclass
class Marks:
    """Offsets in an encoding: i32 length/count fields, and type bytes."""

    lengths: list[int] = field(default_factory=list)
    types: list[int] = field(default_factory=list)


def encode(value: Value, marks: Marks | None = None, base: int = 0) -> bytes:
    out = bytearray()
    _encode(value, out, marks, base)
    return bytes(out)


def _encode(value: Value, out: bytearray, marks: Marks | None, base: int) -> None:
    if isinstance(value, Scalar):
        if value.ttype == STRING:
            if marks is not None:
                marks.lengths.append(base + len(out))
            out += _I32.pack(len(value.raw))
        out += value.raw
    elif isinstance(value, Struct):
        for f in value.fields:
            if marks is not None:
                marks.types.append(base + len(out))
            out += _FIELD.pack(_signed8(f.ftype), (f.fid + 2**15) % 2**16 - 2**15)
            _encode(f.value, out, marks, base)
        out.append(STOP)
    elif isinstance(value, Seq):
        if marks is not None:
            marks.types.append(base + len(out))
            marks.lengths.append(base + len(out) + 1)
        out.append(value.etype & 0xFF)
        out += _I32.pack(len(value.items))
        for item in value.items:
            _encode(item, out, marks, base)
    else:
        if marks is not None:
            marks.types += [base + len(out), base + len(out) + 1]
            marks.lengths.append(base + len(out) + 2)
        out.append(value.ktype & 0xFF)
        out.append(value.vtype & 0xFF)
        out += _I32.pack(len(value.items))
        for key, item in value.items:
            _encode(key, out, marks, base)
            _encode(item, out, marks, base)


def _signed8(ttype: int) -> int:
    ttype &= 0xFF
    return ttype - 256 if ttype > 127 else ttype


def walk(value: Value) -> list[Value]:
    """Every value in the tree, ``value`` first."""
    out: list[Value] = [value]
    at = 0
    while at < len(out):
        node = out[at]
        at += 1
        if isinstance(node, Struct):
            out += [f.value for f in node.fields]
        elif isinstance(node, Seq):
            out += node.items
        elif isinstance(node, Map):
            for key, item in node.items:
                out += (key, item)
    return out


# -- generation ------------------------------------------------------------------------------

# Strings the planner looks at: database and table names in both spellings, partition names
# well formed or not, escapes, and bytes that are not UTF-8 (thriftpy2 then hands out bytes).
NAMES: tuple[bytes, ...] = (
    b"proxy_it",
    b"sales",
    b"dim",
    b"PROXY_IT",
    b"@hive#proxy_it",
    b"@HIVE#PROXY_IT",
    b"@#!",
    b"@cat#",
    b"#",
    b"",
    b"ds=2024-01-01/region=eu",
    b"ds=2024-01-02/region=us",
    b"ds=2024-01-01",
    b"ds=%2F%3D/region=%zz",
    b"DS=1/region=eu",
    b"ds=/region=",
    b"=x",
    b"a=b=c/d",
    b"ds=2024-01-01//region=eu",
    b"*",
    b"no_such_db",
    b'ds = "2024-01-01"',
    "ds=\u00e9t\u00e9/region=\u65e5\u672c".encode(),
    b"\xff\xfe",
    b"\xc3",
    b"\xed\xa0\x80",
    b"x\x00y",
    b"\x00\x7f\xff\xff\xff",
    b"\x0b\x7f\xff\xff\xff",
    b"\x0c\x00\x00\x00\x10",
)


def scalar(ttype: int, rng: random.Random) -> Scalar:
    if ttype == STRING:
        if rng.random() < 0.8:
            return Scalar(STRING, rng.choice(NAMES))
        return Scalar(STRING, rng.randbytes(rng.randrange(0, 24)))
    width = FIXED[ttype]
    if ttype == BOOL:
        return Scalar(BOOL, bytes([rng.choice((0, 1, 1, 2, 255))]))
    if rng.random() < 0.5:
        return Scalar(ttype, bytes(width))
    return Scalar(ttype, rng.randbytes(width))


def generate(spec: Any, rng: random.Random, depth: int = 0) -> Struct:
    """A struct of thriftpy2 class ``spec`` with every field set and every container
    holding an element or two (down to a nesting depth where recursive types stop)."""
    out = Struct()
    for fid, entry in sorted(spec.thrift_spec.items()):
        if rng.random() < 0.1:
            continue  # optional fields are sometimes absent
        ttype, arg = entry[0], entry[2] if len(entry) == 4 else None
        out.fields.append(Field(_wire(ttype), fid, typed_value(ttype, arg, rng, depth + 1)))
    return out


def _wire(ttype: int) -> int:
    return STRING if ttype == BINARY else ttype


def _split(arg: Any) -> tuple[int, Any]:
    return (arg, None) if isinstance(arg, int) else (arg[0], arg[1])


def typed_value(ttype: int, arg: Any, rng: random.Random, depth: int) -> Value:
    ttype = _wire(ttype)
    if ttype == I32 and arg is not None and hasattr(arg, "_VALUES_TO_NAMES"):
        return Scalar(I32, _I32.pack(rng.choice(sorted(arg._VALUES_TO_NAMES))))
    if ttype in FIXED or ttype == STRING:
        return scalar(ttype, rng)
    if ttype == STRUCT:
        if depth > 6:
            return Struct()
        return generate(arg, rng, depth)
    count = 0 if depth > 6 else rng.choice((0, 1, 1, 2))
    if ttype in (LIST, SET):
        etype, espec = _split(arg)
        items = [typed_value(etype, espec, rng, depth + 1) for _ in range(count)]
        return Seq(ttype, _wire(etype), items)
    (ktype, kspec), (vtype, vspec) = _split(arg[0]), _split(arg[1])
    pairs = [
        (typed_value(ktype, kspec, rng, depth + 1), typed_value(vtype, vspec, rng, depth + 1))
        for _ in range(count)
    ]
    return Map(_wire(ktype), _wire(vtype), pairs)


def random_value(ttype: int, rng: random.Random, depth: int = 0) -> Value:
    """A value of wire type ``ttype`` with no IDL behind it."""
    if ttype in FIXED or ttype == STRING:
        return scalar(ttype, rng)
    count = 0 if depth > 3 else rng.choice((0, 1, 1, 2, 3))
    if ttype == STRUCT:
        fields = []
        for _ in range(count):
            ftype = rng.choice(VALUE_TYPES)
            fields.append(Field(ftype, rng.randrange(-3, 12), random_value(ftype, rng, depth + 1)))
        return Struct(fields)
    if ttype in (LIST, SET):
        etype = rng.choice(VALUE_TYPES)
        return Seq(ttype, etype, [random_value(etype, rng, depth + 1) for _ in range(count)])
    ktype, vtype = rng.choice(VALUE_TYPES), rng.choice(VALUE_TYPES)
    pairs = [
        (random_value(ktype, rng, depth + 1), random_value(vtype, rng, depth + 1))
        for _ in range(count)
    ]
    return Map(ktype, vtype, pairs)
