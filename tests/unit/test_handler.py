"""CallHandler in process: a scripted metastore on socket pairs, the embedded store, and a
client channel that captures its bytes (no Java, no Redis, no subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from thrift.Thrift import TApplicationException

from proxy import idl
from proxy.cache.plan import Bump
from proxy.cache.store import MemoryStore
from proxy.handler import ClientGone, SessionState
from proxy.wire.binary import MessageType, encode_header
from tests.rig.raw import seqid_of, without_seqid
from tests.unit.inprocess import Client, Rig, message, request, rig
from tests.unit.scripted_hms import (
    HALF_REPLY,
    HANG,
    UNKNOWN,
    Slow,
    application_exception,
    result_of,
    table,
    until,
)

M = idl.module()
DB, T = "db", "t"
DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")


def names(*days: str) -> list[str]:
    return [f"ds={d}" for d in days]


# -- reads -----------------------------------------------------------------------------------


def test_a_hit_after_a_miss_is_the_metastores_reply_with_the_callers_seqid() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            first = await r.call(SessionState("a"), "get_table", 7, dbname=DB, tbl_name=T)
            second = await r.call(SessionState("b"), "get_table", 8, dbname=DB, tbl_name=T)
            assert first == r.hms.answer("get_table", 7, dbname=DB, tbl_name=T)
            assert second == r.hms.answer("get_table", 8, dbname=DB, tbl_name=T)
            assert seqid_of(second) == 8 and without_seqid(second) == without_seqid(first)
            assert r.hms.calls["get_table"] == 1
            assert r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 1

    asyncio.run(run())


def test_a_miss_passes_both_ways_byte_for_byte() -> None:
    """Fields the proxy's IDL does not know (a newer Hive's) reach the client as they were,
    on the miss and from the cache; the request reaches the metastore as it came."""
    newer_field = b"\x0b\x00\x63\x00\x00\x00\x04new!"  # string field 99 of Table

    def answer(seqid: int) -> bytes:
        body = idl.encode(idl.result_class("get_table")(success=table(DB, T)))
        # body ends with Table's STOP, then the result's STOP: the field goes before both.
        return encode_header("get_table", MessageType.REPLY, seqid) + (
            body[:-2] + newer_field + body[-2:]
        )

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            r.hms.raw_replies["get_table"] = answer
            call = request("get_table", 41, dbname=DB, tbl_name=T)
            client = Client()
            await r.handler.handle(SessionState("a"), call, client)
            assert client.reply() == answer(41)
            assert r.hms.received[-1].data == call.data
            assert await r.call(SessionState("b"), "get_table", 42, dbname=DB, tbl_name=T) == (
                answer(42)
            )
            assert r.hms.calls["get_table"] == 1

    asyncio.run(run())


def test_concurrent_identical_reads_share_one_upstream_call() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            slow = Slow()
            r.hms.script("get_table", slow)
            clients = [Client() for _ in range(5)]
            calls = [
                asyncio.create_task(
                    r.handler.handle(
                        SessionState(f"c{i}"),
                        request("get_table", 100 + i, dbname=DB, tbl_name=T),
                        client,
                    )
                )
                for i, client in enumerate(clients)
            ]
            # Every caller has looked up (and missed) while the first call is at the HMS.
            await until(
                lambda: (
                    r.hms.calls["get_table"] == 1
                    and r.sample("hmsproxy_cache_lookups_total", method="get_table", result="miss")
                    == 5
                )
            )
            assert not any(c.data for c in clients)
            slow.gate.set()
            await asyncio.gather(*calls)
            for i, client in enumerate(clients):
                assert client.reply() == r.hms.answer("get_table", 100 + i, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 1

    asyncio.run(run())


def test_get_partitions_by_names_is_assembled_from_cached_partitions() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS)
            s = SessionState("a")
            asked = names(DAYS[0], DAYS[1])
            reply = await r.call(
                s, "get_partitions_by_names", 1, db_name=DB, tbl_name=T, names=asked
            )
            assert reply == r.hms.answer(
                "get_partitions_by_names", 1, db_name=DB, tbl_name=T, names=asked
            )
            # Two of these are cached, one is not, one does not exist: only those two are asked.
            asked = [*names(DAYS[2], DAYS[1], DAYS[0]), "ds=1999-12-31"]
            reply = await r.call(
                s, "get_partitions_by_names", 2, db_name=DB, tbl_name=T, names=asked
            )
            assert r.hms.received[-1].args.names == [*names(DAYS[2]), "ds=1999-12-31"]
            assert reply == r.hms.answer(
                "get_partitions_by_names", 2, db_name=DB, tbl_name=T, names=asked
            )
            # All of them known now (the absent one as absent): no call at all.
            asked = ["ds=1999-12-31", *names(*DAYS)]
            reply = await r.call(
                s, "get_partitions_by_names", 3, db_name=DB, tbl_name=T, names=asked
            )
            assert reply == r.hms.answer(
                "get_partitions_by_names", 3, db_name=DB, tbl_name=T, names=asked
            )
            assert [p.values for p in result_of(reply).success] == [[d] for d in DAYS]
            assert r.hms.calls["get_partitions_by_names"] == 2

    asyncio.run(run())


def test_partitions_out_of_name_order_turn_assembly_off_and_are_cached_whole() -> None:
    """A metastore that does not answer in partition-name order (say, another database
    collation, or Impala's catalogd, which does not sort): its reply goes to the client as it
    is, and from then on nothing is assembled (every such reply is cached whole, under its
    request's own bytes)."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS)
            have = r.hms.partitions[(DB, T)]

            def unordered(conn: Any, args: Any) -> Any:
                found = [have[n] for n in sorted(set(args.names), reverse=True) if n in have]
                return idl.result_class("get_partitions_by_names")(success=found)

            r.hms.answers["get_partitions_by_names"] = unordered
            s = SessionState("a")
            asked = names(*DAYS)
            for seqid in (1, 2):
                reply = await r.call(
                    s, "get_partitions_by_names", seqid, db_name=DB, tbl_name=T, names=asked
                )
                assert reply == r.hms.answer(
                    "get_partitions_by_names", seqid, db_name=DB, tbl_name=T, names=asked
                )
            assert r.cache is not None and r.cache.partitions.assemble is False
            assert r.hms.calls["get_partitions_by_names"] == 1  # the second: cached whole
            # Two of those partitions, which an assembly would have sorted: the metastore's.
            asked = names(DAYS[0], DAYS[2])
            reply = await r.call(
                s, "get_partitions_by_names", 3, db_name=DB, tbl_name=T, names=asked
            )
            assert reply == r.hms.answer(
                "get_partitions_by_names", 3, db_name=DB, tbl_name=T, names=asked
            )
            assert [p.values for p in result_of(reply).success] == [[DAYS[2]], [DAYS[0]]]
            assert r.hms.calls["get_partitions_by_names"] == 2

    asyncio.run(run())


def test_a_subset_out_of_name_order_turns_assembly_off_too() -> None:
    """The order is checked on the replies to the proxy's own requests for the partitions
    it lacks as well: an assembled reply would be sorted where the metastore's is not."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS)
            have = r.hms.partitions[(DB, T)]
            s = SessionState("a")
            await r.call(
                s, "get_partitions_by_names", 1, db_name=DB, tbl_name=T, names=names(DAYS[0])
            )

            def unordered(conn: Any, args: Any) -> Any:
                found = [have[n] for n in sorted(set(args.names), reverse=True) if n in have]
                return idl.result_class("get_partitions_by_names")(success=found)

            r.hms.answers["get_partitions_by_names"] = unordered
            asked = names(*DAYS)
            reply = await r.call(
                s, "get_partitions_by_names", 2, db_name=DB, tbl_name=T, names=asked
            )
            assert r.hms.received[-2].args.names == names(DAYS[1], DAYS[2])  # the subset
            assert r.hms.received[-1].args.names == asked  # then the request itself
            assert reply == r.hms.answer(
                "get_partitions_by_names", 2, db_name=DB, tbl_name=T, names=asked
            )
            assert r.cache is not None and r.cache.partitions.assemble is False

    asyncio.run(run())


def test_stale_if_error_answers_from_an_expired_entry_while_the_metastore_is_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def run() -> None:
        async with rig(stale_window=300, upstream_read_timeout=0.05) as r:
            r.hms.add_table(DB, T)
            s = SessionState("a")
            first = await r.call(s, "get_table", 1, dbname=DB, tbl_name=T)
            real = time.time
            monkeypatch.setattr(time, "time", lambda: real() + 120)  # past its 60 s TTL
            r.hms.script("get_table", HANG)  # the metastore stays silent past the timeout
            again = await r.call(s, "get_table", 2, dbname=DB, tbl_name=T)
            assert without_seqid(again) == without_seqid(first) and seqid_of(again) == 2
            assert r.sample("hmsproxy_stale_replies_total", method="get_table") == 1
            # A write the proxy saw makes the stale entry unservable: an error instead.
            await r.call(s, "alter_table", 3, dbname=DB, tbl_name=T, new_tbl=table(DB, T, v="2"))
            r.hms.script("get_table", HANG)
            failed = await r.call(s, "get_table", 4, dbname=DB, tbl_name=T)
            assert failed[3] == MessageType.EXCEPTION

    asyncio.run(run())


# -- writes ----------------------------------------------------------------------------------


class GatedStore(MemoryStore):
    """The embedded store, whose invalidation after a write (``unfence``: the bumps, then
    the fence lifted) waits for ``gate`` while ``hold`` is set."""

    def __init__(self) -> None:
        super().__init__(1 << 24)
        self.hold = False
        self.gate = asyncio.Event()
        self.entered = 0  # invalidations after a write that reached the store
        self.done = 0  # and were applied

    async def unfence(
        self,
        keys: Sequence[str],
        intent: str,
        bumps: Sequence[Bump],
        also: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.entered += 1
        if self.hold:
            await self.gate.wait()
        await super().unfence(keys, intent, bumps, also)
        self.done += 1


def test_a_write_invalidates_before_its_reply_and_the_next_read_sees_it() -> None:
    async def run() -> None:
        store = GatedStore()
        async with rig(store=store) as r:
            r.hms.add_table(DB, T, v="1")
            s = SessionState("writer")
            for seqid in (1, 2):
                await r.call(s, "get_table", seqid, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 1  # cached

            store.hold = True
            client = Client()
            new = table(DB, T, v="2")
            write = asyncio.create_task(
                r.handler.handle(
                    s, request("alter_table", 3, dbname=DB, tbl_name=T, new_tbl=new), client
                )
            )
            await until(lambda: store.entered == 1)
            assert r.hms.calls["alter_table"] == 1  # the metastore has answered ...
            for _ in range(100):  # ... and however long the invalidation takes,
                await asyncio.sleep(0)
                assert not client.data  # the writer is not answered before it is done
            store.gate.set()
            await write
            assert store.done == 1
            assert client.reply() == r.hms.answer(
                "alter_table", 3, dbname=DB, tbl_name=T, new_tbl=new
            )

            reply = await r.call(s, "get_table", 4, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 2
            assert result_of(reply).success.parameters == {"v": "2"}

    asyncio.run(run())


def test_an_unknown_method_that_may_write_flushes_the_cache(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            s = SessionState("a")
            await r.call(s, "get_table", 1, dbname=DB, tbl_name=T)
            # Unknown, but named like a read: forwarded, the cache kept.
            client = Client()
            await r.handler.handle(s, message(_call_of_unknown("get_frobs", 2)), client)
            assert client.reply() == _unknown_method("get_frobs", 2)
            await r.call(s, "get_table", 3, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 1
            # Unknown, and it may change anything: the cache is flushed.
            client = Client()
            with caplog.at_level(logging.WARNING, logger="proxy"):
                await r.handler.handle(s, message(_call_of_unknown("frob_table", 4)), client)
            assert client.reply() == _unknown_method("frob_table", 4)
            assert "unknown method frob_table may change metadata" in caplog.text
            await r.call(s, "get_table", 5, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 2
            # Another within the minute flushes as well, but the log is not told again.
            with caplog.at_level(logging.WARNING, logger="proxy"):
                await r.handler.handle(s, message(_call_of_unknown("frob_other", 6)), Client())
            assert "frob_other" not in caplog.text
            await r.call(s, "get_table", 7, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 3

    asyncio.run(run())


def test_a_hive_4_background_call_is_forwarded_once_and_keeps_the_cache() -> None:
    """A compaction worker's step (no declaration in the IDL: never decoded): forwarded as it
    came, never flushing, and, being state, never sent again."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            s = SessionState("a")
            await r.call(s, "get_table", 1, dbname=DB, tbl_name=T)
            client = Client()
            await r.handler.handle(s, message(_call_of_unknown("mark_compacted", 2)), client)
            assert client.reply() == _unknown_method("mark_compacted", 2)  # this HMS is 2.3
            assert r.hms.calls["mark_compacted"] == 1
            assert r.requests("mark_compacted", "user_error") == 1
            await r.call(s, "get_table", 3, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 1

    asyncio.run(run())


def test_a_commit_invalidates_only_the_partitions_its_write_events_name() -> None:
    """commit_txn goes the lock calls' way (its fences are settled); a replicated one that
    names its writes also invalidates them, an ordinary one nothing."""
    asked = names(*DAYS)

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS)
            r.hms.answers["commit_txn"] = lambda conn, args: idl.result_class("commit_txn")()
            s = SessionState("a")

            async def read(seqid: int) -> None:
                args = {"db_name": DB, "tbl_name": T, "names": asked}
                await r.call(s, "get_partitions_by_names", seqid, **args)

            await read(1)
            await r.call(s, "commit_txn", 2, rqst=M.CommitTxnRequest(txnid=7))
            await read(3)
            assert r.hms.calls["get_partitions_by_names"] == 1
            event = M.WriteEventInfo(1, DB, T, "f", names(DAYS[1])[0])
            commit = M.CommitTxnRequest(txnid=8, writeEventInfos=[event])
            await r.call(s, "commit_txn", 4, rqst=commit)
            await read(5)
            assert r.hms.calls["get_partitions_by_names"] == 2
            assert r.hms.received[-1].args.names == names(DAYS[1])  # the other two were kept
            assert r.hms.calls["commit_txn"] == 2

    asyncio.run(run())


def _call_of_unknown(method: str, seqid: int) -> bytes:
    return encode_header(method, MessageType.CALL, seqid) + b"\x00"  # no arguments


def _unknown_method(method: str, seqid: int) -> bytes:
    return application_exception(
        method, seqid, TApplicationException.UNKNOWN_METHOD, f"Invalid method name: '{method}'"
    )


def test_unknown_method_from_the_metastore_passes_through_and_is_not_cached() -> None:
    """A metastore that does not serve a method the proxy knows (an older Hive). (Not
    get_table: a metastore without it gets it through the bridge, see test_bridge.py.)"""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            r.hms.script("get_all_tables", UNKNOWN)
            s = SessionState("a")
            reply = await r.call(s, "get_all_tables", 5, db_name=DB)
            assert reply == _unknown_method("get_all_tables", 5)
            assert r.requests("get_all_tables", "user_error") == 1
            reply = await r.call(s, "get_all_tables", 6, db_name=DB)
            assert reply == r.hms.answer("get_all_tables", 6, db_name=DB)
            assert r.hms.calls["get_all_tables"] == 2

    asyncio.run(run())


# -- identity and pinning --------------------------------------------------------------------


def _ugi(user: str) -> dict[str, object]:
    return {"user_name": user, "group_names": [f"{user}-group"]}


def test_sessions_with_different_set_ugi_never_share_a_connection() -> None:
    async def run() -> None:
        async with rig() as r:
            alice, bob, nobody = SessionState("alice"), SessionState("bob"), SessionState("x")
            await r.call(alice, "set_ugi", 1, **_ugi("alice"))
            await r.call(bob, "set_ugi", 1, **_ugi("bob"))
            key = {"key": "hive.metastore.batch.retrieve.max"}
            for seqid in range(10, 13):
                for session in (alice, bob, nobody):
                    await r.call(session, "getMetaConf", seqid, **key)
            served = [c for c in r.hms.received if c.method == "getMetaConf"]
            assert [c.user for c in served] == ["alice", "bob", None] * 3
            # Each identity's connection is reused, none is shared.
            by_user = {c.user: {x.conn for x in served if x.user == c.user} for c in served}
            assert all(len(conns) == 1 for conns in by_user.values())
            assert len(r.hms.connections) == 3
            assert all(len({u for u, _ in c.ugi}) <= 1 for c in r.hms.connections)

    asyncio.run(run())


def test_a_repeated_set_ugi_is_answered_without_a_round_trip() -> None:
    async def run() -> None:
        async with rig() as r:
            await r.call(SessionState("first"), "set_ugi", 1, **_ugi("alice"))
            again = SessionState("again")
            reply = await r.call(again, "set_ugi", 9, **_ugi("alice"))
            assert reply == r.hms.answer("set_ugi", 9, **_ugi("alice"))
            assert r.hms.calls["set_ugi"] == 1
            await r.call(again, "getMetaConf", 10, key="k")
            assert r.hms.received[-1].user == "alice"  # the connection alice's set_ugi bound
            assert r.hms.calls["set_ugi"] == 1

    asyncio.run(run())


def test_set_meta_conf_pins_a_connection_that_closes_with_the_session() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            pinned, other = SessionState("pinned"), SessionState("other")
            key = "hive.metastore.batch.retrieve.max"
            await r.call(pinned, "setMetaConf", 1, key=key, value="7")
            own = r.hms.received[-1].conn
            assert result_of(await r.call(pinned, "getMetaConf", 2, key=key)).success == "7"
            assert result_of(await r.call(other, "getMetaConf", 21, key=key)).success == ""
            for seqid in (3, 4):  # nor are its reads cached: its configuration is its own
                await r.call(pinned, "get_table", seqid, dbname=DB, tbl_name=T)
            await r.call(other, "get_table", 25, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 3
            # The pinned session's calls all went on its own connection, nobody else's did.
            calls = r.hms.received
            assert {c.conn for c in calls if c.seqid < 20} == {own}
            assert own not in {c.conn for c in calls if c.seqid > 20}

            r.handler.end_session(pinned)
            await until(lambda: r.hms.connections[own - 1].closed)
            assert r.active == 0

    asyncio.run(run())


# -- failures --------------------------------------------------------------------------------


def test_the_metastore_hanging_up_mid_reply_ends_the_client_and_frees_the_slot() -> None:
    async def run() -> None:
        async with rig(upstream_max_connections=1, upstream_max_idle=1) as r:
            r.hms.add_table(DB, T)
            r.hms.script("get_table", HALF_REPLY)
            client = Client()
            with pytest.raises(ClientGone):
                await r.handler.handle(
                    SessionState("a"), request("get_table", 1, dbname=DB, tbl_name=T), client
                )
            whole = r.hms.answer("get_table", 1, dbname=DB, tbl_name=T)
            assert whole.startswith(client.data) and len(client.data) < len(whole)
            assert r.hms.connections[0].closed
            assert r.active == 0 and r.idle == 0
            assert r.requests("get_table", "upstream_error") == 1
            # The one slot is free: the next call gets a new connection, and is answered.
            reply = await r.call(SessionState("b"), "get_table", 2, dbname=DB, tbl_name=T)
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert len(r.hms.connections) == 2

    asyncio.run(run())


def test_a_metastore_that_stops_answering_gets_the_client_an_error() -> None:
    async def run() -> None:
        async with rig(upstream_read_timeout=0.05) as r:
            r.hms.add_table(DB, T)
            r.hms.script("get_table", HANG)
            reply = await r.call(SessionState("a"), "get_table", 3, dbname=DB, tbl_name=T)
            exc = result_of(reply)
            assert isinstance(exc, TApplicationException) and seqid_of(reply) == 3
            assert exc.type == TApplicationException.INTERNAL_ERROR
            assert "metastore call failed" in exc.message
            await until(lambda: r.hms.connections[0].closed)  # discarded: its reply may come
            assert r.active == 0 and r.idle == 0

    asyncio.run(run())


class FencingStore(MemoryStore):
    """The embedded store, fencing writes as the Redis store does (a crash-safety mark on the
    hash while the write is at the metastore: reads bypass the cache meanwhile)."""

    async def fence(self, keys: Sequence[str], intent: str, seconds: float, bumps: Any) -> Any:
        await self.mark([(k, intent) for k in keys], time.time() + seconds)
        return await super().fence(keys, intent, seconds, bumps)

    async def unfence(self, keys: Sequence[str], intent: str, bumps: Any, also: Any = ()) -> None:
        await super().unfence(keys, intent, bumps, also)
        await self.unmark([(k, intent) for k in keys])


@pytest.mark.parametrize("fencing", [False, True], ids=["embedded", "fencing"])
def test_reads_of_a_table_being_written_share_one_metastore_call_and_none_is_older(
    fencing: bool,
) -> None:
    # While a write is at the metastore, identical reads of its table share metastore calls
    # instead of each making their own (no stampede on a hot table): the miss's single
    # flight on the embedded store; where the write fences the table (as with Redis), fenced
    # reads taking turns, each sharing a call sent after it arrived. A read that arrives
    # after the write is acknowledged gets the written table, not the shared older answer.
    async def run() -> None:
        store = FencingStore(1 << 24) if fencing else MemoryStore(1 << 24)
        async with rig(store=store) as r:
            r.hms.add_table(DB, T, v="1")
            writer = SessionState("writer")
            await r.call(writer, "get_table", 1, dbname=DB, tbl_name=T)  # cached
            write_gate, read_gate = Slow(), Slow()
            r.hms.script("alter_table", write_gate)
            new = table(DB, T, v="2")
            write = asyncio.create_task(
                r.handler.handle(
                    writer, request("alter_table", 2, dbname=DB, tbl_name=T, new_tbl=new), Client()
                )
            )
            await until(lambda: r.hms.calls["alter_table"] == 1, "the write at the metastore")
            old = r.hms.answer("get_table", 1, dbname=DB, tbl_name=T)
            r.hms.script("get_table", read_gate)  # the first read is held at the metastore
            readers = [Client() for _ in range(20)]
            reads = [
                asyncio.create_task(
                    r.handler.handle(
                        SessionState(f"r{i}"),
                        request("get_table", 100 + i, dbname=DB, tbl_name=T),
                        client,
                    )
                )
                for i, client in enumerate(readers)
            ]
            looked = "bypass" if fencing else "miss"
            await until(
                lambda: (
                    r.sample("hmsproxy_cache_lookups_total", method="get_table", result=looked)
                    >= 20
                ),
                "every read looked up",
            )
            await until(lambda: r.hms.calls["get_table"] == 2, "one read at the metastore")
            for _ in range(100):  # time for any other read to reach the metastore too
                await asyncio.sleep(0)
            assert r.hms.calls["get_table"] == 2  # the fill before the write, and one read
            read_gate.gate.set()
            await asyncio.gather(*reads)
            for i, client in enumerate(readers):
                assert without_seqid(client.reply()) == without_seqid(old)
                assert seqid_of(client.reply()) == 100 + i
            # Fenced reads take turns: the one at the metastore, then one call for the 19
            # readers that arrived while it was there (sent after they came).
            reads_made = r.hms.calls["get_table"] - 1
            assert reads_made == (2 if fencing else 1)
            shared = r.sample("hmsproxy_shared_reads_total", method="get_table")
            assert shared == (18 if fencing else 0)
            r.hms.tables[(DB, T)] = new  # what the held write does at the metastore
            write_gate.gate.set()
            await write
            after = await r.call(SessionState("late"), "get_table", 7, dbname=DB, tbl_name=T)
            assert after == r.hms.answer("get_table", 7, dbname=DB, tbl_name=T)
            assert after != old and r.hms.calls["get_table"] == reads_made + 2

    asyncio.run(run())


@contextlib.asynccontextmanager
async def early_fenced_read(r: Rig) -> AsyncIterator[tuple[asyncio.Task[None], Client, Slow]]:
    """A write of ``T`` held at the metastore (it fences the table), and a read of ``T`` sent
    after it, held at the metastore too: (that read's task, its client, the gate that lets
    its answer through). The write is let through on leaving."""
    r.hms.add_table(DB, T, v="1")
    writer = SessionState("writer")
    await r.call(writer, "get_table", 1, dbname=DB, tbl_name=T)
    write_gate, read_gate = Slow(), Slow()
    r.hms.script("alter_table", write_gate)
    write = asyncio.create_task(
        r.handler.handle(
            writer,
            request("alter_table", 2, dbname=DB, tbl_name=T, new_tbl=table(DB, T, v="2")),
            Client(),
        )
    )
    await until(lambda: r.hms.calls["alter_table"] == 1, "the write at the metastore")
    r.hms.script("get_table", read_gate)
    first = Client()
    early = asyncio.create_task(
        r.handler.handle(
            SessionState("early"), request("get_table", 10, dbname=DB, tbl_name=T), first
        )
    )
    await until(lambda: r.hms.calls["get_table"] == 2, "the early read at the metastore")
    try:
        yield early, first, read_gate
    finally:
        write_gate.gate.set()
        await write


def test_a_fenced_read_never_shares_a_call_sent_before_it_arrived() -> None:
    # Iceberg's lost commit, in miniature: a read of a fenced table is at the metastore when
    # another writer commits straight to the metastore (no version changes here until the
    # notification log says so). A read that arrives after that commit must get it: it may
    # share only a call sent after it came, never the one already at the metastore.
    async def run() -> None:
        async with (
            rig(store=FencingStore(1 << 24)) as r,
            early_fenced_read(r) as (early, first, read_gate),
        ):
            r.hms.tables[(DB, T)] = table(DB, T, v="3")  # committed around the proxy
            late = [Client() for _ in range(5)]
            reads = [
                asyncio.create_task(
                    r.handler.handle(
                        SessionState(f"l{i}"),
                        request("get_table", 20 + i, dbname=DB, tbl_name=T),
                        c,
                    )
                )
                for i, c in enumerate(late)
            ]
            await until(
                lambda: (
                    r.sample("hmsproxy_cache_lookups_total", method="get_table", result="bypass")
                    == 6
                ),
                "the late reads looked up",
            )
            read_gate.gate.set()
            await asyncio.gather(early, *reads)
            committed = r.hms.answer("get_table", 0, dbname=DB, tbl_name=T)
            assert without_seqid(first.reply()) != without_seqid(committed)  # sent before it
            for c in late:
                assert without_seqid(c.reply()) == without_seqid(committed)
            assert r.hms.calls["get_table"] == 3  # the early read, then one for the five

    asyncio.run(run())


def test_fenced_readers_whose_leader_went_before_sending_still_share_one_call() -> None:
    # Five reads arrive while a fenced read is at the metastore; the first of them, which
    # would send the next call for all five, is cancelled (its client gone) before it sends.
    # The other four take turns again and share one call, instead of asking one each.
    async def run() -> None:
        async with (
            rig(store=FencingStore(1 << 24)) as r,
            early_fenced_read(r) as (early, _, read_gate),
        ):
            late = [Client() for _ in range(5)]
            reads = []
            for i, c in enumerate(late):
                reads.append(
                    asyncio.create_task(
                        r.handler.handle(
                            SessionState(f"l{i}"),
                            request("get_table", 20 + i, dbname=DB, tbl_name=T),
                            c,
                        )
                    )
                )
                await until(
                    lambda i=i: (
                        r.sample(  # type: ignore[misc]
                            "hmsproxy_cache_lookups_total", method="get_table", result="bypass"
                        )
                        == 2 + i
                    ),
                    "the late read looked up",
                )
            reads[0].cancel()  # the one the other four joined, before it could send
            with pytest.raises(asyncio.CancelledError):
                await reads[0]
            read_gate.gate.set()
            await asyncio.gather(early, *reads[1:])
            assert r.hms.calls["get_table"] == 3  # the early read, then one for the four
            assert r.sample("hmsproxy_shared_reads_total", method="get_table") == 3
            answer = r.hms.answer("get_table", 0, dbname=DB, tbl_name=T)
            for c in late[1:]:
                assert without_seqid(c.reply()) == without_seqid(answer)

    asyncio.run(run())
