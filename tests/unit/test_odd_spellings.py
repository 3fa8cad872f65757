"""Names spelled oddly (issue 39, shapes 3 and 4), in process: the proxy matches names as the
metastore does, or does not cache them.

The metastore trims database and table names and lower-cases them; Derby and MySQL compare
partition names ignoring trailing blanks. The scripted metastore here resolves names that
way (:class:`Loose`), and the tests run the issue's shapes through the whole request path:
a read spelled oddly is answered by the metastore every time, a write spelled oddly
invalidates what it changes, and a reply holding partitions other than the ones asked for
is not kept. Then the rule itself, plan by plan, and a property over random spellings: a
write in any spelling invalidates a cached read in any spelling of the same object.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import catalog, idl
from proxy.cache import keys
from proxy.cache.decide import storable
from proxy.cache.engine import CacheEngine, Result
from proxy.cache.events import Event, invalidation_for
from proxy.cache.keys import EPOCH, DatabaseRef, TableRef, partition_field
from proxy.cache.store import MemoryStore
from proxy.handler import SessionState
from proxy.metrics import Metrics
from tests.unit.helpers import NAMING, PLANNER, bumped, read_plan, write_plan
from tests.unit.inprocess import Rig, message, rig
from tests.unit.scripted_hms import ScriptedHMS, partition, reply_message, result_of, table

M = idl.module()
DB, T = "db", "t"
BLANKS = "".join(map(chr, range(0x21)))  # what Java's String.trim() takes
KELVIN = "\u212a"  # lower-cases to an ASCII 'k', in Java and in Python


def hms_name(name: str) -> str:
    """HiveStringUtils.normalizeIdentifier (Python's lower case standing in for Java's)."""
    return name.strip(BLANKS).lower()


class Loose:
    """Answers of the scripted metastore that resolve names as the HMS on Derby does."""

    def __init__(self, hms: ScriptedHMS) -> None:
        self.hms = hms
        hms.answers.update(
            get_table=self.get_table,
            alter_table=self.alter_table,
            get_all_tables=self.get_all_tables,
            get_partitions_by_names=self.by_names,
            get_partition=self.get_partition,
            get_partition_by_name=self.by_name,
            alter_partition=self.alter_partition,
        )

    def add(self, db: str, name: str, *days: str) -> None:
        self.hms.add_table(db, name, *days, v="1")

    def _key(self, db: str, name: str) -> tuple[str, str]:
        return hms_name(db), hms_name(name)

    def _partition(self, db: str, name: str, part_name: str) -> Any:
        # PAD SPACE: 'ds=1 ' is 'ds=1'.
        have = self.hms.partitions.get(self._key(db, name), {})
        return next((p for n, p in have.items() if n.rstrip(" ") == part_name.rstrip(" ")), None)

    def get_table(self, conn: Any, args: Any) -> Any:
        result = idl.result_class("get_table")
        found = self.hms.tables.get(self._key(args.dbname, args.tbl_name))
        if found is None:
            return result(o2=M.NoSuchObjectException("no such table"))
        return result(success=found)

    def alter_table(self, conn: Any, args: Any) -> Any:
        self.hms.tables[self._key(args.dbname, args.tbl_name)] = args.new_tbl
        return idl.result_class("alter_table")()

    def get_all_tables(self, conn: Any, args: Any) -> Any:
        names = sorted(t for d, t in self.hms.tables if d == hms_name(args.db_name))
        return idl.result_class("get_all_tables")(success=names)

    def by_names(self, conn: Any, args: Any) -> Any:
        found = {}
        for name in args.names:
            part = self._partition(args.db_name, args.tbl_name, name)
            if part is not None:
                found[keys.partition_name(["ds"], part.values)] = part
        success = [found[n] for n in sorted(found)]
        return idl.result_class("get_partitions_by_names")(success=success)

    def _one(self, method: str, args: Any, name: str) -> Any:
        part = self._partition(args.db_name, args.tbl_name, name)
        if part is None:
            return idl.result_class(method)(o2=M.NoSuchObjectException("no such partition"))
        return idl.result_class(method)(success=part)

    def get_partition(self, conn: Any, args: Any) -> Any:
        name = keys.partition_name(["ds"], args.part_vals)  # Warehouse.makePartName
        return self._one("get_partition", args, name)

    def by_name(self, conn: Any, args: Any) -> Any:
        return self._one("get_partition_by_name", args, args.part_name)

    def alter_partition(self, conn: Any, args: Any) -> Any:
        db, name = self._key(args.db_name, args.tbl_name)
        wanted = keys.partition_name(["ds"], args.new_part.values)
        for stored in list(self.hms.partitions[(db, name)]):
            if stored.rstrip(" ") == wanted.rstrip(" "):
                self.hms.partitions[(db, name)][stored] = args.new_part
        return idl.result_class("alter_partition")()


def new_table() -> Any:
    return table(DB, T, v="2")


def marked(part: Any, v: str) -> Any:
    part.parameters = {**part.parameters, "v": v}
    return part


async def ask(r: Rig, method: str, **args: Any) -> Any:
    return result_of(await r.call(SessionState("a"), method, **args)).success


def run(scenario: Any) -> None:
    async def main() -> None:
        async with rig() as r:
            loose = Loose(r.hms)
            loose.add(DB, T, "000001", "000002")
            await scenario(r, loose)

    asyncio.run(main())


# -- the shapes, through the request path ----------------------------------------------


@pytest.mark.parametrize("db,name", [(DB, "t "), (DB, " t"), (DB, "T\t"), ("db ", T), (" DB", "T")])
def test_a_table_named_with_blanks_is_asked_of_the_metastore_every_time(db: str, name: str) -> None:
    async def scenario(r: Rig, loose: Loose) -> None:
        for _ in range(2):
            assert (await ask(r, "get_table", dbname=db, tbl_name=name)).parameters["v"] == "1"
        assert r.hms.calls["get_table"] == 2
        assert r.sample("hmsproxy_cache_lookups_total", method="get_table", result="bypass") == 2
        await r.call(SessionState("a"), "alter_table", dbname=DB, tbl_name=T, new_tbl=new_table())
        assert (await ask(r, "get_table", dbname=db, tbl_name=name)).parameters["v"] == "2"

    run(scenario)


@pytest.mark.parametrize("db,name", [("db ", "T "), ("\tDB", "t"), (DB, KELVIN), (DB, "İ")])
def test_a_write_spelled_oddly_invalidates_the_plain_name(db: str, name: str) -> None:
    async def scenario(r: Rig, loose: Loose) -> None:
        for _ in range(2):
            assert (await ask(r, "get_table", dbname=DB, tbl_name=T)).parameters["v"] == "1"
        assert r.hms.calls["get_table"] == 1  # cached
        if hms_name(name) != T:  # (another table: KELVIN's is k)
            r.hms.tables[(DB, hms_name(name))] = table(DB, hms_name(name), v="1")
        await r.call(
            SessionState("a"), "alter_table", dbname=db, tbl_name=name, new_tbl=new_table()
        )
        fresh = (await ask(r, "get_table", dbname=DB, tbl_name=T)).parameters["v"]
        assert fresh == ("2" if hms_name(name) == T else "1")
        assert r.hms.calls["get_table"] == 2  # invalidated, whichever table it was

    run(scenario)


def test_alter_partition_on_a_padded_table_name_reaches_plain_reads() -> None:
    async def scenario(r: Rig, loose: Loose) -> None:
        by_names = {"db_name": DB, "tbl_name": T, "names": ["ds=000001"]}
        one = {"db_name": DB, "tbl_name": T, "part_vals": ["000001"]}
        for _ in range(2):
            assert (await ask(r, "get_partitions_by_names", **by_names))[0].parameters["numFiles"]
            assert (await ask(r, "get_partition", **one)).values == ["000001"]
        assert r.hms.calls["get_partitions_by_names"] == r.hms.calls["get_partition"] == 1
        new = marked(partition(DB, T, "000001"), "2")
        await r.call(SessionState("a"), "alter_partition", db_name=DB, tbl_name="t ", new_part=new)
        assert (await ask(r, "get_partitions_by_names", **by_names))[0].parameters["v"] == "2"
        assert (await ask(r, "get_partition", **one)).parameters["v"] == "2"

    run(scenario)


def test_a_padded_partition_name_is_answered_as_the_metastore_answers_it() -> None:
    async def scenario(r: Rig, loose: Loose) -> None:
        both = await ask(
            r, "get_partitions_by_names", db_name=DB, tbl_name=T, names=["ds=000001", "ds=000001 "]
        )
        assert [p.values for p in both] == [["000001"]]
        padded = {"db_name": DB, "tbl_name": T, "names": ["ds=000001 "]}
        for _ in range(2):  # (was [] from the cache: 'ds=000001 ' kept as absent)
            assert [p.values for p in await ask(r, "get_partitions_by_names", **padded)] == [
                ["000001"]
            ]
        assert r.hms.calls["get_partitions_by_names"] == 3
        new = marked(partition(DB, T, "000001"), "2")
        await r.call(SessionState("a"), "alter_partition", db_name=DB, tbl_name=T, new_part=new)
        assert (await ask(r, "get_partitions_by_names", **padded))[0].parameters["v"] == "2"

    run(scenario)


@pytest.mark.parametrize(
    "method,args",
    [
        ("get_partition", {"part_vals": ["000001 "]}),
        ("get_partition_by_name", {"part_name": "ds=000001 "}),
        ("get_partition_by_name", {"part_name": "ds=000001  "}),
    ],
)
def test_single_partition_reads_named_loosely_are_not_cached(
    method: str, args: dict[str, Any]
) -> None:
    async def scenario(r: Rig, loose: Loose) -> None:
        for _ in range(2):
            assert (await ask(r, method, db_name=DB, tbl_name=T, **args)).values == ["000001"]
        assert r.hms.calls[method] == 2
        new = marked(partition(DB, T, "000001"), "2")
        await r.call(SessionState("a"), "alter_partition", db_name=DB, tbl_name=T, new_part=new)
        assert (await ask(r, method, db_name=DB, tbl_name=T, **args)).parameters["v"] == "2"

    run(scenario)


def test_a_reply_of_another_partition_than_the_one_named_is_not_kept() -> None:
    """The metastore reorders a name's columns for get_partition_by_name ('region=eu/ds=1'
    finds ds=1/region=eu): the reply is a partition the name's key does not cover."""

    async def scenario(r: Rig, loose: Loose) -> None:
        other = partition(DB, T, "000002")
        r.hms.raw_replies["get_partition_by_name"] = lambda seqid: reply_message(
            "get_partition_by_name", seqid, idl.result_class("get_partition_by_name")(success=other)
        )
        for _ in range(2):
            got = await ask(r, "get_partition_by_name", db_name=DB, tbl_name=T, part_name="ds=x")
            assert got.values == ["000002"]
        assert r.hms.calls["get_partition_by_name"] == 2

    run(scenario)


