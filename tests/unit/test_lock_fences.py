"""Lock fences and Iceberg commits, in process: the pure rules, then the engine on the embedded
store with scripted metastore replies (the real-server tests are tests/integration/test_locks.py
and test_iceberg.py)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import pytest

from proxy import iceberg, idl
from proxy.cache import locks
from proxy.cache.engine import CacheEngine, Result
from proxy.cache.keys import DatabaseRef, TableRef
from proxy.cache.locks import Fence, LockRecord
from proxy.cache.plan import Bump
from proxy.cache.store import MemoryStore, Store
from proxy.handler import SessionState
from proxy.metrics import Metrics
from proxy.wire.binary import MessageType, TType, parse_header
from proxy.wire.fields import field_spans
from proxy.wire.framing import Message
from tests.unit.helpers import GET_TABLE, NAMING, PLANNER, TABLE, fill, read_plan, reply, write_plan
from tests.unit.inprocess import rig

M = idl.module()
T_KEY = NAMING.versions(TableRef.of("db", "t").tag)
D_KEY = NAMING.versions(DatabaseRef.of("db").tag)


def lock_args(*components: Any, txnid: int | None = None) -> Any:
    return idl.args_class("lock")(rqst=M.LockRequest(list(components), txnid, "u", "h", "agent"))


def component(db: str = "db", table: str | None = "t", partition: str | None = None) -> Any:
    level = 3 if partition else 2 if table else 1
    return M.LockComponent(3, level, db, table, partition, 3)


# -- what a lock fences -------------------------------------------------------------------


def test_a_table_or_partition_component_fences_the_table_object() -> None:
    for comp in (component(), component(partition="ds=1"), component("DB", "T")):
        plan = locks.plan(lock_args(comp, txnid=7), NAMING)
        assert plan is not None
        assert plan.fences == (Fence(T_KEY, "table"),)
        assert plan.bumps == (Bump(T_KEY, "table", "table"),)
        assert plan.txnid == 7


def test_a_database_component_fences_the_database_and_its_table_lists() -> None:
    plan = locks.plan(lock_args(component(table=None), component()), NAMING)
    assert plan is not None
    assert set(plan.fences) == {Fence(D_KEY, "db"), Fence(T_KEY, "table")}
    assert plan.txnid is None


def test_a_lock_naming_nothing_fences_nothing() -> None:
    assert locks.plan(lock_args(), NAMING) is None
    assert locks.plan(idl.args_class("lock")(), NAMING) is None


def test_fence_fields_read_back() -> None:
    fields = {"L:abc:table": 100.0, "G:abc": 100.0, "L:old:table": 1.0, "0123ab": 100.0}
    state = locks.read_fences(fields, now=50.0)
    assert state.locked == {"table"} and state.write
    state = locks.read_fences({"L:abc:db": 100.0, "G:abc": 100.0}, now=50.0)
    assert state.locked == {"db"} and not state.write
    assert not locks.read_fences({"L:abc:table": 10.0}, now=50.0).locked  # past its deadline


def test_an_alter_ends_granted_fences_only() -> None:
    names = ["L:a:table", "G:a", "L:b:table", "0123ab"]
    assert sorted(locks.granted_fence_fields(names)) == ["G:a", "L:a:table"]


def test_a_lock_record_round_trips() -> None:
    record = LockRecord("f1", (Fence(T_KEY, "table"), Fence(D_KEY, "db")), 42)
    assert LockRecord.decode(record.encode()) == record
    assert LockRecord.decode(b"{not json") is None
    assert LockRecord.decode(b'{"f": 1}') is None


def test_lock_and_transaction_ids_of_requests() -> None:
    def ids(method: str, **args: Any) -> tuple[list[int], list[int]]:
        return locks.lock_ids_of(method, idl.args_class(method)(**args))

    assert ids("check_lock", rqst=M.CheckLockRequest(lockid=5)) == ([5], [])
    assert ids("unlock", rqst=M.UnlockRequest(lockid=6)) == ([6], [])
    assert ids("heartbeat", ids=M.HeartbeatRequest(lockid=7, txnid=8)) == ([7], [8])
    assert ids("commit_txn", rqst=M.CommitTxnRequest(txnid=9)) == ([], [9])
    assert ids("abort_txns", rqst=M.AbortTxnsRequest(txn_ids=[1, 2])) == ([], [1, 2])


def lock_reply(method: str, lockid: int, state: int) -> Any:
    return reply(method, idl.result_class(method)(success=M.LockResponse(lockid, state)))


def test_a_lock_reply_is_read() -> None:
    answer = lock_reply("lock", 11, locks.WAITING)
    got = locks.read_lock_reply("lock", answer.header.type, answer.body)
    assert (got.lockid, got.state) == (11, locks.WAITING)
    failed = reply("lock", idl.result_class("lock")(o1=M.NoSuchTxnException("gone")))
    assert locks.read_lock_reply("lock", failed.header.type, failed.body).state is None
    assert locks.read_lock_reply("lock", MessageType.EXCEPTION, b"").state is None


# -- the engine and the fences, on the embedded store ---------------------------------------


# Every call of the store interface (proxy.cache.store.Store): each is one round trip on Redis
# (``insist`` only retries the call it is given, which is counted).
STORE_CALLS = tuple(
    name
    for name, value in vars(Store).items()
    if not name.startswith("_") and inspect.iscoroutinefunction(value) and name != "insist"
)
# Set while a recorded call runs (per task): the embedded store's calls of its own methods
# (its ``get`` is a ``lookup``, its ``put`` a ``save``) are part of that call, not new ones.
_INSIDE_A_CALL: ContextVar[bool] = ContextVar("inside_a_store_call", default=False)


class CountingStore(MemoryStore):
    """The embedded store, recording every call made of it through the store interface."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.calls: list[str] = []


