"""The freshness check (proxy.freshness) in process: hits taken where the ordinary way answers
them (proxy.cache.sampling), re-read from a scripted metastore, compared; a stale one
counted, logged and its table answered from the metastore; writes in between never counted.
A stale one is a mismatch (alerted on) only with the notification log followed and a method
whose replies its events cover; otherwise it is unlogged (expected within the TTL).
Time is the test's own (a clock and a sleep the check is given): nothing waits on real time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from proxy import idl
from proxy.cache.keys import TableRef
from proxy.cache.sampling import Sample, Sampler
from proxy.catalog import EVERYTHING_OF_A_TABLE, Kind, Scope, all_methods, lookup
from proxy.freshness import (
    CHANGED,
    FAILED,
    MATCH,
    MISMATCH,
    UNDECIDED,
    UNLOGGED,
    FreshnessCheck,
    same_reply,
    unlogged,
)
from proxy.handler import SessionState
from proxy.metrics import Metrics
from tests.unit.helpers import at_once, call_once, connect, get_table, listening
from tests.unit.inprocess import Rig, options, request, rig
from tests.unit.scripted_hms import (
    HANG_UP,
    partition,
    reply_message,
    result_of,
    table,
    until,
)

M = idl.module()
DB, T = "db", "t"
DAYS = ("2024-01-01", "2024-01-02")


class Clock:
    """The check's clock and sleep: a sleep moves the clock on, then runs ``during`` (what
    happens meanwhile), or waits for ``gate`` when one is set."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.during: Callable[[], Awaitable[None]] | None = None
        self.gate: asyncio.Event | None = None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.during is not None:
            await self.during()
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)


@dataclass
class Follower:
    """The notification follower as the check sees it: its position in the store."""

    last_key: str
    following: bool = True


async def followed(r: Rig, head: int = 7) -> Follower:
    """The notification log followed, its follower at the log's head: a difference found
    is then judged at once (after two polls, on the check's clock)."""
    assert r.cache is not None
    result = idl.result_class("get_current_notificationEventId")
    r.hms.answers["get_current_notificationEventId"] = lambda conn, args: result(
        success=M.CurrentNotificationEventId(eventId=head)
    )
    follower = Follower(r.cache.naming.coordination("last_event"))
    await r.cache.store.set_if_leader(follower.last_key, str(head).encode(), "", "")
    return follower


def checker(
    r: Rig, clock: Clock | None = None, follower: Follower | None = None, **values: Any
) -> FreshnessCheck:
    assert r.cache is not None
    clock = clock or Clock()
    opts = options(
        freshness_check_rate=values.pop("rate", 1),
        freshness_quarantine=values.pop("quarantine", 300),
        **values,
    )
    return FreshnessCheck(
        opts,
        r.cache,
        r.handler.forwarder,
        r.pool,
        r.metrics,
        follower,
        clock=clock,
        sleep=clock.sleep,
    )


async def read_table(r: Rig, seqid: int = 1) -> Any:
    return result_of(await r.call(SessionState("c"), "get_table", seqid, dbname=DB, tbl_name=T))


async def alter(r: Rig, **parameters: str) -> None:
    """alter_table through the proxy (a write it invalidates for)."""
    new = table(DB, T, **parameters)
    await r.call(SessionState("w"), "alter_table", 50, dbname=DB, tbl_name=T, new_tbl=new)


async def waiting(r: Rig, check: FreshnessCheck) -> asyncio.Task[str]:
    """The check, waiting for the next hit."""
    assert r.cache is not None
    task = asyncio.create_task(check.check_next())
    await until(lambda: r.cache is not None and r.cache.freshness.want, "the check waiting")
    return task


async def sample_of_a_hit(r: Rig) -> Sample:
    """A get_table hit as the sampler records it (the table cached first)."""
    assert r.cache is not None
    taken = asyncio.create_task(r.cache.freshness.next())
    await until(lambda: r.cache is not None and r.cache.freshness.want, "the sampler waiting")
    await read_table(r, 2)
    return await taken


class Recording(Sampler):
    """A sampler that keeps what the hit path offers it."""

    __slots__ = ("offered",)

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[Sample] = []

    def offer(self, sample: Sample) -> None:
        self.offered.append(sample)
        super().offer(sample)


def checks(r: Rig, result: str) -> float:
    return r.sample("hmsproxy_freshness_checks_total", result=result)


def freshness_invalidations(r: Rig) -> float:
    return r.sample("hmsproxy_invalidations_total", scope="table", reason="freshness")