# -- the rule, plan by plan ----------------------------------------------------------------------


UNCERTAIN = ["t ", " t", "t\t", "\x00t", "a b", "İ", KELVIN, "t\u00a0", "ǅ", "t\u200b"]


@pytest.mark.parametrize("name", UNCERTAIN)
def test_reads_naming_a_table_or_database_uncertainly_are_not_planned(name: str) -> None:
    assert read_plan("get_table", dbname=DB, tbl_name=name) is None
    assert read_plan("get_table", dbname=name, tbl_name=T) is None
    assert read_plan("get_table", dbname=f"@hive#{name}", tbl_name=T) is None
    assert read_plan("get_database", name=name) is None
    assert read_plan("get_table_objects_by_name", dbname=DB, tbl_names=[T, name]) is None
    assert read_plan("get_partition_names", db_name=DB, tbl_name=name, max_parts=-1) is None


def test_certain_spellings_share_the_tables_versions() -> None:
    plain = read_plan("get_table", dbname=DB, tbl_name=T)
    for db, name in (("DB", "T"), ("@hive#Db", "t"), ("@SPARK #db", "t"), ("@#db", "T")):
        plan = read_plan("get_table", dbname=db, tbl_name=name)
        assert plan is not None and plan.refs == plain.refs, (db, name)