def _recorded(name: str) -> Callable[..., Awaitable[Any]]:
    inner = getattr(MemoryStore, name)

    async def call(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
        if _INSIDE_A_CALL.get():
            return await inner(self, *args, **kwargs)
        self.calls.append(name)
        token = _INSIDE_A_CALL.set(True)
        try:
            return await inner(self, *args, **kwargs)
        finally:
            _INSIDE_A_CALL.reset(token)

    return call


for _name in STORE_CALLS:
    setattr(CountingStore, _name, _recorded(_name))


def test_the_counting_store_records_every_store_call() -> None:
    """So that the round trips counted below are all of them."""
    assert {
        "lookup", "get", "put", "delete", "bump", "fence", "unfence", "mark", "unmark",
        "marks", "ensure_epochs", "save", "flush",
    } <= set(STORE_CALLS)  # fmt: skip

    async def run() -> None:
        store = CountingStore()
        await store.put("k", b"v", 60)
        assert await store.get("k") == b"v"
        await store.mark([(T_KEY, "L:x:table")], 1e12)
        assert store.calls == ["put", "get", "mark"]  # not the save and lookup inside them

    asyncio.run(run())


def engine(seconds: float = 300.0) -> CacheEngine:
    return CacheEngine(
        CountingStore(), PLANNER, Metrics(), l1_bytes=1 << 20,
        max_entry_bytes=1 << 20, lock_fence=seconds,
    )  # fmt: skip


def lock_body(*components: Any, txnid: int | None = None) -> bytes:
    return bytes(idl.encode(lock_args(*components, txnid=txnid)))


async def settle(
    e: CacheEngine, method: str, request: Any, answer: Any, ticket: Any = None
) -> None:
    e.locks.after(method, bytes(idl.encode(request)), ticket, answer)
    await asyncio.gather(*e.locks._tasks)


def unlock_args(lockid: int) -> Any:
    return idl.args_class("unlock")(rqst=M.UnlockRequest(lockid=lockid))


VOID_UNLOCK = reply("unlock", idl.result_class("unlock")())
PARTITIONS = read_plan("get_partitions_by_names", db_name="db", tbl_name="t", names=["ds=1"])


def test_a_lock_fences_reads_of_the_table_object_until_unlock() -> None:
    async def run() -> None:
        e = engine()
        await fill(e, TABLE)
        store = e.store
        assert isinstance(store, CountingStore)
        store.calls.clear()
        ticket = await e.locks.before_lock(lock_body(component()))
        assert ticket is not None
        assert store.calls == ["mark"]  # the fence and the invalidation: one round trip
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        assert (await e.lookup_partitions(PARTITIONS)).result is not Result.BYPASS
        await settle(e, "lock", lock_args(component()), lock_reply("lock", 1, 1), ticket)
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        await settle(e, "unlock", unlock_args(1), VOID_UNLOCK)
        # Unfenced, and the entry filled before the lock is gone: the lock invalidated it.
        assert (await e.lookup(GET_TABLE)).result is Result.MISS
        await fill(e, TABLE)
        assert (await e.lookup(GET_TABLE)).result is Result.HIT
        assert e.metrics.lock_fences_active._value.get() == 0

    asyncio.run(run())


def test_a_lock_through_the_request_path_makes_one_store_call_before_it_is_forwarded() -> None:
    """The claim of one round trip per lock, where it matters: the store calls made between a
    client's ``lock`` and the metastore's receiving it, through the handler."""

    async def run() -> None:
        store = CountingStore()
        async with rig(store=store) as r:
            r.hms.add_table("db", "t")
            writer = SessionState("writer")
            for seqid in (1, 2):  # cached, as a table is before a commit
                await r.call(writer, "get_table", seqid, dbname="db", tbl_name="t")
            store.calls.clear()
            seen_by_the_metastore: list[list[str]] = []

            def grant(conn: Any, args: Any) -> Any:
                seen_by_the_metastore.append(list(store.calls))
                return idl.result_class("lock")(success=M.LockResponse(1, locks.ACQUIRED))

            r.hms.answers["lock"] = grant
            await r.call(writer, "lock", 3, rqst=lock_args(component()).rqst)
            assert r.cache is not None
            await asyncio.gather(*r.cache.locks._tasks)
            assert seen_by_the_metastore == [["mark"]]

    asyncio.run(run())


TABLE_OBJECT = M.Table(tableName="t", dbName="db")
# Every read whose reply carries the table's object, with the reply the metastore gives it.
TABLE_OBJECT_READS = {
    "get_table": (GET_TABLE, TABLE),
    "get_table_req": (
        read_plan("get_table_req", req=M.GetTableRequest(dbName="db", tblName="t")),
        reply(
            "get_table_req",
            idl.result_class("get_table_req")(success=M.GetTableResult(table=TABLE_OBJECT)),
        ),
    ),
    "get_table_objects_by_name": (
        read_plan("get_table_objects_by_name", dbname="db", tbl_names=["t", "u"]),
        reply(
            "get_table_objects_by_name",
            idl.result_class("get_table_objects_by_name")(success=[TABLE_OBJECT]),
        ),
    ),
    "get_table_objects_by_name_req": (
        read_plan(
            "get_table_objects_by_name_req",
            req=M.GetTablesRequest(dbName="db", tblNames=["t", "u"]),
        ),
        reply(
            "get_table_objects_by_name_req",
            idl.result_class("get_table_objects_by_name_req")(
                success=M.GetTablesResult(tables=[TABLE_OBJECT])
            ),
        ),
    ),
}


async def fill_read(e: CacheEngine, plan: Any, message: Message) -> None:
    look = await e.lookup(plan)
    assert look.result is Result.MISS
    fp = await e.fill_fingerprint(plan, look)
    assert fp is not None
    assert await e.fill(plan, fp, message)


@pytest.mark.parametrize("method", sorted(TABLE_OBJECT_READS))
def test_every_read_of_the_table_object_goes_to_the_metastore_while_a_lock_fences_it(
    method: str,
) -> None:
    plan, message = TABLE_OBJECT_READS[method]

    async def run() -> None:
        e = engine()
        await fill_read(e, plan, message)
        assert (await e.lookup(plan)).result is Result.HIT  # cached before the lock
        ticket = await e.locks.before_lock(lock_body(component()))
        assert (await e.lookup(plan)).result is Result.BYPASS
        await settle(e, "lock", lock_args(component()), lock_reply("lock", 1, 1), ticket)
        assert (await e.lookup(plan)).result is Result.BYPASS
        await settle(e, "unlock", unlock_args(1), VOID_UNLOCK)
        assert (await e.lookup(plan)).result is Result.MISS  # invalidated by the lock

    asyncio.run(run())


def test_materialized_view_objects_are_never_served_from_the_cache() -> None:
    """get_all_materialized_view_objects_for_rewriting returns Table objects of every
    database, which no lock fences (see the catalog): each call goes to the metastore."""

    async def run() -> None:
        async with rig() as r:
            method = "get_all_materialized_view_objects_for_rewriting"
            view = M.Table(tableName="mv", dbName="db", tableType="MATERIALIZED_VIEW")
            r.hms.answers[method] = lambda conn, args: idl.result_class(method)(success=[view])
            session = SessionState("reader")
            replies = [await r.call(session, method, seqid) for seqid in (1, 2, 3)]
            assert r.hms.calls[method] == 3
            assert replies[2] == r.hms.answer(method, 3)

    asyncio.run(run())


@pytest.mark.parametrize(
    "answer",
    [
        lock_reply("lock", 3, locks.NOT_ACQUIRED),
        reply("lock", idl.result_class("lock")(o2=M.TxnAbortedException("aborted"))),
    ],
)
def test_a_refused_lock_lifts_its_fence(answer: Any) -> None:
    async def run() -> None:
        e = engine()
        ticket = await e.locks.before_lock(lock_body(component()))
        await settle(e, "lock", lock_args(component()), answer, ticket)
        look = await e.lookup(GET_TABLE)
        assert look.result is Result.MISS

    asyncio.run(run())


def test_a_metastore_error_on_lock_keeps_the_fence() -> None:
    """A TApplicationException does not say whether the lock was taken (Java Iceberg then
    looks for it with show_locks and goes on): the read inside it must stay fenced."""
    from proxy.wire.binary import AppErrorType, encode_application_exception

    async def run() -> None:
        e = engine()
        ticket = await e.locks.before_lock(lock_body(component()))
        data = encode_application_exception("lock", 1, AppErrorType.INTERNAL_ERROR, "boom")
        header = parse_header(data, 0, len(data))
        assert header is not None
        await settle(e, "lock", lock_args(component()), Message(header, data), ticket)
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS

    asyncio.run(run())


ALTER = write_plan(
    "alter_table", dbname="db", tbl_name="t", new_tbl=M.Table(tableName="t", dbName="db")
)


async def alter(e: CacheEngine) -> None:
    intent = await e.begin_write(ALTER)
    assert await e.end_write(ALTER, intent)


def test_an_alter_ends_a_granted_lock_fence_and_not_a_waiting_one() -> None:
    async def run() -> None:
        e = engine()
        waiting = await e.locks.before_lock(lock_body(component()))
        await settle(
            e, "lock", lock_args(component()), lock_reply("lock", 1, locks.WAITING), waiting
        )
        await alter(e)
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS  # still waiting: fenced
        check = idl.args_class("check_lock")(rqst=M.CheckLockRequest(lockid=1))
        await settle(e, "check_lock", check, lock_reply("check_lock", 1, locks.ACQUIRED))
        await alter(e)
        assert (await e.lookup(GET_TABLE)).result is Result.MISS  # granted, then altered
        assert e.metrics.lock_fences.labels("closed")._value.get() == 1

    asyncio.run(run())


DROP = write_plan("drop_table", dbname="db", name="t", deleteData=False)


def test_a_drop_ends_a_granted_lock_fence_and_not_a_waiting_one() -> None:
    async def run() -> None:
        e = engine()

        async def drop() -> None:
            intent = await e.begin_write(DROP)
            assert await e.end_write(DROP, intent)

        waiting = await e.locks.before_lock(lock_body(component()))
        await settle(
            e, "lock", lock_args(component()), lock_reply("lock", 1, locks.WAITING), waiting
        )
        await drop()
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS  # still waiting: fenced
        check = idl.args_class("check_lock")(rqst=M.CheckLockRequest(lockid=1))
        await settle(e, "check_lock", check, lock_reply("check_lock", 1, locks.ACQUIRED))
        await drop()
        assert (await e.lookup(GET_TABLE)).result is Result.MISS  # granted, then dropped
        assert e.metrics.lock_fences.labels("closed")._value.get() == 1

    asyncio.run(run())


def test_an_unlock_refused_because_its_transaction_is_open_keeps_the_fence() -> None:
    """TxnOpenException: the lock belongs to a transaction and is still held (it ends with
    the transaction). NoSuchLockException, by contrast, says there is no lock to keep."""

    async def run() -> None:
        e = engine()
        args = lock_args(component(), txnid=9)
        ticket = await e.locks.before_lock(bytes(idl.encode(args)))
        await settle(e, "lock", args, lock_reply("lock", 1, locks.ACQUIRED), ticket)
        result = idl.result_class("unlock")
        still_open = reply("unlock", result(o2=M.TxnOpenException("lock 1 is in txn 9")))
        await settle(e, "unlock", unlock_args(1), still_open)
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        gone = reply("unlock", result(o1=M.NoSuchLockException("no lock 1")))
        await settle(e, "unlock", unlock_args(1), gone)
        assert (await e.lookup(GET_TABLE)).result is Result.MISS

    asyncio.run(run())


# Short fences for the tests of their extension: long enough that the timing of a loaded
# machine does not decide the outcome, short enough that waiting past one costs little.
SHORT_FENCE = 0.6
BEFORE_IT_ENDS = 0.3


async def lock_deadline(e: CacheEngine, key: str = T_KEY) -> float:
    """When the lock fence on the version hash ``key`` ends, as the store holds it."""
    fields = (await e.store.marks([key]))[key]
    (deadline,) = {d for name, d in fields.items() if name.startswith(locks.LOCK_PREFIX)}
    return deadline


async def past(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.time()) + 0.05)


