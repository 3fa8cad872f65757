"""Hive 4 request fields that change a reply are part of its key; replies that cannot be cut
into partitions are cached whole. Requests are written as raw bytes with the test encoder
(``tests.thrift_values``), so fields the proxy's IDL does not declare are on the wire too."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from proxy import catalog, idl
from proxy.cache import partitions as parts
from proxy.cache.keys import TableRef, partition_field
from proxy.cache.plan import Bump, ReadPlan
from proxy.handler import SessionState
from proxy.wire.binary import MessageType
from tests.thrift_values import BOOL, I64, STRUCT, Value, encode, message
from tests.unit.helpers import NAMING, PLANNER, request_args, strings, text
from tests.unit.inprocess import Client, Rig, rig
from tests.unit.inprocess import message as parsed
from tests.unit.scripted_hms import Slow, reply_message, result_of, until

M = idl.module()
DB, T = "db", "t"
DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")
TV = NAMING.versions(TableRef.of(DB, T).tag)


def flag(value: bool) -> Value:
    return Value(BOOL, int(value))


def plan_of(method: str, raw: bytes) -> ReadPlan:
    spec = catalog.lookup(method)
    assert spec is not None
    plan = PLANNER.read(spec, idl.decode_args(method, raw), raw, None)
    assert plan is not None
    return plan


# -- get_table_req: the whole request is the key -------------------------------------------

TABLE_BASE = ((1, text(DB)), (2, text(T)))
# GetTableRequest in Hive 4.0.1 (none of these is in the proxy's IDL, which has fields 1-3):
# 4 catName, 6 validWriteIdList, 7 getColumnStats, 8 processorCapabilities,
# 9 processorIdentifier, 10 engine, 11 id.
TABLE_FIELDS = {
    "validWriteIdList": (6, text("db.t:5:9223372036854775807::")),
    "validWriteIdList, another": (6, text("db.t:6:9223372036854775807::")),
    "getColumnStats": (7, flag(True)),
    "getColumnStats=false": (7, flag(False)),
    "engine": (10, text("hive")),
    "engine, another": (10, text("impala")),
    "processorCapabilities": (8, strings("HIVEFULLACIDREAD")),
    "processorCapabilities, others": (8, strings("HIVEFULLACIDREAD", "HIVEBUCKET2")),
    "processorIdentifier": (9, text("HMSClient-impala")),
    "catName": (4, text("spark")),
    "id": (11, Value(I64, 42)),
}


def test_get_table_req_keys_differ_by_every_hive4_field() -> None:
    base = plan_of("get_table_req", request_args(*TABLE_BASE))
    assert plan_of("get_table_req", request_args(*TABLE_BASE)).key == base.key
    keys = {"base": base.key}
    for name, extra in TABLE_FIELDS.items():
        plan = plan_of("get_table_req", request_args(*TABLE_BASE, extra))
        # The same table, the same versions: only the key tells the replies apart.
        assert plan.refs == base.refs, name
        keys[name] = plan.key
    assert len(set(keys.values())) == len(keys), keys


# -- get_partitions_by_names_req: the variant is the request without its names ----------------

NAMES = (3, strings(*(f"ds={d}" for d in DAYS[:2])))
BY_NAMES_BASE = ((1, text(DB)), (2, text(T)), NAMES)
# GetPartitionsByNamesRequest in Hive 4.0.1, every field but 1-3 (db_name, tbl_name, names).
BY_NAMES_FIELDS = {
    "get_col_stats": (4, flag(True)),
    "get_col_stats=false": (4, flag(False)),
    "processorCapabilities, none": (5, strings()),
    "processorIdentifier": (6, text("HMSClient-impala")),
    "engine": (7, text("hive")),
    "engine, another": (7, text("impala")),
    "validWriteIdList": (8, text("db.t:5:9223372036854775807::")),
    "validWriteIdList, another": (8, text("db.t:6:9223372036854775807::")),
    "getFileMetadata=false": (9, flag(False)),  # true: never cached (see below)
    "id": (10, Value(I64, 42)),
    "skipColumnSchemaForPartition": (11, flag(True)),
    "includeParamKeyPattern": (12, text("numFiles%")),
    "excludeParamKeyPattern": (13, text("impala.%")),
    "a field of a later Hive": (14, text("?")),
}


def test_by_names_variants_differ_by_every_hive4_field_and_not_by_the_names() -> None:
    method = "get_partitions_by_names_req"
    base = plan_of(method, request_args(*BY_NAMES_BASE))
    assert base.partitions is not None
    other_names = plan_of(method, request_args(*BY_NAMES_BASE[:2], (3, strings("ds=x"))))
    assert other_names.partitions is not None
    assert other_names.partitions.variant == base.partitions.variant
    variants = {"base": base.partitions.variant}
    for name, extra in BY_NAMES_FIELDS.items():
        plan = plan_of(method, request_args(*BY_NAMES_BASE, extra))
        assert plan.partitions is not None, name
        variants[name] = plan.partitions.variant
        assert plan.key != base.key, name
        assert set(plan.partitions.entry_keys).isdisjoint(base.partitions.entry_keys), name
        # Wherever the field sits relative to the names, it is still part of the variant.
        first = plan_of(method, request_args(*BY_NAMES_BASE[:2], extra, NAMES))
        assert first.partitions is not None
        assert first.partitions.variant not in (base.partitions.variant, None), name
    assert len(set(variants.values())) == len(variants), variants


def test_by_names_asking_for_file_metadata_are_never_cached() -> None:
    """File metadata is read from the file system, which changes with no metastore write."""
    method = "get_partitions_by_names_req"
    spec = catalog.lookup(method)
    assert spec is not None
    raw = request_args(*BY_NAMES_BASE, (9, flag(True)))
    assert PLANNER.read(spec, idl.decode_args(method, raw), raw, None) is None


def test_old_style_by_names_variants_see_fields_the_idl_does_not_know() -> None:
    method = "get_partitions_by_names"
    base = encode(Value(STRUCT, list(BY_NAMES_BASE)))
    later = encode(Value(STRUCT, [*BY_NAMES_BASE, (4, flag(True))]))
    plans = [plan_of(method, raw) for raw in (base, later)]
    assert all(p.partitions is not None for p in plans)
    assert plans[0].partitions.variant != plans[1].partitions.variant  # type: ignore[union-attr]


def test_by_names_with_processor_capabilities_are_whole_replies_of_the_table() -> None:
    """Hive 4 runs what it returns for a processor's capabilities through its metadata
    transformer, which rewrites partitions by the table's type and parameters: such a reply
    depends on the table object, and is never assembled from partitions."""
    method = "get_partitions_by_names_req"
    plain = plan_of(method, request_args(*BY_NAMES_BASE))
    capable = plan_of(method, request_args(*BY_NAMES_BASE, (5, strings("HIVEFULLACIDREAD"))))
    assert capable.partitions is None
    assert (TV, "table") in {(r.key, r.field) for r in capable.refs}
    assert (TV, "table") not in {(r.key, r.field) for r in plain.refs}
    assert {(TV, partition_field((d,))) for d in DAYS[:2]} <= {
        (r.key, r.field) for r in capable.refs
    }


# -- in process ----------------------------------------------------------------------------


async def raw_call(r: Rig, method: str, seqid: int, args: bytes) -> bytes:
    client = Client()
    request = message(method, MessageType.CALL, seqid, args)
    await r.handler.handle(SessionState("a"), parsed(request), client)
    return client.reply()


def partition(ds: str, buckets: int = -1) -> Any:
    part = M.Partition(
        values=[ds],
        dbName=DB,
        tableName=T,
        createTime=1_700_000_000,
        sd=M.StorageDescriptor(location=f"file:/w/{T}/ds={ds}", numBuckets=buckets, cols=[]),
        parameters={"numFiles": "1"},
    )
    return part


def test_a_processor_capabilities_reply_follows_its_table() -> None:
    """The metastore drops a bucketed partition's bucketing for a processor without
    HIVEBUCKET2 unless the table is transactional (MetastoreDefaultTransformer): an ALTER
    TABLE that changes no partition changes the reply, and the next one is the metastore's."""
    method = "get_partitions_by_names_req"
    args = request_args(*BY_NAMES_BASE, (5, strings("HIVEFULLACIDREAD")))

    def buckets(reply: bytes) -> list[int]:
        return [p.sd.numBuckets for p in result_of(reply).success.partitions]

    async def run() -> None:
        async with rig() as r:
            table = r.hms.add_table(DB, T)

            def transformed(conn: Any, call: Any) -> Any:
                acid = (r.hms.tables[(DB, T)].parameters or {}).get("transactional") == "true"
                capable = "HIVEBUCKET2" in (call.req.processorCapabilities or [])
                found = [
                    partition(n.split("=", 1)[1], 4 if acid or capable else -1)
                    for n in sorted(call.req.names)
                ]
                result = M.GetPartitionsByNamesResult(partitions=found)
                return idl.result_class(method)(success=result)

            r.hms.answers[method] = transformed
            assert buckets(await raw_call(r, method, 1, args)) == [-1, -1]
            assert buckets(await raw_call(r, method, 2, args)) == [-1, -1]
            assert r.hms.calls[method] == 1
            acid = copy.deepcopy(table)
            acid.parameters["transactional"] = "true"
            await r.call(SessionState("w"), "alter_table", dbname=DB, tbl_name=T, new_tbl=acid)
            assert buckets(await raw_call(r, method, 3, args)) == [4, 4]
            assert r.hms.calls[method] == 2

    asyncio.run(run())