@pytest.mark.parametrize(
    "names",
    [["ds=1 "], ["ds=1", "ds=1 "], ["ds=1\t"], ["ds=1%20"], ["ds=é"], ["DS=1"], ["ds=%31"]],
)
def test_partition_reads_named_uncertainly_are_not_planned(names: list[str]) -> None:
    assert read_plan("get_partitions_by_names", db_name=DB, tbl_name=T, names=names) is None
    values = [n.partition("=")[2] for n in names]
    assert read_plan("get_partition_by_name", db_name=DB, tbl_name=T, part_name=names[-1]) is None
    if values[-1].endswith(" ") or not values[-1].isascii():
        assert read_plan("get_partition", db_name=DB, tbl_name=T, part_vals=values[-1:]) is None


def test_a_blank_inside_a_partition_name_is_matched_exactly() -> None:
    plan = read_plan("get_partitions_by_names", db_name=DB, tbl_name=T, names=["ds=1 /h=2"])
    assert plan is not None and plan.partitions is not None
    assert plan.partitions.values == (("1 ", "2"),)
    assert read_plan("get_partition", db_name=DB, tbl_name=T, part_vals=["a\tb"]) is not None


def alter_table(db: str, name: str) -> Any:
    return write_plan("alter_table", dbname=db, tbl_name=name, new_tbl=table(DB, T))