async def granted_lock(e: CacheEngine, lockid: int, table: str, txnid: int | None = None) -> None:
    args = lock_args(component(table=table), txnid=txnid)
    ticket = await e.locks.before_lock(bytes(idl.encode(args)))
    await settle(e, "lock", args, lock_reply("lock", lockid, locks.ACQUIRED), ticket)


KEEP_ALIVE = {
    "check_lock": (
        idl.args_class("check_lock")(rqst=M.CheckLockRequest(lockid=1)),
        lock_reply("check_lock", 1, locks.ACQUIRED),
    ),
    "heartbeat": (
        idl.args_class("heartbeat")(ids=M.HeartbeatRequest(lockid=1)),
        reply("heartbeat", idl.result_class("heartbeat")()),
    ),
}


@pytest.mark.parametrize("method", sorted(KEEP_ALIVE))
def test_check_lock_or_heartbeat_keeps_a_fence_past_its_first_deadline(method: str) -> None:
    request, answer = KEEP_ALIVE[method]

    async def run() -> None:
        e = engine(seconds=SHORT_FENCE)
        await granted_lock(e, 1, "t")
        first = await lock_deadline(e)
        await asyncio.sleep(BEFORE_IT_ENDS)
        await settle(e, method, request, answer)
        extended = await lock_deadline(e)
        assert extended >= first + BEFORE_IT_ENDS
        await past(first)
        assert time.time() < extended, "the test itself ran too slowly to tell"
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        await past(extended)
        assert (await e.lookup(GET_TABLE)).result is Result.MISS  # extended, not endless

    asyncio.run(run())


