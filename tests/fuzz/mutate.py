"""Hostile inputs made from real calls: a fast, structure-aware random mutator.

Each input starts as a seed call (``seeds.py``) and is changed at three levels:

* **values**: strings set to names the planner parses (or bytes that are not UTF-8), numbers
  to extremes, fields renumbered, retyped, duplicated or dropped, containers retyped with
  their elements re-made in the new type (type confusion), grown to hundreds of elements,
  nested to around the depth limit, subtrees spliced in from other calls;
* **header**: another method's name over this body, garbage names, other message types,
  extreme seqids, the old non-strict header form;
* **bytes**: bit flips, length and count fields set to huge, negative or off-by-one values
  (aimed at the offsets where the encoder put them), type bytes changed, truncation,
  insertion, deletion, duplication; and several messages pipelined, or junk around them.

Everything is driven by one ``random.Random``, so a run is reproducible from its seed.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from copy import deepcopy

from proxy import catalog
from tests.fuzz import thrift
from tests.fuzz.seeds import Seed
from tests.fuzz.thrift import Field, Map, Scalar, Seq, Struct, Value

_I32 = struct.Struct(">i")

INTERESTING_I32 = (
    0,
    1,
    -1,
    2,
    3,
    4,
    5,
    255,
    256,
    1023,
    1024,
    1025,
    4095,
    4096,
    4097,
    65535,
    65536,
    (1 << 20) - 1,
    1 << 20,
    (1 << 20) + 1,
    1 << 24,
    0x0B000000,
    0x0C000000,
    2**31 - 1,
    2**31 - 2,
    -(2**31),
    -2,
    -(2**31) + 1,
    0x7FFFFF00,
    0x80010001 - 2**32,
)
INTERESTING_I16 = (0, 1, -1, 2, 3, 32767, -32768, 255, 256)
DEPTHS = (2, 8, 30, 62, 63, 64, 65, 66, 100)
MESSAGE_TYPES = (1, 1, 1, 1, 1, 1, 1, 4, 2, 3, 0, 5, 255)
GARBAGE_NAMES: tuple[bytes, ...] = (
    b"",
    b"get_foo",
    b"drop_everything",
    b"x" * 1024,
    b"x" * 1025,
    b"\xff\xfe",
    b"get_table\x00",
    b"GET_TABLE",
    b"get_table ",
    "get_t\u00e4ble".encode(),
)


class Mutator:
    """Makes one hostile input per call of :meth:`input`."""

    def __init__(
        self,
        seeds: Sequence[Seed],
        rng: random.Random,
        *,
        names: Sequence[str] | None = None,
        max_len: int = 16 * 1024,
    ) -> None:
        self.seeds = list(seeds)
        self.rng = rng
        # Header names an input may borrow: the catalog's, by default.
        self.names = list(names) if names is not None else [s.name for s in catalog.all_methods()]
        self.max_len = max_len
        self._trees: dict[int, Struct | None] = {}
        self._value_ops: list[Callable[[Struct], None]] = [
            self._set_string,
            self._set_string,
            self._set_fixed,
            self._retype_container,
            self._retype_container,
            self._retype_field,
            self._renumber_field,
            self._duplicate_field,
            self._drop_field,
            self._add_field,
            self._grow,
            self._nest,
            self._splice,
            self._reverse_fields,
        ]
        self._byte_ops: list[Callable[[bytearray, thrift.Marks], None]] = [
            self._flip,
            self._set_byte,
            self._lie_length,
            self._lie_length,
            self._lie_type,
            self._truncate,
            self._insert,
            self._delete,
            self._duplicate,
            self._overwrite_i32,
        ]

    # -- the input -------------------------------------------------------------------------

    def input(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.02:  # no seed at all: random bytes
            return rng.randbytes(rng.randrange(0, 200))
        if roll < 0.04:  # a header, then random bytes
            return self._header(rng.choice(self.names)) + rng.randbytes(rng.randrange(0, 200))
        seed = rng.choice(self.seeds)
        tree = self._tree(seed)
        value_ops = rng.choice((0, 0, 1, 1, 2, 3)) if tree is not None else 0
        for _ in range(value_ops):
            assert tree is not None
            rng.choice(self._value_ops)(tree)
        marks = thrift.Marks()
        header = self._header(seed.method)
        body = thrift.encode(tree, marks, len(header)) if tree is not None else seed.body
        data = bytearray(header + body)
        byte_ops = rng.choice((0, 1, 1, 2, 3)) if value_ops else rng.choice((1, 1, 2, 3, 5))
        for _ in range(byte_ops):
            if data:
                rng.choice(self._byte_ops)(data, marks)
        roll = rng.random()
        if roll < 0.08:  # pipelined after a well-formed call
            data[:0] = self._plain_call()
        elif roll < 0.14:  # followed by another call
            data += self._plain_call()
        elif roll < 0.17:
            data += rng.randbytes(rng.randrange(1, 64))
        return bytes(data[: self.max_len])

    def _tree(self, seed: Seed) -> Struct | None:
        """A fresh parse of the seed's body (mutations change it in place)."""
        try:
            value, _ = thrift.parse(seed.body)
        except thrift.Malformed:
            return None
        assert isinstance(value, Struct)
        return value

    def _plain_call(self) -> bytes:
        seed = self.rng.choice(self.seeds)
        return encode_header(seed.method.encode(), 1, self.rng.randrange(1 << 16)) + seed.body

    def _header(self, method: str) -> bytes:
        rng = self.rng
        name = method.encode()
        roll = rng.random()
        if roll < 0.12:
            name = rng.choice(self.names).encode()  # another method's name over this body
        elif roll < 0.16:
            name = rng.choice(GARBAGE_NAMES)
        mtype = rng.choice(MESSAGE_TYPES)
        seqid = rng.choice((0, 1, rng.randrange(1 << 16), -1, 2**31 - 1, -(2**31)))
        if rng.random() < 0.15:  # the old form: name length first, then type byte and seqid
            return _I32.pack(len(name)) + name + bytes([mtype]) + _I32.pack(seqid)
        return encode_header(name, mtype, seqid)

    # -- value mutations -------------------------------------------------------------------

    def _pick(self, tree: Struct, kind: type | tuple[type, ...]) -> Value | None:
        nodes = [n for n in thrift.walk(tree) if isinstance(n, kind)]
        return self.rng.choice(nodes) if nodes else None

    def _pick_field(self, tree: Struct) -> tuple[Struct, int] | None:
        owners = [n for n in thrift.walk(tree) if isinstance(n, Struct) and n.fields]
        if not owners:
            return None
        owner = self.rng.choice(owners)
        return owner, self.rng.randrange(len(owner.fields))

    def _set_string(self, tree: Struct) -> None:
        node = self._pick(tree, Scalar)
        if not isinstance(node, Scalar) or node.ttype != thrift.STRING:
            node = next(
                (n for n in thrift.walk(tree) if isinstance(n, Scalar) and n.ttype == 11), None
            )
        if node is None:
            return
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            node.raw = rng.choice(thrift.NAMES)
        elif roll < 0.75:
            node.raw = _I32.pack(rng.choice(INTERESTING_I32)) * rng.randrange(1, 4)
        elif roll < 0.9:
            node.raw = rng.randbytes(rng.randrange(0, 40))
        else:
            node.raw = rng.choice((b"a", b"ds=1/", b"\xff")) * rng.randrange(100, 3000)

    def _set_fixed(self, tree: Struct) -> None:
        nodes = [n for n in thrift.walk(tree) if isinstance(n, Scalar) and n.ttype != thrift.STRING]
        if not nodes:
            return
        node = self.rng.choice(nodes)
        width = len(node.raw)
        node.raw = self.rng.choice(
            (
                bytes(width),
                b"\xff" * width,
                b"\x7f" + b"\xff" * (width - 1),
                b"\x80" + bytes(width - 1),
            )
        )

    def _retype_container(self, tree: Struct) -> None:
        node = self._pick(tree, (Seq, Map))
        if node is None:
            return
        rng = self.rng
        new = rng.choice((thrift.STRING, thrift.STRING, *thrift.VALUE_TYPES, 0, 1, 7, 17, 200))
        count = max(1, len(node.items)) if rng.random() < 0.8 else rng.randrange(0, 4)
        if isinstance(node, Seq):
            node.etype = new
            node.items = [self._value(new) for _ in range(count)]
        else:
            if rng.random() < 0.5:
                node.ktype = new
            else:
                node.vtype = new
            node.items = [(self._value(node.ktype), self._value(node.vtype)) for _ in range(count)]

    def _value(self, ttype: int) -> Value:
        if ttype not in thrift.VALUE_TYPES:
            return Scalar(thrift.BYTE, bytes([self.rng.randrange(256)]))  # junk where it is
        return thrift.random_value(ttype, self.rng)

    def _retype_field(self, tree: Struct) -> None:
        picked = self._pick_field(tree)
        if picked is None:
            return
        owner, at = picked
        ftype = self.rng.choice(thrift.VALUE_TYPES)
        owner.fields[at] = Field(ftype, owner.fields[at].fid, thrift.random_value(ftype, self.rng))

    def _renumber_field(self, tree: Struct) -> None:
        picked = self._pick_field(tree)
        if picked is None:
            return
        owner, at = picked
        f = owner.fields[at]
        f.fid = self.rng.choice((*INTERESTING_I16, f.fid + 1, f.fid - 1))

    def _duplicate_field(self, tree: Struct) -> None:
        picked = self._pick_field(tree)
        if picked is None:
            return
        owner, at = picked
        f = owner.fields[at]
        try:
            copy = deepcopy(f.value)
        except RecursionError:  # nested past Python's recursion limit by _nest
            return
        if self.rng.random() < 0.5 and isinstance(copy, Scalar) and copy.ttype == thrift.STRING:
            copy.raw = self.rng.choice(thrift.NAMES)  # the same field twice, disagreeing
        owner.fields.insert(self.rng.randrange(len(owner.fields) + 1), Field(f.ftype, f.fid, copy))

    def _drop_field(self, tree: Struct) -> None:
        picked = self._pick_field(tree)
        if picked is not None:
            owner, at = picked
            del owner.fields[at]

    def _add_field(self, tree: Struct) -> None:
        owners = [n for n in thrift.walk(tree) if isinstance(n, Struct)]
        owner = self.rng.choice(owners)
        ftype = self.rng.choice(thrift.VALUE_TYPES)
        fid = self.rng.choice((*INTERESTING_I16, self.rng.randrange(1, 20)))
        owner.fields.append(Field(ftype, fid, thrift.random_value(ftype, self.rng)))

    def _grow(self, tree: Struct) -> None:
        rng = self.rng
        node = self._pick(tree, (Seq, Map))
        times = rng.choice((2, 10, 100, 400))
        if node is None or not node.items or rng.random() < 0.3:
            picked = self._pick_field(tree)
            if picked is None:
                return
            owner, at = picked
            empty: list[Value] = [Struct() for _ in range(times * 4)]  # decode amplification
            owner.fields[at] = Field(
                thrift.LIST, owner.fields[at].fid, Seq(thrift.LIST, thrift.STRUCT, empty)
            )
            return
        node.items = (node.items * times)[: times * 4]

    def _nest(self, tree: Struct) -> None:
        picked = self._pick_field(tree)
        if picked is None:
            return
        owner, at = picked
        f = owner.fields[at]
        ftype, value = f.ftype, f.value
        for _ in range(self.rng.choice(DEPTHS)):
            if self.rng.random() < 0.5:
                value = Seq(thrift.LIST, ftype, [value])
                ftype = thrift.LIST
            else:
                value = Struct([Field(ftype, 1, value)])
                ftype = thrift.STRUCT
        owner.fields[at] = Field(ftype, f.fid, value)

    def _splice(self, tree: Struct) -> None:
        other = self._tree(self.rng.choice(self.seeds))
        picked = self._pick_field(tree)
        if other is None or picked is None:
            return
        donor = self.rng.choice(thrift.walk(other))
        owner, at = picked
        owner.fields[at] = Field(donor.ttype, owner.fields[at].fid, donor)

    def _reverse_fields(self, tree: Struct) -> None:
        owner = self._pick(tree, Struct)
        if isinstance(owner, Struct):
            owner.fields.reverse()

    # -- byte mutations --------------------------------------------------------------------

    def _flip(self, data: bytearray, marks: thrift.Marks) -> None:
        for _ in range(self.rng.choice((1, 1, 2, 4))):
            at = self.rng.randrange(len(data))
            data[at] ^= 1 << self.rng.randrange(8)

    def _set_byte(self, data: bytearray, marks: thrift.Marks) -> None:
        at = self.rng.randrange(len(data))
        data[at] = self.rng.choice(
            (0, 0xFF, 0x7F, 0x80, 1, 11, 12, 13, 15, self.rng.randrange(256))
        )

    def _lie_length(self, data: bytearray, marks: thrift.Marks) -> None:
        spots = [m for m in marks.lengths if m + 4 <= len(data)]
        if not spots:
            self._overwrite_i32(data, marks)
            return
        at = self.rng.choice(spots)
        (old,) = _I32.unpack_from(data, at)
        new = self.rng.choice((*INTERESTING_I32, old + 1, old - 1, old * 2, old + 4096))
        data[at : at + 4] = _I32.pack(_wrap32(new))

    def _lie_type(self, data: bytearray, marks: thrift.Marks) -> None:
        spots = [m for m in marks.types if m < len(data)]
        at = self.rng.choice(spots) if spots else self.rng.randrange(len(data))
        data[at] = self.rng.choice((*thrift.VALUE_TYPES, 0, 1, 5, 7, 9, 17, 18, 127, 128, 255))

    def _truncate(self, data: bytearray, marks: thrift.Marks) -> None:
        del data[self.rng.randrange(len(data)) :]

    def _insert(self, data: bytearray, marks: thrift.Marks) -> None:
        at = self.rng.randrange(len(data) + 1)
        data[at:at] = self.rng.randbytes(self.rng.randrange(1, 9))

    def _delete(self, data: bytearray, marks: thrift.Marks) -> None:
        at = self.rng.randrange(len(data))
        del data[at : at + self.rng.randrange(1, 16)]

    def _duplicate(self, data: bytearray, marks: thrift.Marks) -> None:
        at = self.rng.randrange(len(data))
        chunk = data[at : at + self.rng.randrange(1, 64)]
        data[at:at] = chunk * self.rng.choice((1, 2, 8))

    def _overwrite_i32(self, data: bytearray, marks: thrift.Marks) -> None:
        if len(data) < 4:
            return
        at = self.rng.randrange(len(data) - 3)
        data[at : at + 4] = _I32.pack(_wrap32(self.rng.choice(INTERESTING_I32)))


def _wrap32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


def encode_header(name: bytes, mtype: int, seqid: int) -> bytes:
    """A strict message header (written here, not with ``proxy.wire``)."""
    return (
        struct.pack(">I", 0x80010000 | (mtype & 0xFF))
        + _I32.pack(len(name))
        + name
        + _I32.pack(_wrap32(seqid))
    )