def test_writes_take_names_as_the_metastore_does() -> None:
    versions = NAMING.versions(TableRef.of(DB, T).tag)
    for db, name in (("db ", "T\t"), ("\nDB", " t "), ("@hive#db ", "t\x00")):
        plan = alter_table(db, name)
        assert (versions, "table") in bumped(plan), (db, name)
        assert not plan.databases_dropped and not plan.flush_all


@pytest.mark.parametrize("name", [KELVIN, "İ", "a b", "t\u00a0"])
def test_a_write_naming_a_table_uncertainly_invalidates_every_table_of_its_database(
    name: str,
) -> None:
    plan = alter_table(DB, name)
    assert plan.databases_dropped == (DatabaseRef.of(DB),)
    renamed = write_plan("alter_table", dbname=DB, tbl_name=T, new_tbl=table(DB, name))
    assert renamed.databases_dropped == (DatabaseRef.of(DB),)
    assert (NAMING.versions(TableRef.of(DB, T).tag), EPOCH) in bumped(renamed)


def test_a_write_naming_a_database_uncertainly_flushes() -> None:
    assert alter_table(f"d{KELVIN}", T).flush_all
    assert write_plan("alter_database", dbname="dİ", db=M.Database(name="x")).flush_all


def part(*values: str) -> Any:
    return M.Partition(values=list(values), dbName=DB, tableName=T)


def test_partition_writes_named_loosely_invalidate_every_partition() -> None:
    versions = NAMING.versions(TableRef.of(DB, T).tag)
    loose = [
        write_plan("alter_partition", db_name=DB, tbl_name=T, new_part=part("1 ")),
        write_plan(
            "drop_partition_by_name", db_name=DB, tbl_name=T, part_name="ds=1 ", deleteData=False
        ),
        write_plan("append_partition", db_name=DB, tbl_name=T, part_vals=["1  "]),
    ]
    for plan in loose:
        assert (versions, "pgen") in bumped(plan)
    # Beyond ASCII, or a blank inside: the database finds exactly that name's partition.
    for values in (("é",), ("1 ", "2")):
        plan = write_plan("alter_partition", db_name=DB, tbl_name=T, new_part=part(*values))
        assert (versions, "pgen") not in bumped(plan)
        assert (versions, partition_field(values)) in bumped(plan)


def test_events_naming_a_partition_loosely_invalidate_every_partition() -> None:
    versions = NAMING.versions(TableRef.of(DB, T).tag)
    for body in ({"keyValues": {"ds": "1 "}}, {"partName": "ds=1 "}):
        event = Event(1, 0, "ALTER_PARTITION", DB, T, json.dumps(body), None)
        plan = invalidation_for(event, PLANNER)
        assert plan is not None and (versions, "pgen") in bumped(plan), body
    exact = Event(2, 0, "ALTER_PARTITION", DB, T, json.dumps({"keyValues": {"ds": "1"}}), None)
    plan = invalidation_for(exact, PLANNER)
    assert plan is not None and (versions, "pgen") not in bumped(plan)