def test_a_transaction_heartbeat_keeps_every_lock_of_the_transaction() -> None:
    u_key = NAMING.versions(TableRef.of("db", "u").tag)
    v_key = NAMING.versions(TableRef.of("db", "v").tag)

    async def run() -> None:
        e = engine(seconds=SHORT_FENCE)
        await granted_lock(e, 1, "t", txnid=9)
        await granted_lock(e, 2, "u", txnid=9)
        await granted_lock(e, 3, "v", txnid=10)  # another transaction's
        first = {key: await lock_deadline(e, key) for key in (T_KEY, u_key, v_key)}
        await asyncio.sleep(BEFORE_IT_ENDS)
        beat = idl.args_class("heartbeat")(ids=M.HeartbeatRequest(txnid=9))
        await settle(e, "heartbeat", beat, reply("heartbeat", idl.result_class("heartbeat")()))
        for key in (T_KEY, u_key):
            assert await lock_deadline(e, key) >= first[key] + BEFORE_IT_ENDS
        assert await lock_deadline(e, v_key) == first[v_key]
        await past(max(first.values()))
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        get_u = read_plan("get_table", dbname="db", tbl_name="u")
        assert (await e.lookup(get_u)).result is Result.BYPASS
        get_v = read_plan("get_table", dbname="db", tbl_name="v")
        assert (await e.lookup(get_v)).result is Result.MISS

    asyncio.run(run())


