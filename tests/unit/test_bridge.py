"""The bridge for old clients in front of HMS 4.0.1 (proxy/bridge.py), in process.

Expected bytes are written with Apache Thrift's own protocol (``thrift`` package), not with
the proxy's IDL or encoders, so a mistake in either cannot hide itself. The in-process
tests drive the handler against a scripted metastore that answers ``get_table`` and
``get_table_objects_by_name`` with ``UNKNOWN_METHOD`` as HMS 4.0.1 does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport.TTransport import TMemoryBuffer

from proxy import bridge, idl
from proxy.handler import SessionState
from proxy.wire.binary import MessageType
from proxy.wire.framing import Transport
from tests.rig.raw import seqid_of, without_seqid
from tests.unit.inprocess import Client, message, rig
from tests.unit.scripted_hms import application_exception, header_of, result_of

M = idl.module()
REMOVED = ("get_table", "get_table_objects_by_name")
Write = Callable[[TBinaryProtocol], None]


def thrift_message(name: str, mtype: int, seqid: int, write: Write) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.writeMessageBegin(name, mtype, seqid)
    proto.writeStructBegin("s")
    write(proto)
    proto.writeFieldStop()
    proto.writeStructEnd()
    proto.writeMessageEnd()
    return bytes(buf.getvalue())


def string_field(proto: TBinaryProtocol, fid: int, value: str) -> None:
    proto.writeFieldBegin("f", TType.STRING, fid)
    proto.writeString(value)
    proto.writeFieldEnd()


def string_list_field(proto: TBinaryProtocol, fid: int, values: list[str]) -> None:
    proto.writeFieldBegin("f", TType.LIST, fid)
    proto.writeListBegin(TType.STRING, len(values))
    for value in values:
        proto.writeString(value)
    proto.writeListEnd()
    proto.writeFieldEnd()


def req_call(name: str, seqid: int, db: str, second: str | list[str], cat: str | None) -> bytes:
    """The ``_req`` call Hive's own client would send, written with Apache Thrift."""

    def write(proto: TBinaryProtocol) -> None:
        proto.writeFieldBegin("req", TType.STRUCT, 1)
        proto.writeStructBegin("r")
        string_field(proto, 1, db)
        if isinstance(second, list):
            string_list_field(proto, 2, second)
        else:
            string_field(proto, 2, second)
        if cat is not None:
            string_field(proto, 4, cat)
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeFieldEnd()

    return thrift_message(name, TMessageType.CALL, seqid, write)


# -- requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("db", "expected_db", "cat"),
    [
        ("sales", "sales", None),
        ("@spark#sales", "sales", "spark"),
        ("@hive#!", "", "hive"),
        ("Sales", "Sales", None),  # names go as they came: the metastore folds case
        ("@odd", "@odd", None),  # no separator: not a catalog name
    ],
)
def test_get_table_becomes_get_table_req_with_the_catalog_split_out(
    db: str, expected_db: str, cat: str | None
) -> None:
    call = message(idl.encode_call("get_table", 41, dbname=db, tbl_name="Orders"))
    assert bridge.request(call) == req_call("get_table_req", 41, expected_db, "Orders", cat)


def test_get_table_objects_by_name_keeps_the_names_list_as_it_came() -> None:
    names = ["a", "B", "a", "ünïcode"]
    call = message(idl.encode_call("get_table_objects_by_name", 7, dbname="@c#d", tbl_names=names))
    expected = req_call("get_table_objects_by_name_req", 7, "d", names, "c")
    assert bridge.request(call) == expected


def test_a_non_strict_header_is_bridged_with_a_strict_one() -> None:
    strict = idl.encode_call("get_table", 3, dbname="d", tbl_name="t")
    name = b"get_table"
    seqid_and_body = strict[header_of(strict).length - 4 :]
    old = len(name).to_bytes(4, "big") + name + bytes((TMessageType.CALL,)) + seqid_and_body
    call = message(old)
    assert not call.header.strict
    assert bridge.request(call) == req_call("get_table_req", 3, "d", "t", None)


@pytest.mark.parametrize(
    "write",
    [
        lambda p: string_field(p, 1, "only the database"),
        lambda p: (string_field(p, 1, "d"), string_field(p, 2, "t"), string_field(p, 3, "x")),
        lambda p: (string_field(p, 1, "d"), string_list_field(p, 2, ["t"])),  # wrong type
        lambda p: (string_list_field(p, 1, ["d"]), string_field(p, 2, "t")),
    ],
)
def test_arguments_that_are_not_the_old_calls_are_not_bridged(write: Write) -> None:
    call = message(thrift_message("get_table", TMessageType.CALL, 1, write))
    assert bridge.request(call) is None


