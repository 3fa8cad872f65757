"""UpstreamPool in process, on a scripted metastore: limits, reuse by identity, stale
connections, and the pool races of earlier rounds as regression tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy import idl
from proxy.handler import ClientGone, SessionState
from proxy.metrics import Metrics
from proxy.upstream import Identity, UpstreamPool, UpstreamUnavailable
from tests.unit.inprocess import Client, options, request, rig
from tests.unit.scripted_hms import HANG_UP, ScriptedHMS, Slow, Split, table, until

DB, T = "db", "t"


def identity(user: str) -> Identity:
    """What a client's ``set_ugi(user, [user])`` carries (its arguments' bytes)."""
    return Identity(idl.encode(idl.args_class("set_ugi")(user_name=user, group_names=[user])))


@contextlib.asynccontextmanager
async def pool_on(**values: Any) -> AsyncIterator[tuple[UpstreamPool, ScriptedHMS]]:
    """A pool whose connections go to a scripted metastore; ``values`` are options."""
    hms = ScriptedHMS()
    pool = UpstreamPool(options(**values), Metrics(), opener=hms.open)
    try:
        yield pool, hms
    finally:
        await pool.close()
        await hms.close()


async def done_after_turns(task: asyncio.Task[Any], turns: int = 200) -> bool:
    """Whether ``task`` is done after the loop ran ``turns`` turns (many more than opening
    a connection takes)."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return task.done()


def waiting(pool: UpstreamPool) -> dict[str, float]:
    """hmsproxy_upstream_waiting by kind."""
    get = pool.metrics.registry.get_sample_value
    return {k: get("hmsproxy_upstream_waiting", {"kind": k}) or 0 for k in ("read", "write")}


# -- limits ----------------------------------------------------------------------------------


def test_at_the_limit_a_caller_waits_for_a_connection_to_come_back() -> None:
    async def run() -> None:
        async with pool_on(upstream_max_connections=2, upstream_max_idle=2) as (pool, hms):
            a = await pool.acquire(None)
            b = await pool.acquire(None, write=True)  # (reads may hold only one of two)
            third = asyncio.create_task(pool.acquire(None))
            assert not await done_after_turns(third)  # it waits: no third connection is opened
            assert len(hms.connections) == 2
            assert waiting(pool) == {"read": 1, "write": 0}  # what an operator sees meanwhile
            pool.release(a, reusable=True)
            assert await third is a
            assert len(hms.connections) == 2
            assert waiting(pool) == {"read": 0, "write": 0}
            waits = pool.metrics.registry.get_sample_value(
                "hmsproxy_upstream_wait_seconds_count", {"kind": "read", "group": "default"}
            )
            assert waits == 1  # only callers that queued are observed
            pool.release(b, reusable=True)
            pool.release(a, reusable=True)

    asyncio.run(run())


def test_a_caller_waiting_longer_than_the_read_timeout_is_told_all_are_busy() -> None:
    """The call's own bound, --upstream-read-timeout, is how long a caller waits its turn
    (the connect timeout, 2 s here, is not)."""

    async def run() -> None:
        async with pool_on(
            upstream_max_connections=1, upstream_max_idle=1, upstream_read_timeout=0.3
        ) as (pool, hms):
            held = await pool.acquire(None)
            busy = "all 1 metastore connections busy for 0.3 s"
            with pytest.raises(UpstreamUnavailable, match=busy):
                await pool.acquire(None)
            with pytest.raises(UpstreamUnavailable, match=busy):
                await pool.acquire(None, write=True)
            assert len(hms.connections) == 1
            pool.release(held, reusable=True)

    asyncio.run(run())


def test_a_waiter_is_not_failed_after_the_connect_timeout_while_connections_are_busy() -> None:
    async def run() -> None:
        async with pool_on(
            upstream_max_connections=1, upstream_max_idle=1, upstream_connect_timeout=0.05
        ) as (pool, hms):
            held = await pool.acquire(None)
            waiter = asyncio.create_task(pool.acquire(None))
            await asyncio.sleep(0.2)  # four connect timeouts: the scenario, not a bound
            assert not waiter.done()  # still waiting its turn, not failed as busy
            pool.release(held, reusable=True)
            assert await waiter is held
            assert len(hms.connections) == 1
            pool.release(held, reusable=True)

    asyncio.run(run())