def test_commit_or_abort_of_its_transaction_ends_a_lock_fence() -> None:
    async def run() -> None:
        e = engine()
        ticket = await e.locks.before_lock(lock_body(component(), txnid=9))
        answer = lock_reply("lock", 4, locks.ACQUIRED)
        await settle(e, "lock", lock_args(component(), txnid=9), answer, ticket)
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        commit = idl.args_class("commit_txn")(rqst=M.CommitTxnRequest(txnid=9))
        await settle(e, "commit_txn", commit, reply("commit_txn", idl.result_class("commit_txn")()))
        assert (await e.lookup(GET_TABLE)).result is Result.MISS

    asyncio.run(run())


def test_an_unlock_through_another_proxy_ends_the_fence() -> None:
    """The lock id's record is in the store: a proxy that never saw the lock ends it."""

    async def run() -> None:
        e = engine()
        ticket = await e.locks.before_lock(lock_body(component()))
        await settle(e, "lock", lock_args(component()), lock_reply("lock", 5, 1), ticket)
        other = CacheEngine(
            e.store, e.planner, Metrics(), l1_bytes=1 << 20, max_entry_bytes=1 << 20
        )
        await settle(other, "unlock", unlock_args(5), VOID_UNLOCK)
        assert (await e.lookup(GET_TABLE)).result is Result.MISS
        await e.locks.sweep()
        assert e.metrics.lock_fences_active._value.get() == 0  # seen closed elsewhere

    asyncio.run(run())


