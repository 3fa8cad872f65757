"""get_partitions_by_names, one partition at a time, at the byte level (pure).

The HMS answers ``get_partitions_by_names`` with the partitions that exist, each once, in
ascending order of partition name (its SQL says ``order by PART_NAME``). So a reply can be
cut into the original bytes of each partition, each stored on its own, and any later
request rebuilt from them: list header, the partitions' bytes in name order, end of struct.
That rebuilt reply is byte for byte what the HMS would send, provided the order assumption
holds; the read path (:mod:`.partition_reads`) checks it on every reply it fetches whole and
stops assembling if the HMS ever orders differently (say, a case-insensitive database
collation).
"""

from __future__ import annotations

import functools
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from proxy import idl
from proxy.wire.binary import MessageType, StructScanner, TType, encode_header
from proxy.wire.errors import ProtocolError
from proxy.wire.fields import encode_string_list_field, field_spans, find

_I32 = struct.Struct(">i")
_LIST_OF_STRUCTS = bytes((TType.LIST,))

# Where the partition list sits in each method's result: a path of field ids.
RESULT_LIST_PATH = {
    "get_partitions_by_names": (0,),
    "get_partitions_by_names_req": (0, 1),
}


def field_path(method: str, path: str) -> tuple[int, ...]:
    """Attribute path in the arguments (``req.names``) -> field ids (``(1, 3)``)."""
    cls = idl.args_class(method)
    out = []
    for step in path.split("."):
        for fid, spec in cls.thrift_spec.items():
            if spec[1] == step:
                out.append(fid)
                cls = spec[2] if spec[0] == TType.STRUCT else None
                break
        else:
            raise KeyError(f"{method}: no field {step}")
    return tuple(out)