def test_only_the_removed_methods_are_bridged() -> None:
    call = message(idl.encode_call("get_all_tables", 1, db_name="d"))
    assert bridge.request(call) is None
    assert set(bridge.REPLACEMENTS) == set(REMOVED)


# -- replies ---------------------------------------------------------------------------------


def table_bytes(name: str) -> bytes:
    """A Table as Hive 4 writes it: fields this proxy's IDL may not know (16 as a struct, 25,
    28) must reach the client untouched."""
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.writeStructBegin("Table")
    string_field(proto, 1, name)
    string_field(proto, 2, "d")
    proto.writeFieldBegin("creationMetadata", TType.STRUCT, 16)
    proto.writeStructBegin("CreationMetadata")
    string_field(proto, 1, "hive")
    proto.writeFieldStop()
    proto.writeStructEnd()
    proto.writeFieldEnd()
    string_field(proto, 17, "hive")
    proto.writeFieldBegin("id", TType.I64, 25)
    proto.writeI64(1234)
    proto.writeFieldEnd()
    proto.writeFieldBegin("txnId", TType.I64, 28)
    proto.writeI64(-1)
    proto.writeFieldEnd()
    proto.writeFieldStop()
    proto.writeStructEnd()
    return bytes(buf.getvalue())


def _struct_field(proto: TBinaryProtocol, fid: int, raw: bytes) -> None:
    proto.writeFieldBegin("f", TType.STRUCT, fid)
    proto.trans.write(raw)
    proto.writeFieldEnd()


def test_a_get_table_req_reply_becomes_the_get_table_reply_with_the_table_bytes_verbatim() -> None:
    table = table_bytes("t")

    def req_result(proto: TBinaryProtocol) -> None:
        proto.writeFieldBegin("success", TType.STRUCT, 0)
        proto.writeStructBegin("GetTableResult")
        _struct_field(proto, 1, table)
        proto.writeFieldBegin("isStatsCompliant", TType.BOOL, 2)
        proto.writeBool(True)
        proto.writeFieldEnd()
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeFieldEnd()

    upstream = message(thrift_message("get_table_req", TMessageType.REPLY, 41, req_result))
    expected = thrift_message(
        "get_table", TMessageType.REPLY, 9, lambda p: _struct_field(p, 0, table)
    )
    assert bridge.reply("get_table", 9, upstream) == expected


def test_a_get_table_objects_by_name_req_reply_becomes_the_list() -> None:
    tables = [table_bytes("a"), table_bytes("b")]

    def write_list(proto: TBinaryProtocol, fid: int) -> None:
        proto.writeFieldBegin("f", TType.LIST, fid)
        proto.writeListBegin(TType.STRUCT, len(tables))
        for raw in tables:
            proto.trans.write(raw)
        proto.writeListEnd()
        proto.writeFieldEnd()

    def req_result(proto: TBinaryProtocol) -> None:
        proto.writeFieldBegin("success", TType.STRUCT, 0)
        proto.writeStructBegin("GetTablesResult")
        write_list(proto, 1)
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeFieldEnd()

    name = "get_table_objects_by_name"
    upstream = message(thrift_message(name + "_req", TMessageType.REPLY, 2, req_result))
    expected = thrift_message(name, TMessageType.REPLY, 5, lambda p: write_list(p, 0))
    assert bridge.reply(name, 5, upstream) == expected


@pytest.mark.parametrize("fid", [1, 2, 3])
def test_declared_exceptions_are_copied_with_their_ids(fid: int) -> None:
    def exception(proto: TBinaryProtocol) -> None:
        proto.writeFieldBegin("o", TType.STRUCT, fid)
        proto.writeStructBegin("E")
        string_field(proto, 1, "db.t table not found")
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeFieldEnd()

    name = "get_table_objects_by_name" if fid == 3 else "get_table"
    upstream = message(thrift_message(name + "_req", TMessageType.REPLY, 1, exception))
    expected = thrift_message(name, TMessageType.REPLY, 77, exception)
    assert bridge.reply(name, 77, upstream) == expected


def test_an_application_exception_gets_the_clients_method_and_seqid() -> None:
    upstream = message(
        application_exception(
            "get_table_req", 4, TApplicationException.INTERNAL_ERROR, "Internal error processing"
        )
    )
    out = bridge.reply("get_table", 12, upstream)
    assert header_of(out).name == "get_table" and seqid_of(out) == 12
    assert header_of(out).type == TMessageType.EXCEPTION
    assert out[header_of(out).length :] == upstream.body  # the struct byte for byte
    assert not bridge.unknown_method(upstream)