def test_a_fence_with_no_end_expires_at_its_deadline() -> None:
    async def run() -> None:
        e = engine(seconds=0.05)
        await e.locks.before_lock(lock_body(component()))
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        await asyncio.sleep(0.1)
        assert (await e.lookup(GET_TABLE)).result is Result.MISS
        await e.locks.sweep()
        assert e.metrics.lock_fences.labels("expired")._value.get() == 1
        assert e.metrics.lock_fences_active._value.get() == 0
        assert not await e.store.marks([T_KEY])

    asyncio.run(run())


def test_fences_off_fence_nothing() -> None:
    async def run() -> None:
        e = engine(seconds=0)
        await fill(e, TABLE)
        assert await e.locks.before_lock(lock_body(component())) is None
        assert (await e.lookup(GET_TABLE)).result is Result.HIT

    asyncio.run(run())


def test_a_flush_keeps_the_fences() -> None:
    async def run() -> None:
        e = engine()
        await e.locks.before_lock(lock_body(component()))
        await e.flush()
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS

    asyncio.run(run())


# -- Iceberg --------------------------------------------------------------------------------

ICEBERG_PARAMS = {
    "table_type": "iceberg",
    "metadata_location": "s3://b/t/metadata/00002.json",
    "previous_metadata_location": "s3://b/t/metadata/00001.json",
}


def commit_args(params: dict[str, str], context: dict[str, str] | None) -> Any:
    return idl.args_class("alter_table_with_environment_context")(
        dbname="db",
        tbl_name="t",
        new_tbl=M.Table(tableName="t", dbName="db", parameters=params),
        environment_context=M.EnvironmentContext(properties=context)
        if context is not None
        else None,
    )


