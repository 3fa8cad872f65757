"""The protections of proxy.guard in process, on a scripted metastore: calls costed before
they go, refused over --max-partitions-per-call with the HMS's own text, heavy calls in a
line of their own, fair turns across tenants, and replies over --max-reply-bytes answered
with an error instead of a cut connection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy import idl
from proxy.guard import gate, limits
from proxy.guard.answers import PARTITION_LIMIT_SETTING
from proxy.handler import SessionState
from proxy.upstream.admission import Lane
from tests.unit.helpers import fed
from tests.unit.inprocess import Client, request, rig
from tests.unit.scripted_hms import Slow, reply_message, result_of, until
from tests.unit.test_pool import done_after_turns, pool_on

DB, T, BIG = "db", "t", "big"
DAYS = [f"2024-01-{d:02d}" for d in range(1, 11)]  # ten partitions


def meta_error(reply: bytes) -> str | None:
    """The MetaException message a reply carries, if it does."""
    result = result_of(reply)
    for name in ("o1", "o2", "o3"):
        error = getattr(result, name, None)
        if isinstance(error, idl.module().MetaException):
            return str(error.message)
    return None


def partitions_in(reply: bytes) -> int:
    return len(result_of(reply).success)


def test_a_call_over_the_partition_limit_is_refused_with_the_hms_text_before_it_goes() -> None:
    async def run() -> None:
        async with rig(cache=False, max_partitions_per_call=5) as r:
            r.hms.add_table(DB, T, *DAYS)
            session = SessionState("10.0.0.1:5000")
            reply = await r.call(session, "get_partitions", 1, db_name=DB, tbl_name=T, max_parts=-1)
            text = meta_error(reply)
            assert text == (
                f"Number of partitions scanned (=10) on table '{DB}.{T}' exceeds limit (=5). "
                f"This is controlled on the metastore server by {PARTITION_LIMIT_SETTING}."
            )
            assert r.hms.calls["get_partitions"] == 0  # never sent
            assert r.hms.calls["get_num_partitions_by_filter"] == 1  # what it cost to know
            assert r.requests("get_partitions", "refused") == 1
            refused = {"reason": "partitions_per_call", "group": "default"}
            assert r.sample("hmsproxy_refused_calls_total", **refused) == 1
            # Asking for at most 5 of them is no more than the limit: sent, answered.
            reply = await r.call(session, "get_partitions", 2, db_name=DB, tbl_name=T, max_parts=5)
            assert partitions_in(reply) == 5
            # By name: exactly as many as named, no count needed.
            names = [f"ds={d}" for d in DAYS]
            reply = await r.call(
                session, "get_partitions_by_names", 3, db_name=DB, tbl_name=T, names=names[:6]
            )
            assert meta_error(reply) is not None and "(=6)" in str(meta_error(reply))
            reply = await r.call(
                session, "get_partitions_by_names", 4, db_name=DB, tbl_name=T, names=names[:5]
            )
            assert partitions_in(reply) == 5
            # A filter is counted by the metastore: 3 selected pass, 8 do not.
            for seqid, (text_filter, allowed) in enumerate(
                ((f'ds >= "{DAYS[7]}"', True), (f'ds >= "{DAYS[2]}"', False)), start=5
            ):
                reply = await r.call(
                    session,
                    "get_partitions_by_filter",
                    seqid,
                    db_name=DB,
                    tbl_name=T,
                    filter=text_filter,
                    max_parts=-1,
                )
                assert (meta_error(reply) is None) == allowed, text_filter
            assert r.hms.calls["get_partitions_by_filter"] == 1
            # The table's count was asked once (kept for --partition-count-ttl), and each
            # filter's once.
            assert r.hms.calls["get_num_partitions_by_filter"] == 3

    asyncio.run(run())


def test_a_table_below_every_threshold_costs_one_count_however_many_ask_at_once() -> None:
    async def run() -> None:
        async with rig(cache=False, heavy_partitions=100) as r:
            r.hms.add_table(DB, T, *DAYS)
            session = SessionState("10.0.0.1:5000")
            calls = [
                r.call(
                    session,
                    "get_partitions_by_filter",
                    i,
                    db_name=DB,
                    tbl_name=T,
                    filter=f'ds = "{DAYS[i % 10]}"',
                    max_parts=-1,
                )
                for i in range(8)
            ]
            replies = await asyncio.gather(*calls)
            assert [partitions_in(reply) for reply in replies] == [1] * 8
            # Ten partitions: no filter of it can be heavy, so no filter is counted.
            assert r.hms.calls["get_num_partitions_by_filter"] == 1

    asyncio.run(run())


def test_a_count_the_metastore_will_not_give_neither_refuses_nor_delays() -> None:
    async def run() -> None:
        async with rig(cache=False, max_partitions_per_call=1) as r:
            session = SessionState("10.0.0.1:5000")
            reply = await r.call(
                session, "get_partitions", 1, db_name=DB, tbl_name="gone", max_parts=-1
            )
            assert meta_error(reply) is None  # the metastore's own answer (an empty list)
            assert r.hms.calls["get_partitions"] == 1
            failed = r.sample("hmsproxy_partition_count_queries_total", result="failed")
            assert failed == 1

    asyncio.run(run())


def test_heavy_calls_wait_in_their_own_line_and_small_calls_pass_them() -> None:
    async def run() -> None:
        async with rig(
            cache=False,
            heavy_partitions=5,
            heavy_max_concurrent=1,
            upstream_max_connections=4,
            upstream_max_idle=4,
        ) as r:
            r.hms.add_table(DB, T, *DAYS)
            r.hms.add_table(DB, "small")
            slow = Slow()
            r.hms.script("get_partitions", slow)
            first = asyncio.create_task(
                r.call(
                    SessionState("a:1"), "get_partitions", 1, db_name=DB, tbl_name=T, max_parts=-1
                )
            )
            await until(lambda: r.hms.calls["get_partitions"] == 1, "the first heavy call sent")
            assert r.sample("hmsproxy_heavy_calls_in_flight") == 1
            second = asyncio.create_task(
                r.call(
                    SessionState("b:1"), "get_partitions", 2, db_name=DB, tbl_name=T, max_parts=-1
                )
            )
            await until(
                lambda: r.sample("hmsproxy_upstream_waiting", kind="heavy") == 1,
                "the second heavy call in line",
            )
            # Connections are free: a small call does not wait behind the heavy line (not
            # even the way a call only forwarded is sent from the connection's callback).
            assert r.pool._admission.read_at_once()
            reply = await r.call(SessionState("c:1"), "get_table", 3, dbname=DB, tbl_name="small")
            assert result_of(reply).success.tableName == "small"
            assert r.hms.calls["get_partitions"] == 1
            slow.gate.set()
            assert partitions_in(await first) == 10
            assert partitions_in(await second) == 10
            assert r.sample("hmsproxy_heavy_calls_in_flight") == 0
            waited = r.sample("hmsproxy_upstream_wait_seconds_count", kind="heavy", group="default")
            assert waited == 1

    asyncio.run(run())


def test_turns_go_round_the_tenants_so_a_backlog_delays_another_by_one_call() -> None:
    async def run() -> None:
        async with pool_on(upstream_max_connections=1, upstream_max_idle=1) as (pool, _hms):
            served: list[str] = []

            async def call(tenant: str, n: int) -> None:
                conn = await pool.acquire(None, lane=Lane(tenant))
                served.append(f"{tenant}{n}")
                await asyncio.sleep(0)  # the call
                pool.release(conn, reusable=True)

            held = await pool.acquire(None)
            waiters: list[asyncio.Task[Any]] = []
            for n in range(5):  # a backlog of one tenant
                waiters.append(asyncio.create_task(call("a", n)))
                assert not await done_after_turns(waiters[-1])
            for tenant in ("b", "c"):  # then one call each of two others
                waiters.append(asyncio.create_task(call(tenant, 0)))
                assert not await done_after_turns(waiters[-1])
            waiters.append(asyncio.create_task(call("b", 1)))
            assert not await done_after_turns(waiters[-1])
            pool.release(held, reusable=True)
            await asyncio.gather(*waiters)
            assert served == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]

    asyncio.run(run())


def test_a_reply_over_the_clients_limit_is_an_error_naming_table_and_size_not_retried() -> None:
    async def run() -> None:
        limit = 16 << 10
        async with rig(
            cache=True, max_reply_bytes=limit, upstream_max_connections=1, upstream_max_idle=1
        ) as r:
            r.hms.add_table(
                DB, BIG, *(f"2024-{m:02d}-{d:02d}" for m in range(1, 13) for d in range(1, 29))
            )
            session = SessionState("10.0.0.1:5000")
            client = Client()
            call = request("get_partitions", 7, db_name=DB, tbl_name=BIG, max_parts=-1)
            await r.handler.handle(session, call, client)
            text = meta_error(client.reply())
            assert text is not None
            assert f"table '{DB}.{BIG}'" in text and "(336 partitions)" in text
            assert f"larger than {limit} bytes" in text
            assert r.hms.calls["get_partitions"] == 1  # not sent again
            assert r.requests("get_partitions", "refused") == 1
            refused = {"reason": "reply_too_large", "group": "default"}
            assert r.sample("hmsproxy_refused_calls_total", **refused) == 1
            # Its connection, its reply half read, was closed; the next call gets another.
            reply = await r.call(
                session, "get_partitions", 8, db_name=DB, tbl_name=BIG, max_parts=3
            )
            assert partitions_in(reply) == 3
            assert r.hms.connections[0].closed

    asyncio.run(run())


def test_a_forwarded_reply_over_the_limit_is_an_error_too() -> None:
    """A call only forwarded (cache off), answered as it arrives when its reply is small,
    is handed over to the ordinary way when it is big: the same error."""

    async def run() -> None:
        async with rig(cache=False, max_reply_bytes=16 << 10) as r:
            r.hms.add_table(DB, T, comment="x" * (20 << 10))
            client = Client()
            await r.handler.handle(
                SessionState("a:1"), request("get_table", 1, dbname=DB, tbl_name=T), client
            )
            text = meta_error(client.reply())
            assert text is not None and f"table '{DB}.{T}'" in text
            assert r.hms.calls["get_table"] == 1

    asyncio.run(run())


# -- rate limits (--limits-file) --------------------------------------------------------


LIMITS = """
[default]
calls_per_second = 1000