@pytest.mark.parametrize(
    "write",
    [
        lambda p: string_field(p, 0, "not a struct"),
        lambda p: _struct_field(p, 0, b"\x00"),  # a result struct without its field 1
    ],
)
def test_a_reply_of_another_shape_is_an_error(write: Write) -> None:
    upstream = message(thrift_message("get_table_req", TMessageType.REPLY, 1, write))
    with pytest.raises(bridge.BridgeError):
        bridge.reply("get_table", 1, upstream)


def test_unknown_method_is_recognised_by_its_type_not_its_text() -> None:
    unknown = application_exception(
        "get_table", 1, TApplicationException.UNKNOWN_METHOD, "anything"
    )
    other = application_exception(
        "get_table", 1, TApplicationException.INTERNAL_ERROR, "Invalid method name: 'get_table'"
    )
    assert bridge.unknown_method(message(unknown))
    assert not bridge.unknown_method(message(other))


# -- through the handler, against a metastore without get_table ------------------------------


def test_get_table_is_bridged_and_the_reply_is_what_get_table_req_carried() -> None:
    async def run() -> None:
        async with rig(removed=REMOVED) as r:
            r.hms.add_table("d", "t")
            got = await r.call(SessionState("a"), "get_table", 7, dbname="d", tbl_name="t")
            req_reply = r.hms.answer("get_table_req", 7, req=M.GetTableRequest("d", "t"))
            table = result_of(req_reply).success.table
            assert header_of(got).name == "get_table" and seqid_of(got) == 7
            assert result_of(got).success == table
            # What an HMS that still has get_table sends, byte for byte.
            assert got == r.hms.answer("get_table", 7, dbname="d", tbl_name="t")
            # The first call learned it (one refusal), on the connection the HMS kept open.
            assert r.hms.calls["get_table"] == 1 and r.hms.calls["get_table_req"] == 1
            assert len(r.hms.connections) == 1
            # Cached like any get_table reply: a hit for another client, with its seqid.
            again = await r.call(SessionState("b"), "get_table", 8, dbname="d", tbl_name="t")
            assert without_seqid(again) == without_seqid(got) and seqid_of(again) == 8
            assert r.hms.calls["get_table_req"] == 1
            assert r.sample("hmsproxy_bridged_calls_total", method="get_table") == 1

    asyncio.run(run())


def test_once_learned_the_removed_method_is_not_sent_again() -> None:
    async def run() -> None:
        async with rig(cache=False, removed=REMOVED) as r:
            r.hms.add_table("d", "t")
            for seqid in range(3):
                await r.call(SessionState("a"), "get_table", seqid, dbname="d", tbl_name="t")
            assert r.hms.calls["get_table"] == 1 and r.hms.calls["get_table_req"] == 3
            assert r.sample("hmsproxy_bridged_calls_total", method="get_table") == 3

    asyncio.run(run())


def test_a_bridged_missing_table_is_the_no_such_object_exception() -> None:
    async def run() -> None:
        async with rig(removed=REMOVED) as r:
            got = await r.call(SessionState("a"), "get_table", 3, dbname="d", tbl_name="gone")
            assert isinstance(result_of(got).o2, M.NoSuchObjectException)
            assert got == r.hms.answer("get_table", 3, dbname="d", tbl_name="gone")

    asyncio.run(run())


def test_get_table_objects_by_name_is_bridged_and_invalidated_like_the_others() -> None:
    async def run() -> None:
        async with rig(removed=REMOVED) as r:
            r.hms.add_table("d", "a")
            r.hms.add_table("d", "b", owner_note="1")
            session = SessionState("a")
            ask = {"dbname": "d", "tbl_names": ["a", "missing", "b"]}
            got = await r.call(session, "get_table_objects_by_name", 1, **ask)
            assert got == r.hms.answer("get_table_objects_by_name", 1, **ask)
            assert [t.tableName for t in result_of(got).success] == ["a", "b"]
            await r.call(session, "get_table_objects_by_name", 2, **ask)
            assert r.hms.calls["get_table_objects_by_name_req"] == 1  # a hit
            changed = r.hms.tables[("d", "b")]
            changed.parameters = {"owner_note": "2"}
            await r.call(session, "alter_table", 3, dbname="d", tbl_name="b", new_tbl=changed)
            after = await r.call(session, "get_table_objects_by_name", 4, **ask)
            assert result_of(after).success[1].parameters == {"owner_note": "2"}
            assert r.hms.calls["get_table_objects_by_name_req"] == 2

    asyncio.run(run())