def test_the_metastores_check_is_added_to_an_iceberg_commit_and_nothing_else_changes() -> None:
    args = commit_args(ICEBERG_PARAMS, {"DO_NOT_UPDATE_STATS": "true"})
    body = bytes(idl.encode(args))
    # A field this proxy's IDL does not know, as a newer client might send: kept as it is.
    unknown = bytes((TType.STRING,)) + (99).to_bytes(2, "big") + (3).to_bytes(4, "big") + b"new"
    body = body[:-1] + unknown + body[-1:]
    commit = iceberg.commit_shape("alter_table_with_environment_context", args)
    assert commit is not None and commit.previous == "s3://b/t/metadata/00001.json"
    guarded = iceberg.with_expected_location(args, body, commit.previous)
    assert guarded is not None
    decoded = idl.decode_args("alter_table_with_environment_context", guarded)
    assert decoded.environment_context.properties == {
        "DO_NOT_UPDATE_STATS": "true",
        "expected_parameter_key": "metadata_location",
        "expected_parameter_value": "s3://b/t/metadata/00001.json",
    }
    assert decoded.new_tbl == args.new_tbl
    before, after = field_spans(body)[0], field_spans(guarded)[0]
    for old, new in zip(before, after, strict=True):
        if old.fid != 4:
            assert body[old.start : old.end] == guarded[new.start : new.end]
    assert unknown in guarded


def test_the_check_is_added_where_there_was_no_context() -> None:
    args = commit_args(ICEBERG_PARAMS, None)
    guarded = iceberg.with_expected_location(args, bytes(idl.encode(args)), "s3://b/1.json")
    assert guarded is not None
    props = idl.decode_args("alter_table_with_environment_context", guarded).environment_context
    assert props.properties["expected_parameter_value"] == "s3://b/1.json"


@pytest.mark.parametrize(
    ("params", "context", "renamed"),
    [
        ({**ICEBERG_PARAMS, "table_type": "HIVE"}, {}, False),  # not Iceberg
        (
            {**ICEBERG_PARAMS, "previous_metadata_location": ICEBERG_PARAMS["metadata_location"]},
            {},
            False,
        ),
        ({k: v for k, v in ICEBERG_PARAMS.items() if k != "previous_metadata_location"}, {}, False),
        (ICEBERG_PARAMS, {"expected_parameter_key": "metadata_location"}, False),  # its own
        (ICEBERG_PARAMS, {}, True),  # a rename
    ],
)
def test_alters_that_cannot_be_commits_are_forwarded_as_they_came(
    params: dict[str, str], context: Any, renamed: bool
) -> None:
    args = commit_args(params, context)
    if renamed:
        args.new_tbl.tableName = "other"
    assert iceberg.commit_shape("alter_table_with_environment_context", args) is None


def test_the_current_location_is_read_from_a_get_table_req_result() -> None:
    table = M.Table(tableName="t", dbName="db", parameters=dict(ICEBERG_PARAMS))
    result = idl.encode(idl.result_class("get_table_req")(success=M.GetTableResult(table=table)))
    assert iceberg.current_location(result) == ICEBERG_PARAMS["metadata_location"]
    missing = idl.encode(idl.result_class("get_table_req")(o2=M.NoSuchObjectException("no")))
    assert iceberg.current_location(missing) is None


def test_iceberg_table_objects_are_recognised_in_replies() -> None:
    ice = M.Table(tableName="t", dbName="db", parameters={"table_type": "ICEBERG"})
    hive = M.Table(tableName="h", dbName="db", parameters={"table_type": "MANAGED"})
    one = idl.encode(idl.result_class("get_table")(success=ice))
    assert iceberg.reply_has_iceberg_table("get_table", one)
    many = idl.encode(idl.result_class("get_table_objects_by_name")(success=[hive, ice]))
    assert iceberg.reply_has_iceberg_table("get_table_objects_by_name", many)
    plain = idl.encode(idl.result_class("get_table")(success=hive))
    assert not iceberg.reply_has_iceberg_table("get_table", plain)


def test_iceberg_tables_are_served_only_while_allowed() -> None:
    async def run() -> None:
        allowed = [True]
        e = engine()
        e.serve_iceberg = lambda: allowed[0]
        ice = reply(
            "get_table",
            idl.result_class("get_table")(
                success=M.Table(tableName="t", dbName="db", parameters={"table_type": "ICEBERG"})
            ),
        )
        fp = await fill(e, ice)
        assert (await e.lookup(GET_TABLE)).result is Result.HIT
        allowed[0] = False  # the notification log stopped moving, say
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        assert not await e.fill(GET_TABLE, fp, ice)  # nor stored

    asyncio.run(run())
