"""Which calls leave a metastore connection unfit for another client (proxy.upstream.hazards)."""

from __future__ import annotations

from proxy import idl
from proxy.upstream.hazards import spoils_connection


def body(method: str, **args: object) -> bytes:
    data = idl.encode_call(method, 1, **args)
    return data[12 + len(method) :]


def test_a_partition_named_with_a_trailing_blank_spoils_the_connection() -> None:
    m = idl.module()
    cases = {
        ("get_partition_by_name", "ds=1 "): True,
        ("get_partition_by_name", "ds=1"): False,
        ("get_partition_by_name", " ds=1"): False,  # leading blanks are compared exactly
    }
    for (method, name), spoils in cases.items():
        call = body(method, db_name="d", tbl_name="t", part_name=name)
        assert spoils_connection(method, call) is spoils, name
    assert spoils_connection(
        "get_partition", body("get_partition", db_name="d", tbl_name="t", part_vals=["1", "x "])
    )
    assert not spoils_connection(
        "get_partition", body("get_partition", db_name="d", tbl_name="t", part_vals=["1 ", "x"])
    )
    padded = m.Partition(values=["2024 "], dbName="d", tableName="t")
    assert spoils_connection(
        "alter_partition", body("alter_partition", db_name="d", tbl_name="t", new_part=padded)
    )
    assert spoils_connection(
        "alter_partitions",
        body(
            "alter_partitions",
            db_name="d",
            tbl_name="t",
            new_parts=[m.Partition(values=["a"]), padded],
        ),
    )


def test_other_calls_and_nonsense_do_not() -> None:
    assert not spoils_connection("get_table", body("get_table", dbname="d ", tbl_name="t "))
    assert not spoils_connection("no_such_method", b"\x00")
    assert not spoils_connection("get_partition_by_name", b"\xff\xff")  # refused before any
