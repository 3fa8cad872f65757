"""Random Thrift values and a tiny independent binary encoder, for testing the wire code.

The encoder is written separately from the proxy's scanner on purpose: a test that used the
proxy's own code to build its inputs could not catch a shared misunderstanding.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

BOOL, BYTE, DOUBLE, I16, I32, I64, STRING, STRUCT, MAP, SET, LIST = (
    2,
    3,
    4,
    6,
    8,
    10,
    11,
    12,
    13,
    14,
    15,
)


@dataclass(frozen=True)
class Value:
    ttype: int
    payload: Any  # scalar, bytes, list[Value], list[tuple[Value, Value]], list[tuple[int, Value]]
    elem: tuple[int, int] = (0, 0)  # element types of containers


def encode(value: Value) -> bytes:
    t, p = value.ttype, value.payload
    if t in (BOOL, BYTE):
        return struct.pack(">b", p)
    if t == I16:
        return struct.pack(">h", p)
    if t == I32:
        return struct.pack(">i", p)
    if t == I64:
        return struct.pack(">q", p)
    if t == DOUBLE:
        return struct.pack(">d", p)
    if t == STRING:
        return struct.pack(">i", len(p)) + p
    if t == STRUCT:
        out = b"".join(struct.pack(">bh", v.ttype, fid) + encode(v) for fid, v in p)
        return out + b"\x00"
    if t in (LIST, SET):
        return struct.pack(">bi", value.elem[0], len(p)) + b"".join(encode(v) for v in p)
    if t == MAP:
        body = b"".join(encode(k) + encode(v) for k, v in p)
        return struct.pack(">bbi", value.elem[0], value.elem[1], len(p)) + body
    raise AssertionError(t)


_SCALARS = {
    BOOL: st.integers(0, 1),
    BYTE: st.integers(-128, 127),
    I16: st.integers(-(2**15), 2**15 - 1),
    I32: st.integers(-(2**31), 2**31 - 1),
    I64: st.integers(-(2**63), 2**63 - 1),
    DOUBLE: st.floats(allow_nan=False),
    STRING: st.binary(max_size=40),
}


def values_of(ttype: int, depth: int) -> st.SearchStrategy[Value]:
    if ttype in _SCALARS:
        return _SCALARS[ttype].map(lambda p: Value(ttype, p))
    if ttype == STRUCT:
        return structs(depth)
    return containers(depth, ttype)


_TYPES = [BOOL, BYTE, I16, I32, I64, DOUBLE, STRING]


@st.composite
def containers(draw: st.DrawFn, depth: int, kind: int | None = None) -> Value:
    if kind is None:
        kind = draw(st.sampled_from([LIST, SET, MAP]))
    inner = _TYPES + ([STRUCT, LIST] if depth > 0 else [])
    e1 = draw(st.sampled_from(inner))
    n = draw(st.integers(0, 6))
    if kind == MAP:
        e2 = draw(st.sampled_from(inner))
        items = [(draw(values_of(e1, depth - 1)), draw(values_of(e2, depth - 1))) for _ in range(n)]
        return Value(MAP, items, (e1, e2))
    return Value(kind, [draw(values_of(e1, depth - 1)) for _ in range(n)], (e1, 0))


@st.composite
def structs(draw: st.DrawFn, depth: int = 3) -> Value:
    n = draw(st.integers(0, 6))
    fields = []
    for _ in range(n):
        choices = _TYPES + ([STRUCT, LIST, SET, MAP] if depth > 0 else [])
        t = draw(st.sampled_from(choices))
        v = draw(values_of(t, depth - 1))
        fields.append((draw(st.integers(-5, 40)), v))
    return Value(STRUCT, fields)


def message(name: str, mtype: int, seqid: int, body: bytes, strict: bool = True) -> bytes:
    raw = name.encode()
    if strict:
        return (
            struct.pack(">Ii", 0x80010000 | mtype, len(raw)) + raw + struct.pack(">i", seqid) + body
        )
    return struct.pack(">i", len(raw)) + raw + struct.pack(">bi", mtype, seqid) + body