[groups.adhoc]
addresses = ["10.0.0.0/8"]
users = ["alice"]
calls_per_second = 2
partitions_per_second = 10
"""


def limits_file(tmp_path: Path, text: str = LIMITS) -> str:
    path = tmp_path / "limits.toml"
    path.write_text(text)
    return str(path)


class Clock:
    """time.monotonic for proxy.guard.limits, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(limits.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(gate.time, "monotonic", lambda: self.now)


def test_a_limits_file_is_checked_whole() -> None:
    default, groups = limits.parse(LIMITS)
    assert default.calls_per_second == 1000 and default.group == "default"
    (adhoc,) = groups
    assert adhoc.rule.calls_per_second == 2 and adhoc.users == {"alice"}
    for bad, says in (
        ("[groups.x]\ncalls_per_second = -1", "0 or more"),
        ("[groups.x]\ncals_per_second = 1", "unknown keys"),
        ("[groups.x]\naddresses = ['10.0.0.0/33']", "groups.x"),
        ("[limits]\n", "unknown sections"),
        ("[groups.x]\nburst_seconds = 0", "more than 0"),
        ("not toml [", "not TOML"),
    ):
        with pytest.raises(limits.LimitsError, match=says):
            limits.parse(bad)


def test_a_tenant_over_its_calls_per_second_is_refused_and_hits_are_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)

    async def run() -> None:
        async with rig(cache=True, limits_file=limits_file(tmp_path)) as r:
            for name in ("a", "b", "c", "d"):
                r.hms.add_table(DB, name)
            adhoc = SessionState("10.1.2.3:5000")
            other = SessionState("192.168.0.1:5000")
            for seqid, name in enumerate(("a", "b"), start=1):  # two misses: the bucket
                reply = await r.call(adhoc, "get_table", seqid, dbname=DB, tbl_name=name)
                assert meta_error(reply) is None
            for seqid in range(3, 13):  # hits cost nothing
                reply = await r.call(adhoc, "get_table", seqid, dbname=DB, tbl_name="a")
                assert meta_error(reply) is None
            reply = await r.call(adhoc, "get_table", 13, dbname=DB, tbl_name="c")
            text = meta_error(reply)
            assert text is not None and "address 10.1.2.3 (group adhoc)" in text
            assert "2 calls per second" in text
            assert r.hms.calls["get_table"] == 2
            refused = {"reason": "calls_rate", "group": "adhoc"}
            assert r.sample("hmsproxy_refused_calls_total", **refused) == 1
            # Another address is in no group: the default rule, a bucket of its own.
            reply = await r.call(other, "get_table", 14, dbname=DB, tbl_name="c")
            assert meta_error(reply) is None
            clock.now += 0.5  # one call's worth of tokens back
            reply = await r.call(adhoc, "get_table", 15, dbname=DB, tbl_name="d")
            assert meta_error(reply) is None
            # Writes are never refused by a rate (a commit must not be stranded).
            table = result_of(await r.call(adhoc, "get_table", 16, dbname=DB, tbl_name="a"))
            reply = await r.call(
                adhoc, "alter_table", 17, dbname=DB, tbl_name="a", new_tbl=table.success
            )
            assert meta_error(reply) is None and r.hms.calls["alter_table"] == 1

    asyncio.run(run())


