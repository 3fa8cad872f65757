"""redis-py's connections under the proxy's concurrency: with a real ``redis-server`` (and a
real Redis Cluster) that holds every write back (``CLIENT PAUSE``), more operations at once
than redis-py's default pool allows (100, per node on a cluster) all succeed once Redis
answers: on a single Redis callers beyond the pool wait for a connection; on a cluster the
node pools are sized for the client connections the proxy admits."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis

from proxy.cache.redis_store import RedisStore
from proxy.metrics import Metrics
from tests.rig.redis_server import RedisCluster, RedisServer

AT_ONCE = 150  # operations in flight together: more than redis-py's default 100


async def clients_of(admin: aredis.Redis) -> int:
    return int((await admin.info("clients"))["connected_clients"])


async def puts_while_paused(store: RedisStore, admin: aredis.Redis, keys: list[str]) -> None:
    """``AT_ONCE`` puts sent while Redis holds writes back, then Redis let go: each put
    must succeed (none refused for want of a connection)."""
    assert await store.connect(10)
    await admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        puts = [asyncio.create_task(store.put(key, b"v", 60)) for key in keys]
        # Held at Redis: at least redis-py's default 100 (besides this admin connection and
        # the store's lean one); the others wait for a connection, or fail.
        deadline = time.monotonic() + 30
        while await clients_of(admin) < 100 + 2 and not all(p.done() for p in puts):
            assert time.monotonic() < deadline, "the puts never reached Redis"
            await asyncio.sleep(0.01)
        for _ in range(100):
            await asyncio.sleep(0)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
    outcomes = await asyncio.gather(*puts, return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert not failed, f"{len(failed)} of {AT_ONCE} failed: {failed[0]!r}"


def test_a_single_redis_takes_as_many_operations_at_once_as_the_proxy_admits_clients(
    own_redis: RedisServer,
) -> None:
    async def run() -> None:
        # More operations in flight than redis-py's default pool holds (100): sized for
        # the clients the proxy admits, none fails "Too many connections".
        store = RedisStore(
            own_redis.url, timeout=30, version_ttl=60, metrics=Metrics(), mode="single",
            clients=AT_ONCE,
        )  # fmt: skip
        admin = aredis.Redis.from_url(own_redis.url)
        try:
            await puts_while_paused(store, admin, [f"k{i}" for i in range(AT_ONCE)])
            assert await admin.exists(*(f"k{i}" for i in range(AT_ONCE))) == AT_ONCE
        finally:
            await store.close()
            await admin.aclose()

    asyncio.run(run())


def test_a_cluster_node_takes_as_many_operations_at_once_as_the_proxy_admits_clients(
    redis_cluster: RedisCluster,
) -> None:
    async def run() -> None:
        store = RedisStore(
            redis_cluster.url, timeout=30, version_ttl=60, metrics=Metrics(), mode="cluster",
            clients=AT_ONCE,
        )  # fmt: skip
        keys = [f"{{pool}}k{i}" for i in range(AT_ONCE)]  # one slot: one node takes them all
        node = redis_cluster.master_of(keys[0])
        admin = aredis.Redis(host="127.0.0.1", port=node.port)
        try:
            await puts_while_paused(store, admin, keys)
            assert await admin.exists(*keys) == AT_ONCE
        finally:
            await store.close()
            await admin.aclose()

    asyncio.run(run())