def _locate(buf: bytes, start: int, path: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(start, value, end) of the field at ``path`` inside the struct at ``start``."""
    spans, _ = field_spans(buf, start)
    span = find(spans, path[0])
    if span is None:
        return None
    if len(path) == 1:
        return span.start, span.value, span.end
    if span.ttype != TType.STRUCT:
        return None
    return _locate(buf, span.value, path[1:])


def locate(args: bytes, path: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(start, value, end) of the field at ``path`` in the arguments; ``None``: absent.
    Raises ProtocolError (or struct.error, IndexError) on bytes that are not a struct."""
    return _locate(args, 0, path)


def without_field(args: bytes, path: tuple[int, ...]) -> bytes | None:
    """The argument bytes with one field cut out (what else shapes the reply)."""
    try:
        found = _locate(args, 0, path)
    except (ProtocolError, struct.error, IndexError):
        return None
    if found is None:
        return None
    start, _, end = found
    return args[:start] + args[end:]


def with_names(args: bytes, path: tuple[int, ...], names: list[str]) -> bytes:
    """The argument bytes with the names list replaced: the request for the missing ones.
    Every other byte, fields this proxy does not know included, stays as the client sent it."""
    found = _locate(args, 0, path)
    assert found is not None
    start, _, end = found
    return args[:start] + encode_string_list_field(path[-1], names) + args[end:]


@dataclass(frozen=True, slots=True)
class SplitReply:
    partitions: list[tuple[tuple[str, ...], bytes]]  # (values, original bytes), HMS order


def split(method: str, body: bytes) -> SplitReply | None:
    """Cut a successful reply into its partitions; ``None`` for any other shape."""
    path = RESULT_LIST_PATH[method]
    try:
        spans, end = field_spans(body, 0)
        if end != len(body) or len(spans) != 1 or spans[0].fid != path[0]:
            return None  # a declared exception, or fields this proxy does not expect
        start = spans[0].value
        if len(path) == 2:
            if spans[0].ttype != TType.STRUCT:
                return None
            inner, _ = field_spans(body, start)
            if len(inner) != 1 or inner[0].fid != path[1]:
                return None  # e.g. Hive 4's shared dictionary: partitions are not standalone
            start = inner[0].value
        elif spans[0].ttype != TType.LIST:
            return None
        if body[start] != TType.STRUCT:
            return None
        (count,) = _I32.unpack_from(body, start + 1)
        pos = start + 5
        out = []
        for _ in range(count):
            scanner = StructScanner(pos, len(body))
            if not scanner.scan(body, len(body)):
                return None
            part = body[pos : scanner.pos]
            out.append((partition_values(part), part))
            pos = scanner.pos
        return SplitReply(out)
    except (ProtocolError, struct.error, IndexError):
        return None


# Cached reads whose replies hold Partition objects of the partitions they name (one, a list,
# or a struct holding either): what :func:`reply_partition_values` reads.
PARTITION_REPLIES = frozenset(
    {
        "get_partition",
        "get_partition_by_name",
        "get_partition_req",
        "get_partition_with_auth",
        "get_partitions_by_names",
        "get_partitions_by_names_req",
    }
)


def reply_partition_values(method: str, body: bytes) -> list[tuple[str, ...]] | None:
    """The values of each partition a successful reply of a method of
    :data:`PARTITION_REPLIES` holds (none for any other reply); ``None`` if it cannot be
    read."""
    if method in RESULT_LIST_PATH:
        cut = split(method, body)  # (the usual shape, at the byte level)
        if cut is not None:
            return [values for values, _ in cut.partitions]
    try:
        found = idl.decode_result(method, body).success
    except ProtocolError:
        return None
    for name in ("partition", "partitions"):  # (GetPartitionResponse, ...ByNamesResult)
        found = getattr(found, name, found)
    items = found if isinstance(found, list) else [] if found is None else [found]
    out = []
    for item in items:
        values = getattr(item, "values", None)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None
        out.append(tuple(values))
    return out


def partition_values(part: bytes) -> tuple[str, ...]:
    """Field 1 of a Partition struct (its values), read straight from the bytes."""
    if (
        len(part) >= 8
        and part[0] == TType.LIST
        and part[1:3] == b"\x00\x01"
        and part[3] == TType.STRING
    ):
        (count,) = _I32.unpack_from(part, 4)
        pos, values = 8, []
        for _ in range(count):
            (size,) = _I32.unpack_from(part, pos)
            values.append(part[pos + 4 : pos + 4 + size].decode("utf-8"))
            pos += 4 + size
        return tuple(values)
    # Not written values-first: decode the struct properly.
    decoded = idl.decode(idl.module().Partition, part)
    return tuple(decoded.values or ())


def reply(
    method: str, seqid: int, named: Sequence[tuple[str | bytes, bytes | memoryview]]
) -> bytes:
    """The HMS's reply message for these partitions, each given with its name: in name
    order, as the HMS sends them (names given as UTF-8 bytes sort as their text does: UTF-8
    keeps the order of the code points it encodes)."""
    head = encode_header(method, MessageType.REPLY, seqid)
    return joined(head, *result_framing(method), named)


def joined(
    head: bytes,
    before: bytes,
    closing: bytes,
    named: Sequence[tuple[str | bytes, bytes | memoryview]],
) -> bytes:
    """:func:`reply` with its header and its result's framing (:func:`result_framing`)
    given."""
    return framed(head, before, closing, [data for _, data in sorted(named, key=_first)])


def assemble(method: str, partitions: Sequence[bytes | memoryview], head: bytes = b"") -> bytes:
    """The result struct the HMS would send for these partitions, in this order, after
    ``head`` (the reply's header)."""
    return framed(head, *result_framing(method), partitions)


def framed(
    head: bytes, before: bytes, closing: bytes, partitions: Sequence[bytes | memoryview]
) -> bytes:
    """``head``, then a result struct framed by ``before`` and ``closing`` (see
    :func:`result_framing`) holding these partitions, in this order: one join, the
    partitions copied once."""
    out: list[bytes | memoryview] = [head, before + _I32.pack(len(partitions))]
    out.extend(partitions)
    out.append(closing)
    return b"".join(out)


_first = operator.itemgetter(0)


@functools.cache
def result_framing(method: str) -> tuple[bytes, bytes]:
    """What the result struct of ``method`` holds before its partitions' count (an i32) and
    after its partitions."""
    listing = _LIST_OF_STRUCTS + b"\x00" + bytes((RESULT_LIST_PATH[method][-1],))
    listing += bytes((TType.STRUCT,))
    if method == "get_partitions_by_names":
        return listing, b"\x00"
    return bytes((TType.STRUCT,)) + b"\x00\x00" + listing, b"\x00\x00"
