"""The cache's pure core: partition names, plans, entries, per-partition byte surgery."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType
from thrift.transport.TTransport import TMemoryBuffer

from proxy import catalog, idl
from proxy.cache import entry as codec
from proxy.cache import partitions as parts
from proxy.cache.keys import (
    EPOCH,
    DatabaseRef,
    PartitionNameError,
    TableRef,
    parse_partition_name,
    partition_field,
    split_catalog,
)
from proxy.cache.partition_reads import PartitionReads
from proxy.cache.planner import Planner, Ttls
from tests.rig.sample import storage_descriptor
from tests.unit.helpers import NAMING, PLANNER, args, bumped, read_plan, write_plan

M = idl.module()


def fields_of(plan: Any) -> set[tuple[str, str]]:
    return {(ref.key, ref.field) for ref in plan.refs}


T = TableRef.of("db", "t")
TV = NAMING.versions(T.tag)
DV = NAMING.versions(DatabaseRef.of("db").tag)
GV = NAMING.versions("g")


# -- names -----------------------------------------------------------------------------------


def test_partition_names_unescape_like_hive() -> None:
    assert parse_partition_name("ds=2024-01-01/region=eu") == (
        ("ds", "region"),
        ("2024-01-01", "eu"),
    )
    assert parse_partition_name("p=a%2Fb%3Dc%25") == (("p",), ("a/b=c%",))
    # Only names as Hive escapes them (the metastore matches a name as written, and it
    # writes "%zz" as "p=%25zz"): others name no partition it has, whatever they unescape to.
    for bad in ("ds", "ds=1/", "DS=1", "=1", "p=%zz", "ds=%64%30%31", "p=a%2fb", "ds="):
        with pytest.raises(PartitionNameError):
            parse_partition_name(bad)


def test_catalog_prefixed_names_are_the_same_objects() -> None:
    assert split_catalog("@hive#Sales") == ("hive", "sales")
    assert split_catalog("sales") == ("hive", "sales")
    assert TableRef.of("@hive#DB", "T") == TableRef.of("db", "t")
    assert TableRef.of("@spark#db", "t") != TableRef.of("db", "t")


def test_a_table_keeps_all_its_keys_in_one_redis_slot() -> None:
    tag = T.tag
    keys = [
        NAMING.versions(tag),
        NAMING.entry(tag, "get_table", b"x"),
        NAMING.partition_entry(tag, "v", ["1"]),
        NAMING.dictionary(tag, "ab"),
    ]
    assert all(k.count("{" + tag + "}") == 1 for k in keys)


def test_partition_field_is_by_values() -> None:
    assert partition_field(["a", "b"]) == partition_field(("a", "b"))
    assert partition_field(["a/b"]) != partition_field(["a", "b"])


# -- read plans ------------------------------------------------------------------------------


def test_get_table_depends_on_the_table_only() -> None:
    plan = read_plan("get_table", dbname="DB", tbl_name="T")
    assert plan is not None
    assert fields_of(plan) == {(TV, EPOCH), (TV, "table")}
    assert plan.negative_ttl == Ttls().negative
    assert "{" + T.tag + "}" in plan.key


def test_whole_partition_lists_depend_on_set_and_contents() -> None:
    plan = read_plan(
        "get_partitions_by_filter", db_name="db", tbl_name="t", filter="x", max_parts=-1
    )
    assert fields_of(plan) == {(TV, EPOCH), (TV, "partset"), (TV, "parts")}


def test_single_partition_reads_depend_on_that_partition() -> None:
    plan = read_plan("get_partition", db_name="db", tbl_name="t", part_vals=["1"])
    assert fields_of(plan) == {(TV, EPOCH), (TV, "pgen"), (TV, partition_field(["1"]))}


def test_partition_statistics_also_depend_on_the_table() -> None:
    request = M.PartitionsStatsRequest("db", "t", ["c"], ["ds=1", "ds=2"])
    plan = read_plan("get_partitions_statistics_req", request=request)
    assert (TV, "table") in fields_of(plan)
    assert (TV, partition_field(["2"])) in fields_of(plan)


def test_by_names_is_planned_per_partition() -> None:
    plan = read_plan(
        "get_partitions_by_names", db_name="db", tbl_name="t", names=["ds=2", "ds=1", "ds=2"]
    )
    assert plan is not None and plan.partitions is not None
    assert plan.partitions.names == ("ds=2", "ds=1")
    assert plan.partitions.values == (("2",), ("1",))
    assert plan.partitions.names_path == (3,)
    other = read_plan("get_partitions_by_names", db_name="db", tbl_name="t", names=["ds=9"])
    assert other.partitions.variant == plan.partitions.variant  # same table, same shape


def test_unreadable_partition_names_are_not_cached() -> None:
    # Which partition the metastore takes such a name for is not certain (issue 39): the
    # metastore answers every time.
    for names in (["garbage"], ["ds=1", "DS=2"], ["ds=%64"], ["ds=1 "]):
        assert read_plan("get_partitions_by_names", db_name="db", tbl_name="t", names=names) is None


def test_user_scope_keys_carry_the_identity() -> None:
    per_user = Planner(NAMING, Ttls(), per_user=True)
    obj, raw = args("get_table", dbname="db", tbl_name="t")
    spec = catalog.lookup("get_table")
    assert spec is not None
    alice = per_user.read(spec, obj, raw, b"alice")
    bob = per_user.read(spec, obj, raw, b"bob")
    shared = PLANNER.read(spec, obj, raw, b"alice")
    assert alice and bob and shared
    assert len({alice.key, bob.key, shared.key}) == 3


def test_with_auth_reads_are_keyed_by_their_user_even_when_shared() -> None:
    a = read_plan(
        "get_partition_with_auth",
        db_name="db",
        tbl_name="t",
        part_vals=["1"],
        user_name="a",
        group_names=[],
    )
    b = read_plan(
        "get_partition_with_auth",
        db_name="db",
        tbl_name="t",
        part_vals=["1"],
        user_name="b",
        group_names=[],
    )
    assert a.key != b.key
    assert (GV, "privileges") in fields_of(a)


def test_ttl_is_the_shortest_of_the_scopes() -> None:
    ttls = Ttls(table=30, statistics=5)
    planner = Planner(NAMING, ttls, per_user=False)
    obj, raw = args("get_table_statistics_req", request=M.TableStatsRequest("db", "t", ["c"]))
    plan = planner.read(catalog.lookup("get_table_statistics_req"), obj, raw, None)  # type: ignore[arg-type]
    assert plan is not None and plan.ttl == 5


# -- write plans -----------------------------------------------------------------------------


def test_alter_partition_touches_that_partition_not_the_others() -> None:
    plan = write_plan(
        "alter_partition", db_name="db", tbl_name="t", new_part=M.Partition(values=["1"])
    )
    assert bumped(plan) == {(TV, "parts"), (TV, partition_field(["1"]))}


def test_add_partitions_changes_the_set_and_the_named_partitions() -> None:
    new = [M.Partition(values=[d], dbName="db", tableName="t") for d in ("1", "2")]
    plan = write_plan("add_partitions", new_parts=new)
    assert bumped(plan) == {
        (TV, "partset"),
        (TV, "parts"),
        (TV, partition_field(["1"])),
        (TV, partition_field(["2"])),
    }


def test_drop_partition_by_name() -> None:
    plan = write_plan(
        "drop_partition_by_name", db_name="db", tbl_name="t", part_name="ds=1", deleteData=True
    )
    assert (TV, partition_field(["1"])) in bumped(plan) and (TV, "partset") in bumped(plan)


def test_a_partition_write_without_names_invalidates_all_partitions() -> None:
    request = M.DropPartitionsRequest("db", "t", M.RequestPartsSpec(exprs=[]))
    plan = write_plan("drop_partitions_req", req=request)
    assert (TV, "pgen") in bumped(plan)


def test_an_insert_event_invalidates_the_partition_it_names() -> None:
    """fire_listener_event changes no metadata, but the files (listings, statistics)."""

    def insert(values: list[str]) -> Any:
        data = M.FireEventRequestData(insertData=M.InsertEventRequestData(filesAdded=["f"]))
        return write_plan(
            "fire_listener_event",
            rqst=M.FireEventRequest(True, data, "db", "t", values),
        )

    assert bumped(insert(["1"])) == {(TV, "parts"), (TV, partition_field(["1"]))}
    # An unpartitioned table's event names no partition: its partitions as a whole.
    assert (TV, "pgen") in bumped(insert([]))


def test_create_and_drop_table_replace_the_epoch() -> None:
    table = M.Table(tableName="T", dbName="DB")
    for plan in (
        write_plan("create_table", tbl=table),
        write_plan("drop_table", dbname="db", name="t", deleteData=True),
    ):
        assert {(TV, EPOCH), (DV, "db"), (GV, "tables")} <= bumped(plan)


def test_alter_table_invalidates_its_partitions_with_or_without_cascade() -> None:
    # A column change rewrites every partition's statistics parameters, cascade or not
    # (HiveAlterHandler), and the request does not show the old columns to compare.
    plain = write_plan(
        "alter_table", dbname="db", tbl_name="t", new_tbl=M.Table(tableName="t", dbName="db")
    )
    assert {(TV, "table"), (TV, "pgen"), (TV, "parts")} <= bumped(plain)
    assert (TV, "partset") not in bumped(plain)  # the set of partitions stays
    env = M.EnvironmentContext({"CASCADE": "true"})
    cascade = write_plan(
        "alter_table_with_environment_context",
        dbname="db",
        tbl_name="t",
        new_tbl=M.Table(tableName="t", dbName="db"),
        environment_context=env,
    )
    assert (TV, "pgen") in bumped(cascade)


def test_rename_kills_both_names() -> None:
    plan = write_plan(
        "alter_table", dbname="db", tbl_name="t", new_tbl=M.Table(tableName="u", dbName="db")
    )
    new = NAMING.versions(TableRef.of("db", "u").tag)
    assert {(TV, EPOCH), (new, EPOCH)} <= bumped(plan)


def test_statistics_updates_touch_the_objects_they_rewrite() -> None:
    desc = M.ColumnStatisticsDesc(False, "db", "t", "ds=1")
    plan = write_plan("update_partition_column_statistics", stats_obj=M.ColumnStatistics(desc, []))
    assert (TV, partition_field(["1"])) in bumped(plan)
    table = write_plan(
        "update_table_column_statistics",
        stats_obj=M.ColumnStatistics(M.ColumnStatisticsDesc(True, "db", "t"), []),
    )
    assert {(TV, "table"), (TV, "stats")} <= bumped(table)


def test_drop_database_lists_the_database_for_its_tables() -> None:
    plan = write_plan("drop_database", name="db", deleteData=True, cascade=True)
    assert plan.databases_dropped == (DatabaseRef.of("db"),)
    assert {(DV, EPOCH), (GV, "catalog"), (GV, "functions")} <= bumped(plan)


def test_undecodable_targets_flush_everything() -> None:
    spec = catalog.lookup("alter_partition")
    assert spec is not None
    assert PLANNER.write(spec, None).flush_all
    assert write_plan(
        "alter_partition", db_name=None, tbl_name="t", new_part=M.Partition(values=["1"])
    ).flush_all


def test_state_only_writes_invalidate_nothing() -> None:
    assert write_plan("open_txns", rqst=M.OpenTxnRequest(1, "u", "h")).empty


# -- entries ---------------------------------------------------------------------------------


@given(payload=st.binary(max_size=3000), flags=st.sampled_from([0, codec.NEGATIVE, codec.ABSENT]))
def test_entries_round_trip(payload: bytes, flags: int) -> None:
    fp = codec.fingerprint([b"1", None, b"x"])
    for compress in (True, False):
        got = codec.decode(codec.encode(fp, flags, payload, 60, compress=compress))
        assert (got.fingerprint, got.flags, got.payload) == (fp, flags, payload)
        assert 58 < got.ttl <= 60


def test_fingerprints_see_every_version() -> None:
    assert codec.fingerprint([b"1", b"2"]) != codec.fingerprint([b"1", b"3"])
    assert codec.fingerprint([b"1", None]) != codec.fingerprint([b"1", b"0"])
    assert codec.fingerprint([b"12", b"3"]) != codec.fingerprint([b"1", b"23"])


def _partition(i: int, cols: int = 20) -> bytes:
    sd = storage_descriptor(
        f"hdfs://nn:8020/warehouse/db.db/t/ds=2024-01-{i:02d}",
        [(f"column_number_{c}", "string") for c in range(cols)],
        types=M,
    )
    part = M.Partition(
        values=[f"2024-01-{i:02d}"],
        dbName="db",
        tableName="t",
        createTime=1700000000 + i,
        lastAccessTime=0,
        sd=sd,
        parameters={
            "transient_lastDdlTime": str(1700000000 + i),
            "numFiles": str(i),
            "totalSize": str(1000 * i),
        },
    )
    return idl.encode(part)


def test_partitions_compress_against_their_table_dictionary() -> None:
    fp = codec.fingerprint([b"1"])
    dictionary = codec.new_dictionary(_partition(1))
    raw = [_partition(i) for i in range(2, 30)]
    stored = [codec.encode(fp, 0, p, 60, dictionary=dictionary) for p in raw]
    assert sum(map(len, stored)) <= 0.25 * sum(map(len, raw))
    assert codec.decode(stored[0], dictionary[1]).payload == raw[0]
    assert codec.dictionary_id(stored[0]) == dictionary[0]
    with pytest.raises(codec.EntryError):
        codec.decode(stored[0])


# -- per-partition byte surgery --------------------------------------------------------------


def _reply_body(method: str, partitions: list[bytes]) -> bytes:
    objs = [idl.decode(M.Partition, p) for p in partitions]
    result_cls = idl.result_class(method)
    if method == "get_partitions_by_names":
        return idl.encode(result_cls(success=objs))
    return idl.encode(result_cls(success=M.GetPartitionsByNamesResult(partitions=objs)))


@pytest.mark.parametrize("method", ["get_partitions_by_names", "get_partitions_by_names_req"])
def test_split_and_assemble_are_exact_inverses(method: str) -> None:
    originals = [_partition(i, cols=3) for i in (1, 2, 3)]
    body = _reply_body(method, originals)
    split = parts.split(method, body)
    assert split is not None
    assert [data for _, data in split.partitions] == originals
    assert [values for values, _ in split.partitions] == [
        ("2024-01-01",),
        ("2024-01-02",),
        ("2024-01-03",),
    ]
    assert parts.assemble(method, originals) == body
    assert parts.assemble(method, []) == _reply_body(method, [])


def test_split_refuses_exceptions_and_dictionaries() -> None:
    cls = idl.result_class("get_partitions_by_names")
    assert (
        parts.split("get_partitions_by_names", idl.encode(cls(o2=M.NoSuchObjectException("x"))))
        is None
    )
    req_cls = idl.result_class("get_partitions_by_names_req")
    with_dict = req_cls(success=M.GetPartitionsByNamesResult([], M.ObjectDictionary({"k": [b"v"]})))
    assert parts.split("get_partitions_by_names_req", idl.encode(with_dict)) is None


def test_the_names_field_is_replaced_and_nothing_else() -> None:
    request = M.GetPartitionsByNamesRequest(
        "db", "t", ["ds=1", "ds=2"], True, ["cap"], "id", "hive"
    )
    _, raw = args("get_partitions_by_names_req", req=request)
    path = parts.field_path("get_partitions_by_names_req", "req.names")
    rewritten = parts.with_names(raw, path, ["ds=2"])
    decoded = idl.decode_args("get_partitions_by_names_req", rewritten).req
    assert decoded.names == ["ds=2"]
    assert (decoded.get_col_stats, decoded.processorCapabilities, decoded.engine) == (
        True,
        ["cap"],
        "hive",
    )
    # An argument this proxy does not know survives the rewrite byte for byte.
    unknown = raw[:-1] + b"\x0b\x00\x63\x00\x00\x00\x02zz" + raw[-1:]
    assert parts.with_names(unknown, path, ["ds=2"]).endswith(b"\x0b\x00\x63\x00\x00\x00\x02zz\x00")
    assert parts.without_field(raw, path) == parts.without_field(
        parts.with_names(raw, path, ["x"]), path
    )


@pytest.mark.parametrize("method", ["get_partitions_by_names", "get_partitions_by_names_req"])
def test_assembled_reply_header_is_the_hms_header(method: str) -> None:
    """A reply the proxy assembles from cached partitions (``PartitionReads._assembled``,
    what a hit sends) is the message the HMS writes: its header as Apache Thrift's
    TBinaryProtocol writes it (as libthrift does), then the same result, byte for byte,
    whatever order the request named the partitions in and whichever it named that the
    metastore does not have."""
    originals = [_partition(i, cols=2) for i in (1, 2)]
    written = TMemoryBuffer()
    TBinaryProtocol(written, strictWrite=True).writeMessageBegin(method, TMessageType.REPLY, 7)
    hms_header = written.getvalue()
    hms_reply = hms_header + _reply_body(method, originals)
    split = parts.split(method, hms_reply[len(hms_header) :])
    assert split is not None
    names = ["ds=2024-01-02", "ds=1999-01-01", "ds=2024-01-01"]  # not in name order, one absent
    if method == "get_partitions_by_names":
        plan = read_plan(method, db_name="db", tbl_name="t", names=names)
    else:
        plan = read_plan(
            method, req=M.GetPartitionsByNamesRequest(db_name="db", tbl_name="t", names=names)
        )
    assert plan is not None and plan.partitions is not None
    known: dict[tuple[str, ...], bytes | None] = dict(split.partitions)
    known[("1999-01-01",)] = None  # the metastore has no such partition
    assert set(known) == set(plan.partitions.values)
    assembled = PartitionReads._assembled(plan, 7, known)
    assert assembled[: len(hms_header)] == hms_header
    assert assembled == hms_reply


def test_grouped_fields_are_each_read_once_in_order_and_fence_as_the_refs_do() -> None:
    """plan.group is linear (it was quadratic: a 100-partition hit spent 130 us in it) and
    keeps first-seen order; fenced (over refs) and fenced_fields (over grouped fields, as the
    partition path calls it) say the same."""
    from proxy.cache import decide, locks
    from proxy.cache.plan import VersionRef, group
    from proxy.cache.store import FENCED

    refs = [VersionRef("a", f) for f in ("epoch", "p:1", "p:2", "p:1", "table")]
    refs += [VersionRef("b", "db"), VersionRef("a", "p:3")]
    grouped = group(refs)
    assert grouped == {"a": ["epoch", "p:1", "p:2", "table", "p:3"], "b": ["db"]}
    cases = [
        ({"a": {}, "b": {}}, False),
        ({"a": {locks.LOCKED: b"table"}, "b": {}}, True),
        ({"a": {locks.LOCKED: b"stats"}, "b": {}}, False),
        ({"a": {}, "b": {locks.LOCKED: b"db,table"}}, True),
        ({"a": {}, "b": {FENCED: b"1"}}, True),
    ]
    for versions, expected in cases:
        assert decide.fenced(refs, versions) is expected, versions  # type: ignore[arg-type]
        assert decide.fenced_fields(grouped, versions) is expected, versions  # type: ignore[arg-type]


def test_a_partition_plan_carries_the_fields_its_look_up_reads() -> None:
    spec = catalog.lookup("get_partitions_by_names")
    assert spec is not None
    names = ["ds=1", "ds=2"]
    args = idl.args_class("get_partitions_by_names")(db_name="d", tbl_name="t", names=names)
    plan = PLANNER.read(spec, args, idl.encode(args), None)
    assert plan is not None and plan.partitions is not None
    pp = plan.partitions
    from proxy.cache.plan import VersionRef, group

    key = NAMING.versions(pp.tag)
    fields = (EPOCH, "pgen", "partset", *pp.fields)
    expected = group([*plan.refs, *(VersionRef(key, f) for f in fields)])
    assert dict(pp.wanted) == {k: tuple(v) for k, v in expected.items()}


def test_a_big_uncompressed_entry_is_read_through_a_view_and_a_small_one_copied() -> None:
    small = codec.encode(b"f" * 16, 0, b"r" * 100, 60.0, compress=False)
    big = codec.encode(b"f" * 16, 0, b"R" * (codec.VIEW_ABOVE + 1), 60.0, compress=False)
    assert isinstance(codec.decode(small).payload, bytes)
    view = codec.decode(big).payload
    assert isinstance(view, memoryview) and view == b"R" * (codec.VIEW_ABOVE + 1)
    assert view.obj is big  # no copy: the stored value itself