def test_waiters_are_served_in_arrival_order_and_newcomers_do_not_overtake() -> None:
    async def run() -> None:
        async with pool_on(upstream_max_connections=1, upstream_max_idle=1) as (pool, hms):
            served: list[str] = []

            async def call(name: str) -> None:
                conn = await pool.acquire(None)
                served.append(name)
                await asyncio.sleep(0)  # the call
                pool.release(conn, reusable=True)

            held = await pool.acquire(None)
            waiters = []
            for name in ("first", "second", "third"):
                waiters.append(asyncio.create_task(call(name)))
                assert not await done_after_turns(waiters[-1])  # queued before the next
            pool.release(held, reusable=True)
            # Arrives as the connection comes back, before the first waiter has run.
            waiters.append(asyncio.create_task(call("newcomer")))
            await asyncio.gather(*waiters)
            assert served == ["first", "second", "third", "newcomer"]
            assert len(hms.connections) == 1

    asyncio.run(run())


def test_a_write_finds_a_connection_when_slow_reads_hold_all_they_may() -> None:
    """Reads may hold 7 of 8 connections: the eighth is the writes', so a write arriving
    while the metastore is slow on every read goes through at once; the reads waiting
    their turn get theirs when reads come back."""

    async def run() -> None:
        async with rig(
            upstream_max_connections=8,
            upstream_max_idle=8,
            upstream_connect_timeout=0.05,
            upstream_read_timeout=5,
        ) as r:
            names = [f"t{i}" for i in range(9)]
            for name in names:
                r.hms.add_table(DB, name)
            slow = Slow()
            r.hms.script("get_table", *[slow] * len(names))
            reads = [
                asyncio.create_task(
                    r.call(SessionState(f"r{i}"), "get_table", dbname=DB, tbl_name=n)
                )
                for i, n in enumerate(names)
            ]
            await until(lambda: r.hms.calls["get_table"] >= 7, "seven reads at the metastore")
            assert not await done_after_turns(reads[0])
            new = table(DB, "t0", v="2")
            reply = await r.call(
                SessionState("w"), "alter_table", 2, dbname=DB, tbl_name="t0", new_tbl=new
            )
            assert reply == r.hms.answer("alter_table", 2, dbname=DB, tbl_name="t0", new_tbl=new)
            assert not any(read.done() for read in reads)  # the reads were still held
            slow.gate.set()
            for read in reads:
                await read
            assert len(r.hms.connections) <= 8

    asyncio.run(run())


def test_at_the_limit_an_idle_connection_of_another_identity_makes_room() -> None:
    async def run() -> None:
        async with pool_on(upstream_max_connections=1, upstream_max_idle=1) as (pool, hms):
            alice = await pool.acquire(identity("alice"))
            pool.release(alice, reusable=True)
            bob = await pool.acquire(identity("bob"))
            assert bob is not alice
            assert [c.user for c in hms.connections] == ["alice", "bob"]
            await until(lambda: hms.connections[0].closed)
            pool.release(bob, reusable=True)

    asyncio.run(run())


def test_idle_connections_beyond_the_limit_are_closed_oldest_first() -> None:
    async def run() -> None:
        async with pool_on(upstream_max_connections=4, upstream_max_idle=2) as (pool, hms):
            conns = [await pool.acquire(None) for _ in range(3)]
            for conn in conns:
                pool.release(conn, reusable=True)
            await until(lambda: hms.connections[0].closed)
            assert not hms.connections[1].closed and not hms.connections[2].closed
            assert await pool.acquire(None) is conns[2]  # the most recently used first

    asyncio.run(run())


# -- reuse by identity -----------------------------------------------------------------------


def test_idle_connections_are_reused_by_identity_only() -> None:
    async def run() -> None:
        async with pool_on() as (pool, hms):
            alice = await pool.acquire(identity("alice"))
            pool.release(alice, reusable=True)
            bob = await pool.acquire(identity("bob"))
            anonymous = await pool.acquire(None)
            assert alice is not bob and alice is not anonymous
            assert await pool.acquire(identity("alice")) is alice
            assert [c.user for c in hms.connections] == ["alice", "bob", None]
            # An anonymous idle connection is bound to whoever needs one: set_ugi replayed.
            pool.release(anonymous, reusable=True)
            assert await pool.acquire(identity("carol")) is anonymous
            assert hms.connections[2].ugi == [("carol", ["carol"])]
            assert hms.calls["set_ugi"] == 3
            assert all(len(c.ugi) == 1 for c in hms.connections)

    asyncio.run(run())