def test_partitions_per_second_let_one_big_fetch_through_then_make_it_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)

    async def run() -> None:
        async with rig(cache=False, limits_file=limits_file(tmp_path)) as r:
            r.hms.add_table(DB, T, *DAYS)
            alice = SessionState("127.0.0.1:1", user="alice")
            args = {"db_name": DB, "tbl_name": T, "max_parts": -1}
            reply = await r.call(alice, "get_partitions", 1, **args)
            assert partitions_in(reply) == 10  # a full bucket's worth
            clock.now += 0.5  # (calls are back; half the partitions are)
            text = meta_error(await r.call(alice, "get_partitions", 2, **args))
            assert text is not None and "user alice (group adhoc)" in text
            assert "10 partitions per second" in text
            clock.now += 0.6
            assert partitions_in(await r.call(alice, "get_partitions", 3, **args)) == 10

    asyncio.run(run())


def test_a_rule_that_counts_hits_refuses_hits_too_and_reads_the_file_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    path = limits_file(tmp_path, LIMITS + "count_hits = true\n")

    async def run() -> None:
        async with rig(cache=True, limits_file=path) as r:
            r.hms.add_table(DB, T)
            adhoc = SessionState("10.1.2.3:5000")
            replies = [
                await r.call(adhoc, "get_table", seqid, dbname=DB, tbl_name=T)
                for seqid in range(1, 4)
            ]
            assert [meta_error(reply) is None for reply in replies] == [True, True, False]
            assert r.hms.calls["get_table"] == 1  # one miss, one hit, one refused
            # The file changes: the group's rate is raised; seen within CHECK_EVERY.
            Path(path).write_text(LIMITS.replace("= 2\n", "= 100\n"))
            clock.now += limits.CHECK_EVERY
            reply = await r.call(adhoc, "get_table", 4, dbname=DB, tbl_name=T)
            assert meta_error(reply) is None
            assert not r.handler.gate.limits.counts_hits
            # A file that no longer parses leaves the limits in force.
            Path(path).write_text("[groups.adhoc\n")
            clock.now += limits.CHECK_EVERY
            r.handler.gate.limits.look(clock.now)
            assert r.handler.gate.limits.groups[0].rule.calls_per_second == 100

    asyncio.run(run())


