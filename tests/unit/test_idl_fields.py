"""Field ids of the IDL where Hive versions differ, checked on bytes built by hand (not by the
IDL under test): a Hive 3/4 Table has the creationMetadata struct at 16 and catName at 17,
where Hive 2.3.10 has catName at 16."""

from __future__ import annotations

import struct

from proxy import idl
from proxy.wire.binary import TType

STOP = b"\x00"


def field(ttype: TType, fid: int, payload: bytes) -> bytes:
    return bytes((ttype,)) + struct.pack(">h", fid) + payload


def text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def strings(*values: str) -> bytes:
    """A list or set of strings."""
    return bytes((TType.STRING,)) + struct.pack(">i", len(values)) + b"".join(map(text, values))


def i64(value: int) -> bytes:
    return struct.pack(">q", value)


CREATION_METADATA = (
    field(TType.STRING, 1, text("hive"))
    + field(TType.STRING, 2, text("sales"))
    + field(TType.STRING, 3, text("daily_mv"))
    + field(TType.SET, 4, strings("sales.orders"))
    + STOP
)


def hive4_table() -> bytes:
    """A materialized view's Table as a Hive 4 client sends it to create_table."""
    return (
        field(TType.STRING, 1, text("daily_mv"))
        + field(TType.STRING, 2, text("sales"))
        + field(TType.STRING, 12, text("MATERIALIZED_VIEW"))
        + field(TType.STRUCT, 16, CREATION_METADATA)
        + field(TType.STRING, 17, text("spark_catalog"))
        + field(TType.I64, 19, i64(42))
        + field(TType.I64, 25, i64(7))
        + STOP
    )


def test_a_hive4_table_keeps_its_catalog_at_17_and_creation_metadata_at_16() -> None:
    body = field(TType.STRUCT, 1, hive4_table()) + STOP
    tbl = idl.decode_args("create_table", body).tbl
    assert (tbl.dbName, tbl.tableName, tbl.catName) == ("sales", "daily_mv", "spark_catalog")
    assert tbl.creationMetadata.tblName == "daily_mv"
    assert tbl.creationMetadata.tablesUsed == ["sales.orders"]  # thriftpy2 reads sets as lists
    assert (tbl.writeId, tbl.id) == (42, 7)


def test_a_hive4_table_in_a_reply_decodes_the_same() -> None:
    result = field(TType.STRUCT, 1, hive4_table()) + field(TType.BOOL, 2, b"\x01") + STOP
    body = field(TType.STRUCT, 0, result) + STOP
    got = idl.decode_result("get_table_req", body).success
    assert got.table.catName == "spark_catalog"
    assert got.isStatsCompliant is True


def test_a_hive_23_table_with_its_string_at_16_decodes_without_a_catalog() -> None:
    table = (
        field(TType.STRING, 1, text("orders"))
        + field(TType.STRING, 2, text("sales"))
        + field(TType.STRING, 16, text("hive"))
        + STOP
    )
    tbl = idl.decode_args("create_table", field(TType.STRUCT, 1, table) + STOP).tbl
    assert (tbl.dbName, tbl.tableName) == ("sales", "orders")
    assert tbl.creationMetadata is None and tbl.catName is None


def test_get_table_request_fields_of_hive_4() -> None:
    request = (
        field(TType.STRING, 1, text("sales"))
        + field(TType.STRING, 2, text("orders"))
        + field(TType.STRING, 4, text("hive"))
        + field(TType.STRING, 6, text("sales.orders:5:5::"))
        + field(TType.BOOL, 7, b"\x01")
        + field(TType.STRING, 10, text("impala"))
        + field(TType.I64, 11, i64(99))
        + STOP
    )
    req = idl.decode_args("get_table_req", field(TType.STRUCT, 1, request) + STOP).req
    assert (req.catName, req.validWriteIdList, req.getColumnStats) == (
        "hive",
        "sales.orders:5:5::",
        True,
    )
    assert (req.engine, req.id) == ("impala", 99)