def test_an_idle_connection_past_its_timeout_or_closed_by_the_metastore_is_not_reused() -> None:
    async def run() -> None:
        async with pool_on() as (pool, hms):
            old = await pool.acquire(None)
            pool.release(old, reusable=True)
            old.idle_since -= pool.options.upstream_idle_timeout + 1
            fresh = await pool.acquire(None)
            assert fresh is not old
            await until(lambda: hms.connections[0].closed)

            pool.release(fresh, reusable=True)
            hms.connections[1].close()  # the HMS drops an idle connection
            await until(lambda: not fresh.usable)  # the pool's side has seen it end
            third = await pool.acquire(None)
            assert third is not fresh
            assert len(hms.connections) == 3

    asyncio.run(run())


def test_a_call_sent_at_once_passes_over_idle_connections_past_their_timeout_or_closed() -> None:
    """take_now (a forwarded call's connection, taken as the call arrives) holds idle
    connections to the same freshness as acquire: the newest is taken in place when fresh,
    else the stale ones are closed and an older fresh one is taken, if any."""

    async def run() -> None:
        async with pool_on() as (pool, hms):
            older = await pool.acquire(None)
            newest = await pool.acquire(None)
            pool.release(older, reusable=True)
            pool.release(newest, reusable=True)
            assert newest.diverter is not None  # (what take_now takes)
            taken = pool.take_now(None)
            assert taken is newest  # the most recently used, fresh: taken in place
            assert taken is not None
            pool.release(taken, reusable=True)

            newest.idle_since -= pool.options.upstream_idle_timeout + 1
            assert pool.take_now(None) is older  # past its timeout: closed, passed over
            await until(lambda: hms.connections[1].closed)
            pool.release(older, reusable=True)

            hms.connections[0].close()  # the HMS drops the last idle one
            await until(lambda: not older.usable)
            assert pool.take_now(None) is None  # nothing fresh: the ordinary way opens one
            third = await pool.acquire(None)
            assert third not in (older, newest)
            assert len(hms.connections) == 3

    asyncio.run(run())


def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    async def run() -> None:
        async with rig(upstream_max_connections=1, upstream_max_idle=1) as r:
            r.hms.add_table(DB, T)
            r.hms.add_table(DB, "u")
            s = SessionState("a")
            await r.call(s, "get_table", 1, dbname=DB, tbl_name=T)
            # The next call finds that connection idle; the HMS has closed it meanwhile, which
            # the proxy sees only after sending (it reads the call, then hangs up).
            r.hms.script("get_table", HANG_UP)
            reply = await r.call(s, "get_table", 2, dbname=DB, tbl_name="u")
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name="u")
            assert [c.conn for c in r.hms.received] == [1, 1, 2]
            assert r.idle == 1 and r.active == 0  # the stale one is gone, the fresh one idle
            assert (
                r.sample(
                    "hmsproxy_upstream_requests_total",
                    method="get_table",
                    outcome="connection_error",
                )
                == 1
            )

    asyncio.run(run())