def test_a_caller_over_its_rate_costs_the_metastore_no_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Clock(monkeypatch)

    async def run() -> None:
        async with rig(cache=False, limits_file=limits_file(tmp_path), heavy_partitions=5) as r:
            r.hms.add_table(DB, T, *DAYS)
            adhoc = SessionState("10.1.2.3:5000")
            replies = [
                await r.call(
                    adhoc,
                    "get_partitions_by_filter",
                    seqid,
                    db_name=DB,
                    tbl_name=T,
                    filter=f'ds = "{DAYS[seqid]}"',
                    max_parts=-1,
                )
                for seqid in range(6)
            ]
            assert [meta_error(reply) is None for reply in replies] == [True] * 2 + [False] * 4
            # The table's count, and the two filters let through: none for the refused.
            assert r.hms.calls["get_num_partitions_by_filter"] == 3

    asyncio.run(run())


def test_a_refused_hit_leaves_the_next_call_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Clock(monkeypatch)
    path = limits_file(tmp_path, LIMITS + "count_hits = true\n")

    async def run() -> None:
        async with rig(cache=True, limits_file=path) as r:
            r.hms.add_table(DB, T)
            adhoc = SessionState("10.1.2.3:5000")
            for seqid in (1, 2, 3):  # a miss, a hit, then refused
                await r.call(adhoc, "get_table", seqid, dbname=DB, tbl_name=T)
            assert not adhoc.charged
            # A read the cache does not answer is charged as a call: refused too.
            reply = await r.call(adhoc, "get_all_functions", 4)
            assert "hms-cache-proxy" in str(meta_error(reply))
            assert r.hms.calls["get_all_functions"] == 0

    asyncio.run(run())