# -- a reply with Hive 4's dictionary ---------------------------------------------------------


def with_dictionary(seqid: int) -> bytes:
    """What Impala's catalogd answers with getFileMetadata: partitions whose file metadata
    index into a dictionary beside them."""
    result = M.GetPartitionsByNamesResult(
        partitions=[partition(d) for d in DAYS[:2]],
        dictionary=M.ObjectDictionary({"network_addresses": [b"\x0b\x00\x01host-1"]}),
    )
    return reply_message(
        "get_partitions_by_names_req",
        seqid,
        idl.result_class("get_partitions_by_names_req")(success=result),
    )


def test_a_reply_with_a_dictionary_is_cached_whole_and_served_byte_for_byte() -> None:
    method = "get_partitions_by_names_req"
    # (The dictionary comes with getFileMetadata, which is never cached; a reply that carries
    # one anyway, for whatever request, is cached whole.)
    args = request_args(*BY_NAMES_BASE, (7, text("impala")))
    assert parts.split(method, with_dictionary(1)[len(message(method, 2, 1, b"")) :]) is None

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            r.hms.raw_replies[method] = with_dictionary
            first = await raw_call(r, method, 1, args)
            second = await raw_call(r, method, 2, args)
            assert first == with_dictionary(1)
            assert second == with_dictionary(2)
            assert r.hms.calls[method] == 1
            assert r.sample("hmsproxy_cache_lookups_total", method=method, result="hit") == 1
            # Under the versions of the partitions it names: a change to one is seen.
            assert r.cache is not None
            await r.cache.store.bump([Bump(TV, partition_field((DAYS[1],)), "partitions")])
            assert await raw_call(r, method, 3, args) == with_dictionary(3)
            assert r.hms.calls[method] == 2
            # Another request (other names, or other fields) is not answered with it.
            other = request_args(
                *BY_NAMES_BASE[:2], (3, strings("ds=2024-01-01")), (7, text("impala"))
            )
            await raw_call(r, method, 4, other)
            assert r.hms.calls[method] == 3

    asyncio.run(run())


def test_a_whole_reply_that_raced_a_write_is_never_served() -> None:
    """Kept under the versions read before the call: a write that lands while the metastore
    answers leaves the entry dead, as for any fill."""
    method = "get_partitions_by_names_req"
    args = request_args(*BY_NAMES_BASE, (7, text("impala")))

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            r.hms.raw_replies[method] = with_dictionary
            slow = Slow()
            r.hms.script(method, slow)
            first = asyncio.create_task(raw_call(r, method, 1, args))
            await until(lambda: r.hms.calls[method] == 1, "the call reached the metastore")
            assert r.cache is not None
            await r.cache.store.bump([Bump(TV, partition_field((DAYS[0],)), "partitions")])
            slow.gate.set()
            assert await first == with_dictionary(1)
            assert await raw_call(r, method, 2, args) == with_dictionary(2)
            assert r.hms.calls[method] == 2

    asyncio.run(run())