def test_a_retry_that_fails_too_ends_the_call() -> None:
    """One retry, on a fresh connection; if the metastore hangs up on that one as well, the
    client's connection ends as it would talking to the HMS (no third attempt)."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            r.hms.add_table(DB, "u")
            s = SessionState("a")
            await r.call(s, "get_table", 1, dbname=DB, tbl_name=T)
            r.hms.script("get_table", HANG_UP, HANG_UP)
            client = Client()
            with pytest.raises(ClientGone):  # (a table not cached yet: the call goes upstream)
                await r.handler.handle(s, request("get_table", 2, dbname=DB, tbl_name="u"), client)
            assert [c.conn for c in r.hms.received] == [1, 1, 2]
            assert not client.data
            assert r.active == 0  # both connections given up, their slots free

    asyncio.run(run())


def test_a_write_on_a_stale_connection_is_not_retried() -> None:
    """The HMS may have applied it before it hung up: the writer must decide, as it would
    talking to the HMS directly (its connection ends)."""

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T)
            s = SessionState("a")
            await r.call(s, "get_table", 1, dbname=DB, tbl_name=T)
            r.hms.script("alter_table", HANG_UP)
            client = Client()
            call = request("alter_table", 2, dbname=DB, tbl_name=T, new_tbl=table(DB, T, v="2"))
            with pytest.raises(ClientGone):
                await r.handler.handle(s, call, client)
            assert r.hms.calls["alter_table"] == 1 and not client.data

    asyncio.run(run())


# -- regressions -----------------------------------------------------------------------------


def test_a_caller_waiting_for_the_pools_lock_takes_a_connection_of_its_own_that_came_back() -> None:
    """Commit 3749bda: at the connection limit, a caller that found no idle connection and
    then waited for the pool's lock (another caller held it: under CPU load, a woken waiter
    re-taking it) closed the idle connection of its own identity that had come back
    meanwhile, and opened a new one. The pool has no lock since (a waiter's turn is a place
    in a queue, and taking a connection never awaits); what the fix guarded still holds."""

    async def run() -> None:
        async with pool_on(upstream_max_connections=1, upstream_max_idle=1) as (pool, hms):
            conn = await pool.acquire(None)
            waiter = asyncio.create_task(pool.acquire(None))
            assert not await done_after_turns(waiter)  # no idle connection: waits its turn
            pool.release(conn, reusable=True)  # meanwhile, the connection comes back
            got = await waiter
            assert got is conn
            assert len(hms.connections) == 1 and not hms.connections[0].closed
            pool.release(got, reusable=True)

    asyncio.run(run())


def test_a_client_hanging_up_mid_reply_frees_the_metastore_connections_slot() -> None:
    """Commit b207e9a: a client hanging up while its reply was relayed leaked the pool slot
    of the metastore connection (and was logged as an internal error)."""

    async def run() -> None:
        async with rig(
            upstream_max_connections=1, upstream_max_idle=1, upstream_read_timeout=2
        ) as r:
            r.hms.add_table(DB, T)
            r.hms.add_table(DB, "u")
            split = Split()
            r.hms.script("get_table", split)
            client = Client(hang_up_after=0)  # gone by the time its reply is whole
            call = request("get_table", 1, dbname=DB, tbl_name=T)
            handled = asyncio.create_task(r.handler.handle(SessionState("a"), call, client))
            await until(lambda: r.hms.calls)  # (half its reply sent)
            split.gate.set()
            with pytest.raises(ClientGone):
                await handled
            await until(lambda: r.hms.connections[0].closed)  # its call failed: not reused
            assert r.active == 0 and r.idle == 0
            # The one slot is free: the next caller gets a connection (a new one).
            reply = await r.call(SessionState("b"), "get_table", 2, dbname=DB, tbl_name="u")
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name="u")
            assert len(r.hms.connections) == 2
            assert r.requests("get_table", "client_gone") == 1
            assert r.requests("get_table", "internal_error") == 0

    asyncio.run(run())


def test_more_identities_than_idle_connections_evict_without_error() -> None:
    """Commit 4e99f6f: an identity's idle queue, emptied when its connection was taken,
    stayed in the pool; evicting the oldest idle connection then took that empty queue and
    failed (many set_ugi identities, more than --upstream-max-idle)."""

    async def run() -> None:
        async with pool_on(upstream_max_connections=4, upstream_max_idle=1) as (pool, hms):
            alice = await pool.acquire(identity("alice"))
            pool.release(alice, reusable=True)
            assert await pool.acquire(identity("alice")) is alice  # alice's queue is empty
            bob = await pool.acquire(identity("bob"))
            pool.release(bob, reusable=True)  # one idle: the limit
            carol = await pool.acquire(identity("carol"))
            pool.release(carol, reusable=True)  # two: the oldest (bob's) goes
            await until(lambda: hms.connections[1].closed)
            assert await pool.acquire(identity("carol")) is carol
            pool.release(alice, reusable=True)
            pool.release(carol, reusable=True)
            await until(lambda: hms.connections[0].closed)
            assert not hms.connections[2].closed
            assert [c.user for c in hms.connections] == ["alice", "bob", "carol"]

    asyncio.run(run())
