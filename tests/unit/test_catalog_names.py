"""Catalog names in invalidation, on the embedded store: a write spelled one way (``@cat#db``
in the database string, a ``_req`` struct's ``catName``, a notification event, or no catalog
at all) invalidates a read spelled any other way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy import catalog, idl
from proxy.cache.engine import CacheEngine, Result
from proxy.cache.events import Event, invalidation_for
from proxy.cache.keys import EPOCH, Naming, TableRef
from proxy.cache.plan import ReadPlan, WritePlan
from proxy.cache.store import MemoryStore
from proxy.listing.cache import ListingCache
from proxy.metrics import Metrics
from tests.unit.helpers import PLANNER, read_plan, reply, request_args, strings, text, write_plan

M = idl.module()
PART = M.Partition(values=["1"], dbName="db", tableName="t")


def table(db: str = "db") -> Any:
    return M.Table(tableName="t", dbName=db, parameters={})


def raw_read(method: str, raw: bytes) -> ReadPlan:
    spec = catalog.lookup(method)
    assert spec is not None
    plan = PLANNER.read(spec, idl.decode_args(method, raw), raw, None)
    assert plan is not None
    return plan


READS: dict[str, ReadPlan] = {
    "get_table('@spark#db')": read_plan("get_table", dbname="@spark#db", tbl_name="t"),
    "get_table('db')": read_plan("get_table", dbname="db", tbl_name="t"),
    # GetTableRequest.4 catName: not in the proxy's IDL, so only on the wire.
    "get_table_req{db, catName=spark}": raw_read(
        "get_table_req", request_args((1, text("db")), (2, text("t")), (4, text("spark")))
    ),
    "get_partition('@spark#db')": read_plan(
        "get_partition", db_name="@spark#db", tbl_name="t", part_vals=["1"]
    ),
    "get_partition_req{db, catName=spark}": read_plan(
        "get_partition_req",
        req=M.GetPartitionRequest(catName="spark", dbName="db", tblName="t", partVals=["1"]),
    ),
    "get_partitions_by_names('@spark#db')": read_plan(
        "get_partitions_by_names", db_name="@spark#db", tbl_name="t", names=["ds=1"]
    ),
    "get_partitions_by_names_req{'@spark#db'}": raw_read(
        "get_partitions_by_names_req",
        request_args((1, text("@spark#db")), (2, text("t")), (3, strings("ds=1"))),
    ),
}

PART_WRITE = [M.Partition(values=["1"], dbName="db", tableName="t")]
WRITES: dict[str, WritePlan] = {
    "alter_table('@spark#db')": write_plan(
        "alter_table", dbname="@spark#db", tbl_name="t", new_tbl=table()
    ),
    "alter_table('db')": write_plan("alter_table", dbname="db", tbl_name="t", new_tbl=table()),
    "alter_table_req{db, catName=spark}": write_plan(
        "alter_table_req",
        req=M.AlterTableRequest(catName="spark", dbName="db", tableName="t", table=table()),
    ),
    "alter_partition('@spark#db')": write_plan(
        "alter_partition", db_name="@spark#db", tbl_name="t", new_part=PART_WRITE[0]
    ),
    "alter_partitions_req{db, catName=spark}": write_plan(
        "alter_partitions_req",
        req=M.AlterPartitionsRequest(
            catName="spark", dbName="db", tableName="t", partitions=PART_WRITE
        ),
    ),
    # The notification log: the catalog in NotificationEvent.catName, which the follower
    # does not read; dbName is the bare name.
    "event ALTER_TABLE {db}": invalidation_for(
        Event(1, 0, "ALTER_TABLE", "db", "t", "{}", "json-0.2"), PLANNER
    ),
    "event ALTER_PARTITION {db}": invalidation_for(
        Event(2, 0, "ALTER_PARTITION", "db", "t", json.dumps({"keyValues": {"ds": "1"}}), None),
        PLANNER,
    ),
}

# alter_table without cascade leaves the partitions' versions alone: table reads only.
TABLE_READS = [r for r in READS if "partition" not in r]
TABLE_WRITES = [w for w in WRITES if "table" in w.lower()]
PARTITION_READS = [r for r in READS if "partition" in r]
PARTITION_WRITES = [w for w in WRITES if "partition" in w.lower()]


def engine() -> CacheEngine:
    return CacheEngine(
        MemoryStore(1 << 22), PLANNER, Metrics(), l1_bytes=1 << 20, max_entry_bytes=1 << 20
    )


async def cached_through(read: ReadPlan, write: WritePlan) -> bool:
    """Whether ``read``'s entry, filled now, is still served after ``write``."""
    e = engine()
    if read.partitions is not None:
        pp = read.partitions
        look = await e.lookup_partitions(read)
        key = e.naming.versions(pp.tag)
        epochs = await e.store.ensure_epochs([key])
        versions = {**look.versions, EPOCH: epochs[key]}
        await e.partitions.fill(read, versions, list(pp.values), {pp.values[0]: idl.encode(PART)})
        assert (await e.lookup_partitions(read)).result is Result.HIT
        await e.invalidate(write, "write")
        return (await e.lookup_partitions(read)).result is Result.HIT
    look = await e.lookup(read)
    fp = await e.fill_fingerprint(read, look)
    assert fp is not None
    assert await e.fill(read, fp, reply(read.method, idl.result_class(read.method)()))
    assert (await e.lookup(read)).result is Result.HIT
    await e.invalidate(write, "write")
    return (await e.lookup(read)).result is Result.HIT


