"""The engine's rules, on the embedded store: hits, no stale fill, pending invalidations."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from proxy import idl
from proxy.cache.decide import storable
from proxy.cache.engine import Result
from proxy.cache.plan import Bump
from proxy.cache.store import CacheUnavailable, MemoryStore
from proxy.retry import Backoff
from proxy.wire.binary import parse_header
from proxy.wire.framing import Message
from tests.unit.helpers import (
    GET_TABLE,
    TABLE,
    FlakyStore,
    engine,
    fill,
    read_plan,
    reply,
    write_plan,
)
from tests.unit.scripted_hms import until

M = idl.module()


MISSING = reply("get_table", idl.result_class("get_table")(o2=M.NoSuchObjectException("no")))
ALTER = write_plan(
    "alter_table", dbname="db", tbl_name="t", new_tbl=M.Table(tableName="t", dbName="db")
)


def test_a_filled_reply_is_served_until_a_write() -> None:
    async def run() -> None:
        e = engine()
        await fill(e, TABLE)
        hit = await e.lookup(GET_TABLE)
        assert hit.result is Result.HIT and hit.reply == TABLE.data
        await e.invalidate(ALTER, "write")
        assert (await e.lookup(GET_TABLE)).result is Result.MISS

    asyncio.run(run())


def test_a_fill_that_raced_a_write_is_never_served() -> None:
    async def run() -> None:
        e = engine()
        look = await e.lookup(GET_TABLE)
        fp = await e.fill_fingerprint(GET_TABLE, look)  # read before the upstream call
        assert fp is not None
        await e.invalidate(ALTER, "write")  # the write lands while the call is in flight
        await e.fill(GET_TABLE, fp, TABLE)  # the pre-write reply arrives and is stored
        assert (await e.lookup(GET_TABLE)).result is Result.MISS

    asyncio.run(run())


def test_not_found_is_cached_until_the_create() -> None:
    async def run() -> None:
        e = engine()
        await fill(e, MISSING)
        assert (await e.lookup(GET_TABLE)).result is Result.NEGATIVE_HIT
        await e.invalidate(
            write_plan("create_table", tbl=M.Table(tableName="T", dbName="DB")), "write"
        )
        assert (await e.lookup(GET_TABLE)).result is Result.MISS

    asyncio.run(run())


def test_other_declared_exceptions_are_not_cached() -> None:
    meta = reply("get_table", idl.result_class("get_table")(o1=M.MetaException("boom")))
    assert storable(GET_TABLE, meta, max_bytes=1 << 20, serve_iceberg=True) is None
    assert storable(GET_TABLE, TABLE, max_bytes=1 << 20, serve_iceberg=True) == (0, GET_TABLE.ttl)
    tables = reply("get_all_tables", idl.result_class("get_all_tables")(success=["t"]))
    plan = read_plan("get_all_tables", db_name="db")
    assert storable(plan, tables, max_bytes=1 << 20, serve_iceberg=True) == (0, plan.ttl)
    assert storable(plan, tables, max_bytes=len(tables.data) - 1, serve_iceberg=True) is None


def test_an_invalidation_the_store_missed_blocks_hits_until_applied() -> None:
    async def run() -> None:
        store = FlakyStore()
        e = engine(store)
        await fill(e, TABLE)
        store.down = True
        assert not await e.invalidate(ALTER, "write")  # kept pending
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        store.down = False
        # The store is back with the old entry still in it: the pending bump goes first.
        assert (await e.lookup(GET_TABLE)).result is Result.MISS

    asyncio.run(run())


class BusyStore(FlakyStore):
    """Refuses its next ``failures`` bumps (a store late under load), takes a turn over
    each (as a store across a network does), and keeps the keys of those it took."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0
        self.bumped: list[str] = []

    async def bump(self, bumps: Sequence[Bump]) -> None:
        self.attempts += 1
        await asyncio.sleep(0)
        if self.failures:
            self.failures -= 1
            raise CacheUnavailable("busy")
        await super().bump(bumps)
        self.bumped += [b.key for b in bumps]


ALTER_U = write_plan(
    "alter_table", dbname="db", tbl_name="u", new_tbl=M.Table(tableName="u", dbName="db")
)


