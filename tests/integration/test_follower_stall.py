"""The notification follower never moves its position past an event Redis did not take.

In process, with real parts: the follower and the cache engine of the proxy, a real
``redis-server`` (frozen with SIGSTOP for one event in the middle of a batch, and running
again for the events after it and for the position) and the rig's real HMS, whose
notification log records real writes. Before the fix, the follower ignored the result of an
invalidation: one Redis timeout left the event pending in that proxy only, the position
still moved on, and a proxy that died then (taking its pending invalidation with it) left
the event applied nowhere, so every proxy served the old table.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
import redis

from proxy.app import build_cache
from proxy.cache.keys import TableRef
from proxy.cache.store import CacheUnavailable
from proxy.config import load
from proxy.follower import NotificationFollower
from proxy.metrics import Metrics
from proxy.upstream import UpstreamPool
from tests.rig.hms import MetastoreServer
from tests.rig.locking import Endpoint, create_table
from tests.rig.redis_server import RedisServer
from tests.rig.sample import client

pytestmark = pytest.mark.hms

DB = "follow_stall"
TABLES = [f"t{i}" for i in range(12)]
FREEZE_AFTER = 4  # events applied before Redis stalls


def _tables(hms: MetastoreServer) -> None:
    direct = Endpoint(hms.host, hms.port)
    if DB not in (direct.call("get_all_databases").success or []):
        create_table(direct, hms.warehouse.as_uri(), DB, *TABLES)


def _alter_all(hms: MetastoreServer, round_: int) -> None:
    """One ALTER_TABLE event per table, straight at the HMS."""
    with client(hms.host, hms.port) as c:
        for name in TABLES:
            table = c.get_table(DB, name)
            table.parameters["round"] = str(round_)
            c.alter_table(DB, name, table)


def _proxy_parts(hms: MetastoreServer, redis_url: str) -> tuple[Any, NotificationFollower]:
    options = load({"upstream": hms.uri, "redis": redis_url, "redis_timeout": "0.05"}, env={})
    metrics = Metrics()
    engine = build_cache(options, metrics)
    return engine, NotificationFollower(options, engine, UpstreamPool(options, metrics), metrics)


async def _retrying(call: Any) -> None:
    """Redis answers again after SIGCONT, once the breaker's back-off has passed."""
    for _ in range(50):
        try:
            return await call()  # type: ignore[no-any-return]
        except CacheUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError("redis did not come back")


async def _close(engine: Any, follower: NotificationFollower) -> None:
    await follower.pool.close()
    await engine.store.close()
    await asyncio.sleep(0.05)  # let the closed transports go


def test_a_redis_stall_mid_batch_never_moves_the_position_past_an_event(
    hms: MetastoreServer, own_redis: RedisServer
) -> None:
    _tables(hms)
    pid = own_redis.process.pid  # type: ignore[union-attr]

    async def run() -> None:
        engine, follower = _proxy_parts(hms, own_redis.url)
        assert await engine.store.connect(5)
        await follower.poll()  # the first poll on this Redis: flush, follow from the head
        start = follower.state.last_applied
        assert start is not None
        _alter_all(hms, 1)

        # Spies, not fakes: what the follower applied, and every position it stored.
        applied: dict[int, bool] = {}
        stored: list[int] = []
        real_apply, real_set = follower._apply, engine.store.set_if_leader

        async def apply(event: Any) -> bool:
            stall = len(applied) == FREEZE_AFTER
            if stall:
                os.kill(pid, signal.SIGSTOP)  # Redis stops answering for this one event
            try:
                ok = await real_apply(event)
            finally:
                if stall:
                    os.kill(pid, signal.SIGCONT)  # and answers again: the position can be saved
            applied[event.event_id] = ok
            return ok

        async def set_if_leader(key: str, value: bytes, *args: Any) -> bool:
            done = await real_set(key, value, *args)
            if done:
                stored.append(int(value))
            return done

        follower._apply = apply  # type: ignore[method-assign]
        engine.store.set_if_leader = set_if_leader  # type: ignore[method-assign]
        try:
            with pytest.raises(CacheUnavailable):
                await follower.poll()
        finally:
            os.kill(pid, signal.SIGCONT)
        failed = start + FREEZE_AFTER + 1
        assert applied[failed] is False  # the one event Redis missed
        # Redis took the position right after (it answered again): the batch stopped there.
        assert stored == [start + FREEZE_AFTER], (stored, applied)
        for position in stored:
            assert all(applied.get(e) for e in range(start + 1, position + 1)), (
                f"position {position} passed an event whose invalidation was not in Redis"
            )

        # This proxy dies now, its pending invalidation with it; another takes over.
        await _retrying(lambda: follower.engine.store.release(follower.lease_key, follower.token))
        await _close(engine, follower)
        engine2, follower2 = _proxy_parts(hms, own_redis.url)
        assert await engine2.store.connect(5)
        for _ in range(50):
            try:
                await follower2.poll()
            except CacheUnavailable:
                await asyncio.sleep(0.2)  # the breaker's back-off after the stall
                continue
            if follower2.state.last_applied == follower2.state.head:
                break
        assert follower2.state.last_applied == follower2.state.head
        await _close(engine2, follower2)

    asyncio.run(run())
    # Every table's ALTER_TABLE event reached Redis: each table's version was bumped.
    r = redis.Redis.from_url(own_redis.url)
    try:
        naming = build_cache(load({"upstream": hms.uri}, env={}), Metrics()).naming
        for name in TABLES:
            version = r.hget(naming.versions(TableRef.of(DB, name).tag), "table")
            assert version is not None and int(version) >= 1, f"{name}'s event was skipped"
    finally:
        r.close()