@pytest.mark.parametrize("read", TABLE_READS)
@pytest.mark.parametrize("write", TABLE_WRITES)
def test_a_table_write_in_any_spelling_invalidates_a_read_in_any_other(
    write: str, read: str
) -> None:
    assert not asyncio.run(cached_through(READS[read], WRITES[write]))


@pytest.mark.parametrize("read", PARTITION_READS)
@pytest.mark.parametrize("write", PARTITION_WRITES)
def test_a_partition_write_in_any_spelling_invalidates_a_read_in_any_other(
    write: str, read: str
) -> None:
    assert not asyncio.run(cached_through(READS[read], WRITES[write]))


def test_the_default_catalogs_versions_are_what_they_always_were() -> None:
    """Replicas of the proxy before this rule share one Redis with those after it: for the
    catalog ``hive``, the version hashes are the same ones."""
    import hashlib

    def old(*parts: str) -> str:
        h = hashlib.blake2b(digest_size=8)
        for part in parts:
            h.update(part.encode())
            h.update(b"\x00")
        return h.hexdigest()

    assert TableRef.of("db", "t").tag == "t:" + old("hive", "db", "t")
    assert TableRef.of("@hive#db", "t").tag == "t:" + old("hive", "db", "t")
    assert TableRef.of("@spark#DB", "T").tag == TableRef.of("db", "t").tag
    assert TableRef.of("@spark#db", "t") != TableRef.of("db", "t")  # the names shown


def test_a_rename_is_by_name_whatever_the_catalog_spelling() -> None:
    """alter_table('@spark#db', 't', Table{dbName: 'db'}) keeps the table's name: not a
    rename (which would replace its epoch)."""
    plan = WRITES["alter_table('@spark#db')"]
    assert all(b.field != EPOCH for b in plan.bumps)
    renamed = write_plan("alter_table", dbname="@spark#db", tbl_name="t", new_tbl=table("db2"))
    assert {b.key for b in renamed.bumps if b.field == EPOCH} >= {
        Naming().versions(TableRef.of("db", "t").tag),
        Naming().versions(TableRef.of("db2", "t").tag),
    }


def test_listings_of_two_catalogs_tables_of_one_name_are_kept_apart() -> None:
    store = MemoryStore(1 << 20)
    listings = ListingCache(store, Naming(), ttl=60, variant="rule")
    hive, spark = TableRef.of("db", "t"), TableRef.of("@spark#db", "t")
    assert hive.tag == spark.tag
    assert listings.key(hive, ("1",), False) != listings.key(spark, ("1",), False)

    async def scenario() -> dict[tuple[str, ...], bytes]:
        looked = await listings.lookup(hive, [("1",)], False)
        assert looked.versions is not None
        await listings.fill(hive, looked.versions, {("1",): b"hive's"}, False, 1 << 20)
        assert (await listings.lookup(hive, [("1",)], False)).cached == {("1",): b"hive's"}
        return (await listings.lookup(spark, [("1",)], False)).cached

    assert asyncio.run(scenario()) == {}


def test_a_dropped_databases_tables_are_asked_of_its_own_catalog() -> None:
    """drop_database_req{name: db, catalogName: spark}: the tables to forget are spark's
    db's, so the metastore is asked about '@spark#db' (about 'db', it would list another
    catalog's, or the default one's)."""
    req = M.DropDatabaseRequest(
        name="db", catalogName="spark", ignoreUnknownDb=False, deleteData=False, cascade=True
    )
    plan = write_plan("drop_database_req", req=req)
    plain = write_plan("drop_database", name="db", deleteData=False, cascade=True)
    asked: list[str] = []

    async def list_tables(db: str) -> list[str]:
        asked.append(db)
        return ["only_in_spark"]

    async def run() -> bool:
        e = engine()
        read = read_plan("get_table", dbname="@spark#db", tbl_name="only_in_spark")
        look = await e.lookup(read)
        fp = await e.fill_fingerprint(read, look)
        assert fp is not None
        assert await e.fill(read, fp, reply("get_table", idl.result_class("get_table")()))
        await e.invalidate(await e.expand(plan, list_tables), "write")
        await e.expand(plain, list_tables)
        return (await e.lookup(read)).result is Result.HIT

    assert not asyncio.run(run())
    assert asked == ["@spark#db", "db"]