def test_an_invalidation_the_store_refused_is_retried_without_a_look_up() -> None:
    async def run() -> None:
        store = BusyStore(failures=3)
        e = engine(store)
        e.invalidations.retry_backoff = lambda: Backoff(base=0.0, cap=0.0)  # no waiting here
        assert not await e.invalidate(ALTER, "write")  # kept pending
        await until(lambda: not e.invalidations.pending, "the pending invalidation applied")
        assert store.attempts == 4  # three refused, one taken, and none asked by a look-up
        assert (await e.lookup(GET_TABLE)).result is Result.MISS  # hits no longer bypassed

    asyncio.run(run())


def test_look_ups_applying_pending_invalidations_at_once_lose_none_and_send_them_once() -> None:
    async def run() -> None:
        store = BusyStore()
        e = engine(store)
        e.invalidations.retry_backoff = lambda: Backoff(base=3600.0, cap=3600.0)  # not now
        store.down = True
        assert not await e.invalidate(ALTER, "write")
        assert not await e.invalidate(ALTER_U, "write")
        store.down = False
        before = len(store.bumped)
        results = await asyncio.gather(*(e.invalidations.settled() for _ in range(3)))
        # One applies them; the others bypass the cache meanwhile instead of sending the
        # same commands again (a herd on a Redis that has just come back).
        assert results.count(True) == 1
        assert not e.invalidations.pending
        assert {b.key for b in ALTER.bumps + ALTER_U.bumps} <= set(store.bumped)
        assert sorted(store.bumped[before:]) == sorted(b.key for b in ALTER.bumps + ALTER_U.bumps)

    asyncio.run(run())


class ScriptedRead:
    """A client's read as the read-through sees it, with a metastore that answers ``reply``
    when ``release`` is set; it records what the client got and how many calls went out."""

    def __init__(self, message: Message, reply: Message, release: asyncio.Event) -> None:
        self.message = message
        self.reply = reply
        self.release = release
        self.upstream_calls = 0
        self.got: list[bytes] = []

    async def serve(self, cached: bytes) -> str:
        self.got.append(cached)
        return "ok"

    async def send(self, reply: bytes) -> str:
        self.got.append(reply)
        return "ok"

    async def forward(self, keep: Any, fallback: Any) -> str:
        self.upstream_calls += 1
        await self.release.wait()
        if keep is not None:
            await keep(self.reply)
        self.got.append(self.reply.data)
        return "ok"

    async def fetch(self, request: bytes | None) -> Message | str:
        self.upstream_calls += 1
        await self.release.wait()
        return self.reply


def call(method: str, **args: Any) -> Message:
    data = idl.encode_call(method, 7, **args)
    header = parse_header(data, 0, len(data))
    assert header is not None
    return Message(header, data)


def test_concurrent_misses_of_one_request_share_one_metastore_call() -> None:
    async def run() -> None:
        e = engine()
        release = asyncio.Event()
        request = call("get_table", dbname="db", tbl_name="t")
        reads = [ScriptedRead(request, TABLE, release) for _ in range(5)]
        tasks = [asyncio.create_task(e.whole.read(GET_TABLE, r)) for r in reads]
        await until(lambda: e.whole._flights, "the first miss is on its way to the metastore")
        for _ in range(20):
            await asyncio.sleep(0)  # the others look up and join it (or miss the flight)
        release.set()
        served = await asyncio.gather(*tasks)
        assert sum(r.upstream_calls for r in reads) == 1
        assert sorted(s.source for s in served) == ["cache"] * 4 + ["upstream"]
        assert all(r.got == [TABLE.data] for r in reads)
        # A read under other versions (after a write) flies alone.
        await e.invalidate(ALTER, "write")
        release.clear()
        after = [ScriptedRead(request, TABLE, release) for _ in range(2)]
        first = asyncio.create_task(e.whole.read(GET_TABLE, after[0]))
        await until(lambda: e.whole._flights, "the first read is in flight")
        await e.invalidate(ALTER, "write")
        second = asyncio.create_task(e.whole.read(GET_TABLE, after[1]))
        await until(lambda: after[1].upstream_calls, "the second read went to the metastore")
        release.set()
        await asyncio.gather(first, second)
        assert [r.upstream_calls for r in after] == [1, 1]

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_the_flight_to_the_others() -> None:
    async def run() -> None:
        e = engine()
        release = asyncio.Event()
        request = call("get_table", dbname="db", tbl_name="t")
        reads = [ScriptedRead(request, TABLE, release) for _ in range(3)]
        leader = asyncio.create_task(e.whole.read(GET_TABLE, reads[0]))
        await until(lambda: e.whole._flights, "the leader is on its way to the metastore")
        waiters = [asyncio.create_task(e.whole.read(GET_TABLE, r)) for r in reads[1:]]
        for _ in range(20):
            await asyncio.sleep(0)  # both waiters join the flight
        waiters[0].cancel()  # its client went away, say
        release.set()
        served, other = await asyncio.gather(leader, waiters[1])
        assert waiters[0].cancelled()
        assert (served.source, other.source) == ("upstream", "cache")
        assert reads[0].got == reads[2].got == [TABLE.data]
        assert sum(r.upstream_calls for r in reads) == 1

    asyncio.run(run())