def test_other_unknown_methods_reach_the_client_exactly() -> None:
    async def run() -> None:
        async with rig(removed=REMOVED) as r:
            r.hms.answers.pop("get_all_tables")  # a method this metastore does not serve
            got = await r.call(SessionState("a"), "get_all_tables", 6, db_name="d")
            assert got == application_exception(
                "get_all_tables", 6, 1, "Invalid method name: 'get_all_tables'"
            )
            assert r.hms.calls["get_table_req"] == 0

    asyncio.run(run())


def test_a_metastore_that_has_get_table_is_never_bridged() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table("d", "t")
            await r.call(SessionState("a"), "get_table", 1, dbname="d", tbl_name="t")
            await r.call(SessionState("a"), "get_table", 2, dbname="d", tbl_name="gone")
            assert r.hms.calls["get_table"] == 2 and r.hms.calls["get_table_req"] == 0
            assert r.sample("hmsproxy_bridged_calls_total", method="get_table") == 0

    asyncio.run(run())


def test_the_lesson_is_logged_once_per_metastore(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        async with rig(cache=False, removed=REMOVED) as r:
            r.hms.add_table("d", "t")
            for seqid in range(3):
                await r.call(SessionState("a"), "get_table", seqid, dbname="d", tbl_name="t")

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    lines = [r for r in caplog.records if "bridging get_table as" in r.getMessage()]
    assert len(lines) == 1


def test_a_request_rejected_by_the_bridge_is_forwarded_as_it_came() -> None:
    async def run() -> None:
        async with rig(cache=False, removed=REMOVED) as r:

            def odd(proto: TBinaryProtocol) -> None:
                string_field(proto, 1, "d")
                string_field(proto, 2, "t")
                string_field(proto, 9, "a field the old call never had")

            raw = thrift_message("get_table", TMessageType.CALL, 4, odd)
            client = Client()
            await r.handler.handle(SessionState("a"), message(raw), client)
            got = client.reply()
            assert header_of(got).type == MessageType.EXCEPTION
            assert got == application_exception(
                "get_table", 4, 1, "Invalid method name: 'get_table'"
            )
            assert r.hms.calls["get_table_req"] == 0

    asyncio.run(run())


def test_requests_through_the_bridge_are_what_the_metastore_receives() -> None:
    async def run() -> None:
        async with rig(cache=False, removed=REMOVED) as r:
            r.hms.add_table("sales", "t")
            await r.call(SessionState("a"), "get_table", 9, dbname="@hive#sales", tbl_name="t")
            sent = [c for c in r.hms.received if c.method == "get_table_req"]
            assert sent[0].data == req_call("get_table_req", 9, "sales", "t", "hive")

    asyncio.run(run())


def test_a_held_call_is_bridged_too() -> None:
    """The proxy's own held calls (not relayed to a client) get the old shape as well."""

    async def run() -> None:
        async with rig(cache=False, removed=REMOVED) as r:
            r.hms.add_table("d", "t")
            call = message(idl.encode_call("get_table", 5, dbname="d", tbl_name="t"))
            held = await r.handler.forwarder.call(SessionState("a"), call, Client(), hold=True)
            assert not isinstance(held, str)
            assert held.header.name == "get_table" and held.header.seqid == 5
            assert held.data == r.hms.answer("get_table", 5, dbname="d", tbl_name="t")

    asyncio.run(run())


# -- big replies, streamed -------------------------------------------------------------------


def tables_reply(count: int, *, trailer: bool = False) -> bytes:
    """A get_table_objects_by_name_req reply of ``count`` tables; ``trailer``: a field after
    the list in GetTablesResult (none exists today: a later Hive's, which must be dropped)."""
    tables = [table_bytes(f"t{i:05d}") for i in range(count)]

    def req_result(proto: TBinaryProtocol) -> None:
        proto.writeFieldBegin("success", TType.STRUCT, 0)
        proto.writeStructBegin("GetTablesResult")
        proto.writeFieldBegin("tables", TType.LIST, 1)
        proto.writeListBegin(TType.STRUCT, len(tables))
        for raw in tables:
            proto.trans.write(raw)
        proto.writeListEnd()
        proto.writeFieldEnd()
        if trailer:
            string_field(proto, 7, "later")
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeFieldEnd()

    return thrift_message("get_table_objects_by_name_req", TMessageType.REPLY, 3, req_result)


def rewritten(data: bytes, hold_limit: int, cuts: list[int]) -> tuple[bytes, bool]:
    stream = bridge.ReplyStream("get_table_objects_by_name", 8, hold_limit)
    out, last = [], 0
    for cut in [*cuts, len(data)]:
        out.append(stream.feed(data[last:cut]))
        last = cut
    out.append(stream.finish())
    return b"".join(out), stream.streaming


@pytest.mark.parametrize("trailer", [False, True])
@pytest.mark.parametrize("piece", [1, 7, 100, 4096])
def test_a_big_list_is_streamed_to_the_same_bytes_as_the_whole_rewrite(
    trailer: bool, piece: int
) -> None:
    data = tables_reply(300, trailer=trailer)
    whole = bridge.reply("get_table_objects_by_name", 8, message(data))
    cuts = list(range(piece, len(data), piece))
    assert rewritten(data, 1 << 20, cuts) == (whole, False)  # small enough: held
    assert rewritten(data, 2000, cuts) == (whole, True)  # streamed past 2,000 bytes


def test_a_streamed_list_holds_at_most_one_table_beyond_the_limit() -> None:
    data = tables_reply(300)
    stream = bridge.ReplyStream("get_table_objects_by_name", 8, 2000)
    held = 0
    for at in range(0, len(data), 512):
        stream.feed(data[at : at + 512])
        held = max(held, len(stream._buf))
    assert held < 2000 + 512 + len(table_bytes("t00000"))
    stream.finish()


def test_a_get_table_reply_over_the_limit_is_an_error_not_a_guess() -> None:
    def req_result(proto: TBinaryProtocol) -> None:
        proto.writeFieldBegin("success", TType.STRUCT, 0)
        proto.writeStructBegin("GetTableResult")
        _struct_field(proto, 1, table_bytes("t"))
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeFieldEnd()

    data = thrift_message("get_table_req", TMessageType.REPLY, 1, req_result)
    assert bridge.ReplyStream("get_table", 1, len(data)).feed(data) == b""  # held
    with pytest.raises(bridge.BridgeError):
        bridge.ReplyStream("get_table", 1, 10).feed(data)
    with pytest.raises(bridge.BridgeError):
        bridge.ReplyStream("get_table", 1, 10).feed(b"\x80\x01\x00\x02" + b"\x00" * 40)


def test_a_list_cut_short_is_an_error() -> None:
    data = tables_reply(50)
    stream = bridge.ReplyStream("get_table_objects_by_name", 8, 100)
    stream.feed(data[: len(data) // 2])
    with pytest.raises(bridge.BridgeError):
        stream.finish()


def test_a_big_bridged_reply_reaches_the_client_byte_for_byte() -> None:
    async def run() -> None:
        async with rig(removed=REMOVED, cache_max_entry_bytes="64KiB") as r:
            names = [f"t{i:04d}" for i in range(400)]
            for name in names:
                r.hms.add_table("d", name)
            ask = {"dbname": "d", "tbl_names": names}
            got = await r.call(SessionState("a"), "get_table_objects_by_name", 5, **ask)
            assert got == r.hms.answer("get_table_objects_by_name", 5, **ask)
            assert len(got) > r.handler.forwarder.keep_limit  # so it was streamed
            again = await r.call(SessionState("a"), "get_table_objects_by_name", 6, **ask)
            assert again == r.hms.answer("get_table_objects_by_name", 6, **ask)

    asyncio.run(run())


def test_a_framed_client_gets_the_bridged_reply_in_one_frame() -> None:
    async def run() -> None:
        async with rig(removed=REMOVED) as r:
            r.hms.add_table("d", "t")
            for seqid in (1, 2):  # a miss, then a hit
                client = Client(Transport.FRAMED)
                call = message(idl.encode_call("get_table", seqid, dbname="d", tbl_name="t"))
                await r.handler.handle(SessionState("a"), call, client)
                assert client.reply() == r.hms.answer("get_table", seqid, dbname="d", tbl_name="t")
            assert r.hms.calls["get_table_req"] == 1

    asyncio.run(run())


def test_a_stale_pooled_connection_is_retried_through_the_bridge() -> None:
    """A read the HMS dropped while idle is retried once on a fresh connection, bridged."""

    async def run() -> None:
        async with rig(cache=False, removed=REMOVED) as r:
            r.hms.add_table("d", "t")
            await r.call(SessionState("a"), "get_table", 1, dbname="d", tbl_name="t")
            for conn in r.hms.open_connections:
                conn.close()  # the metastore drops the idle connection
            got = await r.call(SessionState("a"), "get_table", 2, dbname="d", tbl_name="t")
            assert got == r.hms.answer("get_table", 2, dbname="d", tbl_name="t")
            assert r.hms.calls["get_table"] == 1  # learned once, per metastore, not per connection

    asyncio.run(run())
