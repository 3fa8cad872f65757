"""proxy.conform: what reaches thriftpy2's decoder says on the wire what the IDL says."""

from __future__ import annotations

import struct

import pytest

from proxy import conform, idl
from proxy.wire.errors import ProtocolError


def _string(raw: bytes) -> bytes:
    return struct.pack(">i", len(raw)) + raw


GET_TABLE = idl.args_class("get_table")
BY_NAMES = idl.args_class("get_partitions_by_names")
GOOD = b"\x0b\x00\x01" + _string(b"db") + b"\x0b\x00\x02" + _string(b"t")


def test_what_engines_send_passes() -> None:
    conform.check(GET_TABLE, GOOD + b"\x00")
    body = idl.encode(BY_NAMES(db_name="d", tbl_name="t", names=["a=1", "a=2"]))
    conform.check(BY_NAMES, body)
    assert idl.decode_args("get_partitions_by_names", body).names == ["a=1", "a=2"]


def test_unknown_fields_of_known_types_pass() -> None:
    unknown = b"\x0f\x00\x63\x08" + struct.pack(">i", 2) + bytes(8)  # list<i32> id 99
    conform.check(GET_TABLE, GOOD + unknown + b"\x00")
    assert idl.decode_args("get_table", GOOD + unknown + b"\x00").tbl_name == "t"


@pytest.mark.parametrize(
    ("why", "body"),
    [
        ("a UUID value", GOOD + b"\x10\x00\x63" + bytes(16) + b"\x00"),
        ("a VOID value", GOOD + b"\x01\x00\x63\x00"),
        (
            "a list of UUIDs",
            GOOD + b"\x0f\x00\x63\x10" + struct.pack(">i", 1) + bytes(16) + b"\x00",
        ),
        ("a negative length", b"\x0b\x00\x01" + struct.pack(">i", -4) + b"\x00\x00"),
        ("a length past the end", b"\x0b\x00\x01" + struct.pack(">i", 99) + b"ab\x00"),
        ("no STOP", GOOD),
        ("bytes after the struct", GOOD + b"\x00\x00"),
        ("a count past the end", b"\x0f\x00\x03\x0b" + struct.pack(">i", 2**31 - 1) + b"\x00"),
        (
            "names of the wrong element type",
            b"\x0f\x00\x03\x08" + struct.pack(">i", 1) + struct.pack(">i", 7) + b"\x00",
        ),
    ],
)
def test_refused(why: str, body: bytes) -> None:
    cls = BY_NAMES if body.startswith(b"\x0f") else GET_TABLE
    with pytest.raises(ProtocolError):
        conform.check(cls, body)


def test_a_map_whose_wire_types_differ_from_the_idl_is_refused() -> None:
    # Partition.parameters is map<string,string>; a wire map<i32,i32> is not read as that.
    module = idl.module()
    params = b"\x0d\x00\x07\x08\x08" + struct.pack(">iii", 1, 1, 2) + b"\x00"
    with pytest.raises(ProtocolError):
        conform.check(module.Partition, params)
    conform.check(module.Partition, b"\x0d\x00\x07\x08\x08" + struct.pack(">i", 0) + b"\x00")


def test_nesting_is_bounded() -> None:
    deep = b"\x0c\x00\x63" * 200 + b"\x00" * 201
    with pytest.raises(ProtocolError):
        conform.check(GET_TABLE, deep)