def test_waiters_of_a_leader_that_fails_or_is_cancelled_ask_the_metastore_themselves() -> None:
    class Failing(ScriptedRead):
        async def forward(self, keep: Any, fallback: Any) -> str:
            self.upstream_calls += 1
            await self.release.wait()
            raise RuntimeError("the leader's call broke")

    async def run() -> None:
        for ending in ("raises", "cancelled"):
            e = engine()
            release, later = asyncio.Event(), asyncio.Event()
            request = call("get_table", dbname="db", tbl_name="t")
            first = Failing(request, TABLE, release)
            leader = asyncio.create_task(e.whole.read(GET_TABLE, first))
            await until(lambda: e.whole._flights, "the leader is on its way")  # noqa: B023
            second = ScriptedRead(request, TABLE, later)
            waiter = asyncio.create_task(e.whole.read(GET_TABLE, second))
            for _ in range(20):
                await asyncio.sleep(0)
            if ending == "raises":
                release.set()
            else:
                leader.cancel()
            await asyncio.gather(leader, return_exceptions=True)
            assert not e.whole._flights
            later.set()
            served = await waiter
            assert (served.source, second.upstream_calls, second.got) == (
                "upstream",
                1,
                [TABLE.data],
            ), ending

    asyncio.run(run())


class LateFenceStore(MemoryStore):
    """Fences recorded as Redis keeps them; the fence call's reply can come too late (the
    fence is set, the caller sees a timeout), and unfencing can fail."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.fences: set[str] = set()
        self.fence_reply_late = False
        self.down = False

    async def fence(
        self, keys: Sequence[str], intent: str, seconds: float, bumps: Any
    ) -> dict[str, list[str]]:
        self.fences.add(intent)
        granted = await super().fence(keys, intent, seconds, bumps)
        if self.fence_reply_late:
            raise CacheUnavailable("redis did not answer in 0.05 s")
        return granted

    async def unfence(self, keys: Sequence[str], intent: str, bumps: Any, also: Any = ()) -> None:
        if self.down:
            raise CacheUnavailable("down")
        await super().unfence(keys, intent, bumps, also)
        self.fences.discard(intent)


def test_a_fence_whose_reply_came_late_is_lifted_after_the_write() -> None:
    async def run() -> None:
        store = LateFenceStore()
        e = engine(store)
        store.fence_reply_late = True
        intent = await e.begin_write(ALTER)
        assert store.fences  # Redis took it, though the proxy could not tell
        assert await e.end_write(ALTER, intent)
        assert not store.fences  # not left to its deadline

    asyncio.run(run())


def test_a_fence_that_could_not_be_lifted_is_lifted_with_the_pending_invalidation() -> None:
    async def run() -> None:
        store = LateFenceStore()
        e = engine(store)
        intent = await e.begin_write(ALTER)
        store.down = True
        assert not await e.end_write(ALTER, intent)  # pending: no hits meanwhile
        assert (await e.lookup(GET_TABLE)).result is Result.BYPASS
        store.down = False
        assert (await e.lookup(GET_TABLE)).result is Result.MISS
        assert not store.fences

    asyncio.run(run())