# -- a stale hit ------------------------------------------------------------------------------


def test_a_stale_hit_is_counted_logged_and_its_table_answered_from_the_metastore(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the log followed, a table's object (which its events cover) stale with no write
    nor event to explain it: a mismatch, the one result alerted on."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            await read_table(r)  # cached
            # Changed at the metastore, no write through the proxy, no version moved (what
            # a name the cache keys apart, or an event the follower skipped, looks like).
            r.hms.tables[(DB, T)] = table(DB, T, v="2")
            check = checker(r, follower=await followed(r))
            task = await waiting(r, check)
            served = await read_table(r, 2)
            assert served.success.parameters == {"v": "1"}  # the stale hit
            with caplog.at_level(logging.INFO, logger="proxy.freshness"):
                assert await task == MISMATCH
            assert checks(r, "mismatch") == 1 and checks(r, "unlogged") == 0
            assert r.sample("hmsproxy_freshness_mismatches_total", method="get_table") == 1
            assert freshness_invalidations(r) == 1
            (record,) = [x for x in caplog.records if x.name == "proxy.freshness"]
            line = record.getMessage()
            assert record.levelno == logging.WARNING
            assert "get_table" in line and "db.t" in line and "300 s" in line
            # From now on the metastore answers, hit path or not, while the quarantine lasts.
            calls = r.hms.calls["get_table"]
            for seqid in (3, 4):
                assert (await read_table(r, seqid)).success.parameters == {"v": "2"}
            assert r.hms.calls["get_table"] == calls + 2
            message = request("get_table", 5, dbname=DB, tbl_name=T)
            assert r.handler.serve_hit_now(SessionState("c"), message, lambda _: None) is None

    asyncio.run(run())


def test_a_stale_reply_assembled_from_partitions_is_found_too() -> None:
    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            r.cache.freshness = sampler = Recording()
            r.hms.add_table(DB, T, *DAYS)
            names = [f"ds={d}" for d in DAYS]
            asked = {"db_name": DB, "tbl_name": T, "names": names}
            await r.call(SessionState("c"), "get_partitions_by_names", 1, **asked)
            changed = partition(DB, T, DAYS[0])
            changed.parameters = {"numFiles": "2"}
            r.hms.partitions[(DB, T)][names[0]] = changed
            task = await waiting(r, checker(r, follower=await followed(r)))
            served = await r.call(SessionState("c"), "get_partitions_by_names", 2, **asked)
            assert result_of(served).success[0].parameters == {"numFiles": "1"}  # stale
            assert await task == MISMATCH
            (sample,) = sampler.offered
            assert sample.stamp is not None  # assembled, under the versions it was judged
            again = await r.call(SessionState("c"), "get_partitions_by_names", 3, **asked)
            assert result_of(again).success[0].parameters == {"numFiles": "2"}

    asyncio.run(run())


def test_hits_answered_at_once_are_sampled_by_the_ordinary_way() -> None:
    """A connection's repeated call (answered again by its kept answer) and Trino's call on
    a connection of its own both decline while the check waits, and the ordinary way
    samples them."""

    async def run() -> None:
        async with listening() as (r, port):
            r.hms.add_table(DB, T, v="1")
            r.hms.add_table(DB, "u", v="1")
            other = idl.encode_call("get_table", 1, dbname=DB, tbl_name="u")
            await call_once(r, port, other)
            await call_once(r, port, other)  # a hit answered at once, kept for any connection
            client = await connect(r, port)
            try:
                await client.call(get_table(1))
                before = at_once(r)
                await client.call(get_table(2))  # answered at once
                assert at_once(r) == before + 1
                assert r.cache is not None
                check = checker(r, follower=await followed(r))
                task = await waiting(r, check)
                await call_once(r, port, other)
                assert await task == MATCH
                assert at_once(r) == before + 1  # that call took the ordinary way
                r.hms.tables[(DB, T)] = table(DB, T, v="2")
                task = await waiting(r, check)
                await client.call(get_table(3))  # would be answered again: declines
                assert await task == MISMATCH
                fresh = result_of(await client.call(get_table(4)))
                assert fresh.success.parameters == {"v": "2"}
            finally:
                await client.close()

    asyncio.run(run())


# -- stale, but not what the log shows: unlogged -------------------------------------------------


def unlogged_line(caplog: pytest.LogCaptureFixture) -> str:
    """The one line the check logged, at info (an unlogged one is no warning)."""
    (record,) = [x for x in caplog.records if x.name == "proxy.freshness"]
    assert record.levelno == logging.INFO
    return record.getMessage()


@pytest.mark.parametrize("follower", [None, Follower("unused", following=False)])
def test_without_the_log_followed_a_stale_hit_is_unlogged_and_still_quarantined(
    follower: Follower | None, caplog: pytest.LogCaptureFixture
) -> None:
    """No follower (--notifications off), or one not following just then: a write straight
    at the metastore is stale within the TTL by design. Counted apart, logged at info, not
    a mismatch; its table is answered from the metastore all the same."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            r.hms.tables[(DB, T)] = table(DB, T, v="2")
            task = await waiting(r, checker(r, follower=follower))
            assert (await read_table(r, 2)).success.parameters == {"v": "1"}
            with caplog.at_level(logging.INFO, logger="proxy.freshness"):
                assert await task == UNLOGGED
            assert checks(r, "unlogged") == 1 and checks(r, "mismatch") == 0
            assert r.sample("hmsproxy_freshness_mismatches_total", method="get_table") == 0
            line = unlogged_line(caplog)
            assert "get_table" in line and "db.t" in line and "not followed" in line
            assert r.hms.calls["get_current_notificationEventId"] == 0  # nothing to wait for
            # Quarantined: the metastore answers, hit path or not.
            assert freshness_invalidations(r) == 1
            calls = r.hms.calls["get_table"]
            assert (await read_table(r, 3)).success.parameters == {"v": "2"}
            assert r.hms.calls["get_table"] == calls + 1
            message = request("get_table", 4, dbname=DB, tbl_name=T)
            assert r.handler.serve_hit_now(SessionState("c"), message, lambda _: None) is None

    asyncio.run(run())


def test_a_follower_that_stops_following_while_awaited_leaves_the_difference_unlogged() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            follower = await followed(r, head=9)
            assert r.cache is not None
            await r.cache.store.set_if_leader(follower.last_key, b"8", "", "")  # behind
            await read_table(r)
            r.hms.tables[(DB, T)] = table(DB, T, v="2")
            clock = Clock()

            async def stop_following() -> None:
                follower.following = False

            clock.during = stop_following
            check = checker(r, clock, follower, notification_poll=1, follower_lease=5)
            assert await check.check(await sample_of_a_hit(r)) == UNLOGGED
            assert clock.now < 5  # not left undecided after a lease

    asyncio.run(run())


def column_statistics(value: int) -> Any:
    desc = M.ColumnStatisticsDesc(isTblLevel=True, dbName=DB, tableName=T)
    data = M.ColumnStatisticsData(longStats=M.LongColumnStatsData(numNulls=0, numDVs=value))
    return M.ColumnStatistics(statsDesc=desc, statsObj=[M.ColumnStatisticsObj("c", "bigint", data)])


@pytest.mark.parametrize(
    "method, args, answer",
    [
        (
            "get_table_column_statistics",
            {"db_name": DB, "tbl_name": T, "col_name": "c"},
            column_statistics,
        ),
        (
            "get_aggr_stats_for",
            {
                "request": M.PartitionsStatsRequest(
                    dbName=DB, tblName=T, colNames=["c"], partNames=[f"ds={DAYS[0]}"]
                )
            },
            lambda value: M.AggrStats(colStats=column_statistics(value).statsObj, partsFound=1),
        ),
    ],
)
def test_stale_column_statistics_are_unlogged_with_the_log_followed(
    method: str,
    args: dict[str, Any],
    answer: Callable[[int], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """HMS 2.3 and 3.1 log no event for statistics updated straight at them (ANALYZE on
    Spark's own client): the log cannot rule such a difference out."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, DAYS[0])
            stats = {"value": 10}
            result = idl.result_class(method)
            r.hms.answers[method] = lambda conn, a: result(success=answer(stats["value"]))
            session = SessionState("c")
            await r.call(session, method, 1, **args)  # cached
            stats["value"] = 20  # straight at the metastore: no event, no version moved
            check = checker(r, follower=await followed(r))
            task = await waiting(r, check)
            served = result_of(await r.call(session, method, 2, **args))
            assert served.success == answer(10)  # the stale hit
            with caplog.at_level(logging.INFO, logger="proxy.freshness"):
                assert await task == UNLOGGED
            assert checks(r, "unlogged") == 1 and checks(r, "mismatch") == 0
            assert r.sample("hmsproxy_freshness_mismatches_total", method=method) == 0
            assert "column statistics" in unlogged_line(caplog)
            calls = r.hms.calls[method]
            again = result_of(await r.call(session, method, 3, **args))
            assert again.success == answer(20) and r.hms.calls[method] == calls + 1

    asyncio.run(run())


def test_stale_privileges_are_unlogged_with_the_log_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No notification event covers a grant: what a *_with_auth reply carries of them is
    stale within the TTL."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, DAYS[0])
            grants: dict[str, list[str]] = {"u": ["SELECT"]}
            result = idl.result_class("get_partition_with_auth")

            def with_auth(conn: Any, a: Any) -> Any:
                found = partition(DB, T, DAYS[0])
                found.privileges = M.PrincipalPrivilegeSet(
                    userPrivileges={
                        user: [M.PrivilegeGrantInfo(privilege=x) for x in privileges]
                        for user, privileges in grants.items()
                    }
                )
                return result(success=found)

            r.hms.answers["get_partition_with_auth"] = with_auth
            args = {"db_name": DB, "tbl_name": T, "part_vals": [DAYS[0]], "user_name": "u"}
            session = SessionState("c")
            await r.call(session, "get_partition_with_auth", 1, **args)  # cached
            grants["u"] = ["SELECT", "INSERT"]  # granted straight at the metastore
            check = checker(r, follower=await followed(r))
            task = await waiting(r, check)
            served = result_of(await r.call(session, "get_partition_with_auth", 2, **args))
            assert len(served.success.privileges.userPrivileges["u"]) == 1  # the stale hit
            with caplog.at_level(logging.INFO, logger="proxy.freshness"):
                assert await task == UNLOGGED
            assert checks(r, "unlogged") == 1 and checks(r, "mismatch") == 0
            assert "grants" in unlogged_line(caplog)
            again = result_of(await r.call(session, "get_partition_with_auth", 3, **args))
            assert len(again.success.privileges.userPrivileges["u"]) == 2

    asyncio.run(run())


def test_what_the_log_does_not_cover_comes_from_the_catalog() -> None:
    """Every cached read with column statistics or privileges in its reply, and no other."""
    stale_by_design = {
        spec.name
        for spec in all_methods()
        if spec.kind is Kind.CACHEABLE_READ and spec.scope & (Scope.STATISTICS | Scope.PRIVILEGES)
    }
    assert {
        "get_table_column_statistics",
        "get_table_statistics_req",
        "get_partition_column_statistics",
        "get_partitions_statistics_req",
        "get_aggr_stats_for",
        "get_partition_with_auth",
        "get_partitions_with_auth",
        "get_partitions_ps_with_auth",
    } <= stale_by_design
    for spec in all_methods():
        if spec.kind is Kind.CACHEABLE_READ:
            assert (unlogged(spec) is not None) == (spec.name in stale_by_design), spec.name
    for name in ("get_table", "get_partitions_by_names", "get_partitions", "get_all_tables"):
        covered = lookup(name)
        assert covered is not None and unlogged(covered) is None


def test_every_result_starts_at_zero() -> None:
    registry = Metrics().registry
    for result in (MATCH, MISMATCH, UNLOGGED, CHANGED, UNDECIDED, FAILED):
        got = registry.get_sample_value("hmsproxy_freshness_checks_total", {"result": result})
        assert got == 0, result


# -- nothing counted that a write explains ----------------------------------------------------


def test_an_unchanged_table_is_a_match_and_nothing_is_invalidated() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            task = await waiting(r, checker(r))
            await read_table(r, 2)
            assert await task == MATCH
            assert checks(r, "match") == 1 and freshness_invalidations(r) == 0
            calls = r.hms.calls["get_table"]
            await read_table(r, 3)
            assert r.hms.calls["get_table"] == calls  # still a hit

    asyncio.run(run())


def test_a_write_through_the_proxy_after_the_hit_is_not_a_mismatch() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            sample = await sample_of_a_hit(r)
            await alter(r, v="2")  # before the check looks
            check = checker(r)
            assert await check.check(sample) == CHANGED
            # After it looked, before the metastore is asked again.
            await read_table(r, 3)  # (v=2 cached again)
            sample = await sample_of_a_hit(r)
            ask_again = check._ask_again

            async def written_first(sample: Sample) -> bytes | None:
                await alter(r, v="3")
                return await ask_again(sample)

            check._ask_again = written_first  # type: ignore[method-assign]
            assert await check.check(sample) == CHANGED
            assert r.sample("hmsproxy_freshness_mismatches_total", method="get_table") == 0
            assert freshness_invalidations(r) == 0

    asyncio.run(run())


def test_with_the_log_followed_an_event_applied_after_the_reread_explains_the_change() -> None:
    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            engine = r.cache
            head = idl.result_class("get_current_notificationEventId")
            r.hms.answers["get_current_notificationEventId"] = lambda conn, args: head(
                success=M.CurrentNotificationEventId(eventId=7)
            )
            follower = Follower(engine.naming.coordination("last_event"))
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            r.hms.tables[(DB, T)] = table(DB, T, v="2")  # straight at the metastore
            clock = Clock()
            check = checker(r, clock, follower, notification_poll=1)

            async def follow(invalidate: bool) -> None:
                # The follower's next poll: the event (id 7) applied, the position moved.
                if invalidate:
                    plan = engine.planner.invalidation()
                    plan.table(TableRef.of(DB, T), EVERYTHING_OF_A_TABLE, None)
                    await engine.invalidate(plan.build(), "notification")
                await engine.store.set_if_leader(follower.last_key, b"7", "", "")

            clock.during = lambda: follow(True)
            sample = await sample_of_a_hit(r)
            assert await check.check(sample) == CHANGED
            assert clock.now >= 2  # two polls after the metastore answered
            # The same, but the event changed nothing the cache holds: a stale reply after
            # all (the follower skipped what changed the table).
            await read_table(r, 3)
            r.hms.tables[(DB, T)] = table(DB, T, v="3")
            clock.during = lambda: follow(False)
            assert await check.check(await sample_of_a_hit(r)) == MISMATCH

    asyncio.run(run())


def test_a_follower_that_does_not_catch_up_leaves_the_check_undecided() -> None:
    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            head = idl.result_class("get_current_notificationEventId")
            r.hms.answers["get_current_notificationEventId"] = lambda conn, args: head(
                success=M.CurrentNotificationEventId(eventId=9)
            )
            follower = Follower(r.cache.naming.coordination("last_event"))
            await r.cache.store.set_if_leader(follower.last_key, b"8", "", "")
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            r.hms.tables[(DB, T)] = table(DB, T, v="2")
            clock = Clock()
            check = checker(r, clock, follower, notification_poll=1, follower_lease=5)
            assert await check.check(await sample_of_a_hit(r)) == UNDECIDED
            assert clock.now >= 5  # it waited a lease, then gave up
            assert freshness_invalidations(r) == 0

    asyncio.run(run())


def test_a_metastore_that_fails_the_reread_is_no_mismatch() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            sample = await sample_of_a_hit(r)
            r.hms.script("get_table", HANG_UP, HANG_UP)
            assert await checker(r).check(sample) == FAILED

    asyncio.run(run())


# -- the rate cap -----------------------------------------------------------------------------


def test_checks_are_at_most_the_rate_and_hits_between_them_are_not_taken() -> None:
    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            r.hms.add_table(DB, T, v="1")
            await read_table(r)
            clock = Clock()
            clock.gate = asyncio.Event()
            check = checker(r, clock, rate=4)

            async def timed_check() -> str:
                clock.now += 0.1  # the check took 0.1 s
                return await FreshnessCheck.check_next(check)

            check.check_next = timed_check  # type: ignore[method-assign]
            running = asyncio.create_task(check.run())
            try:
                for round_ in (1, 2):
                    await until(lambda: r.cache is not None and r.cache.freshness.want)
                    for seqid in range(10):  # the first is checked, the rest pass by
                        await read_table(r, seqid)
                    await until(lambda n=round_: len(clock.slept) == n, "the check sleeping")
                    assert not r.cache.freshness.want
                    assert checks(r, "match") == round_
                    assert clock.slept[-1] == pytest.approx(0.25 - 0.1)  # 1/rate from its start
                    clock.gate.set()
                    clock.gate = asyncio.Event()
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
            assert not r.cache.freshness.want

    asyncio.run(run())


# -- what is compared -------------------------------------------------------------------------


def test_replies_compare_without_their_seqid_and_maps_in_any_order() -> None:
    def reply(seqid: int, parameters: dict[str, str]) -> bytes:
        result = idl.result_class("get_table")(success=table(DB, T, **parameters))
        return reply_message("get_table", seqid, result)

    one = {"a": "1", "b": "2"}
    other_order = {"b": "2", "a": "1"}
    assert same_reply("get_table", reply(1, one), reply(2, one))
    assert reply(1, one) != reply(1, other_order)  # other bytes, the same objects
    assert same_reply("get_table", reply(1, one), reply(1, other_order))
    assert not same_reply("get_table", reply(1, one), reply(1, {"a": "1"}))