def test_only_replies_of_the_partitions_named_are_stored() -> None:
    plan = read_plan("get_partitions_by_names", db_name=DB, tbl_name=T, names=["ds=1", "ds=2"])

    def reply(method: str, success: Any) -> Any:
        return message(reply_message(method, 1, idl.result_class(method)(success=success)))

    def kept(plan: Any, method: str, success: Any) -> bool:
        return (
            storable(plan, reply(method, success), max_bytes=1 << 20, serve_iceberg=True)
            is not None
        )

    assert kept(plan, "get_partitions_by_names", [part("1"), part("2")])
    assert kept(plan, "get_partitions_by_names", [])
    assert not kept(plan, "get_partitions_by_names", [part("1"), part("3")])
    req = read_plan(
        "get_partitions_by_names_req",
        req=M.GetPartitionsByNamesRequest(db_name=DB, tbl_name=T, names=["ds=1"]),
    )
    dictionary = M.ObjectDictionary(values={})  # (not cut per partition: read decoded)
    for values, ok in ((("1",), True), (("2",), False)):
        result = M.GetPartitionsByNamesResult(partitions=[part(*values)], dictionary=dictionary)
        assert kept(req, "get_partitions_by_names_req", result) is ok
    by_name = read_plan("get_partition_by_name", db_name=DB, tbl_name=T, part_name="b=x/a=1")
    assert kept(by_name, "get_partition_by_name", part("x", "1"))
    assert not kept(by_name, "get_partition_by_name", part("1", "x"))  # reordered columns
    single = read_plan(
        "get_partition_req", req=M.GetPartitionRequest(dbName=DB, tblName=T, partVals=["1"])
    )
    assert kept(single, "get_partition_req", M.GetPartitionResponse(partition=part("1")))
    assert not kept(single, "get_partition_req", M.GetPartitionResponse(partition=part("1 ")))


def test_every_cached_read_of_partition_objects_by_name_has_its_reply_checked() -> None:
    from proxy.cache.partitions import PARTITION_REPLIES

    named = {
        s.name
        for s in catalog.all_methods()
        if s.kind is catalog.Kind.CACHEABLE_READ
        and s.targets
        and s.targets[0].partitions
        and not s.scope & catalog.Scope.STATISTICS
    }
    assert named == PARTITION_REPLIES


# -- a property over spellings -------------------------------------------------------------------


ODD = st.sampled_from([" ", "\t", "\n", "\x00", "\x1f", "\u00a0", "\u3000", "\u200b"])
LETTERS = st.sampled_from(
    ["t", "T", "k", "K", KELVIN, "i", "I", "İ", "\u0131", "_", "1", "%2F", "ß"]
)


@st.composite
def spellings(draw: st.DrawFn) -> str:
    """A table's name as a client may spell it: letters in any case, blanks on either
    side."""
    core = "".join(draw(st.lists(LETTERS, min_size=1, max_size=3)))
    return (
        "".join(draw(st.lists(ODD, max_size=2))) + core + "".join(draw(st.lists(ODD, max_size=2)))
    )


@settings(max_examples=300, deadline=None)
@given(read=spellings(), write=spellings())
def test_a_write_in_any_spelling_invalidates_a_cached_read_in_any_other(
    read: str, write: str
) -> None:
    plan = read_plan("get_table", dbname=DB, tbl_name=read)
    assert (plan is not None) == keys.certain_identifier(read)
    if plan is None or hms_name(read) != hms_name(write):
        return  # never cached; or another table (the metastore's word, as Python models it)

    async def scenario() -> bool:
        engine = CacheEngine(
            MemoryStore(1 << 22), PLANNER, Metrics(), l1_bytes=1 << 20, max_entry_bytes=1 << 20
        )
        look = await engine.lookup(plan)
        fp = await engine.fill_fingerprint(plan, look)
        assert fp is not None
        ok = idl.result_class("get_table")(success=table(DB, hms_name(read)))
        assert await engine.fill(plan, fp, message(reply_message("get_table", 1, ok)))
        assert (await engine.lookup(plan)).result is Result.HIT

        async def tables_of(db: str) -> list[str]:
            return [hms_name(read)]

        written = await engine.expand(alter_table(DB, write), tables_of)
        await engine.invalidate(written, "write")
        return (await engine.lookup(plan)).result is Result.HIT

    assert not asyncio.run(scenario())