def test_a_writes_reply_over_the_limit_is_relayed_whole(tmp_path: Path) -> None:
    """The metastore applied the write: its reply is the client's, whatever its size (a
    refusal would tell it a done write failed)."""

    async def run() -> None:
        async with rig(cache=True, max_reply_bytes=16 << 10) as r:
            r.hms.add_table(DB, T)
            parts = [
                idl.module().Partition(values=[f"{i:05d}"], dbName=DB, tableName=T)
                for i in range(2000)
            ]
            big = reply_message(
                "add_partitions_req",
                1,
                idl.result_class("add_partitions_req")(
                    success=idl.module().AddPartitionsResult(partitions=parts)
                ),
            )
            assert len(big) > 16 << 10
            r.hms.raw_replies["add_partitions_req"] = lambda seqid: big
            request = idl.module().AddPartitionsRequest(
                dbName=DB, tblName=T, parts=parts[:1], ifNotExists=False, needResult=True
            )
            reply = await r.call(SessionState("a:1"), "add_partitions_req", 1, request=request)
            assert reply == big

    asyncio.run(run())


def test_counting_hits_turns_answers_at_once_off_on_open_connections(tmp_path: Path) -> None:
    path = Path(limits_file(tmp_path))

    async def run() -> None:
        async with fed(limits_file=str(path)) as (r, server, connection):
            open_one = connection()
            protocol = open_one.transport.get_protocol()
            assert protocol.at_once
            path.write_text(LIMITS + "count_hits = true\n")
            r.handler.gate.limits.reload()
            assert not protocol.at_once and not server.protocol(asyncio.get_running_loop()).at_once
            path.write_text(LIMITS)
            r.handler.gate.limits.reload()
            assert protocol.at_once
            await open_one.end()

    asyncio.run(run())


def test_a_rate_under_one_call_a_second_lets_a_call_through_when_its_bucket_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    rules = limits.Limits(None)
    slow = limits.Rule("slow", calls_per_second=0.5)
    assert rules.take("t", slow, 0) is None
    assert rules.take("t", slow, 0) == "calls_rate"
    clock.now += 1.0  # (in debt by half a call: not yet)
    assert rules.take("t", slow, 0) == "calls_rate"
    clock.now += 1.0  # (full again: a call every 2 s is 0.5 a second)
    assert rules.take("t", slow, 0) is None
    assert rules.take("t", slow, 0) == "calls_rate"


def test_refusals_are_logged_once_in_a_while_with_how_many_were_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(monkeypatch)
    said = gate.Said()
    with caplog.at_level("INFO", logger="proxy.guard.gate"):
        for _ in range(5):
            said.say("calls_rate", 20, "refused %s", "x")
        clock.now += gate.SAY_EVERY
        said.say("calls_rate", 20, "refused %s", "y")
    assert [r.getMessage() for r in caplog.records] == [
        "refused x",
        "refused y (and 4 more refused so since the last line)",
    ]
