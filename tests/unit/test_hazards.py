"""Which calls leave a metastore connection unfit for another client (proxy.upstream.hazards)."""

from __future__ import annotations

from proxy import idl
from proxy.upstream.hazards import spoils_connection
from proxy.wire.binary import MessageType, encode_header, parse_header
from proxy.wire.framing import Message


def message(data: bytes) -> Message:
    header = parse_header(data, 0, len(data))
    assert header is not None
    return Message(header, data)


def call(method: str, **args: object) -> Message:
    return message(idl.encode_call(method, 1, **args))


def test_a_partition_named_with_a_trailing_blank_spoils_the_connection() -> None:
    m = idl.module()
    cases = {
        ("get_partition_by_name", "ds=1 "): True,
        ("get_partition_by_name", "ds=1"): False,
        ("get_partition_by_name", " ds=1"): False,  # leading blanks are compared exactly
    }
    for (method, name), spoils in cases.items():
        named = call(method, db_name="d", tbl_name="t", part_name=name)
        assert spoils_connection(named) is spoils, name
    assert spoils_connection(
        call("get_partition", db_name="d", tbl_name="t", part_vals=["1", "x "])
    )
    assert not spoils_connection(
        call("get_partition", db_name="d", tbl_name="t", part_vals=["1 ", "x"])
    )
    padded = m.Partition(values=["2024 "], dbName="d", tableName="t")
    assert spoils_connection(call("alter_partition", db_name="d", tbl_name="t", new_part=padded))
    assert spoils_connection(
        call(
            "alter_partitions",
            db_name="d",
            tbl_name="t",
            new_parts=[m.Partition(values=["a"]), padded],
        ),
    )


def test_other_calls_and_nonsense_do_not() -> None:
    assert not spoils_connection(call("get_table", dbname="d ", tbl_name="t "))
    unknown = encode_header("no_such_method", MessageType.CALL, 1) + b"\x00"
    assert not spoils_connection(message(unknown))
    nonsense = encode_header("get_partition_by_name", MessageType.CALL, 1) + b"\xff\xff"
    assert not spoils_connection(message(nonsense))  # refused before any transaction
