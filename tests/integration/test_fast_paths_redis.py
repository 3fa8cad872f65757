"""The fast paths change nothing but speed on a real Redis too: the randomised workload of
tests/unit/differential.py, with the cache in Redis (CLIENT TRACKING on, so hits are judged
against the versions kept in process, as in production) and with tracking off, run once with
the fast paths on and once off, gets the same bytes for every call, the same metric counts
and the same calls to the metastore. Each run has a key prefix of its own, so the two start
from the same empty cache."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from proxy.app import build_cache
from tests.rig.redis_server import RedisServer
from tests.unit.differential import assert_same, served
from tests.unit.inprocess import Rig

PREFIXES = itertools.count()
TTL_SCOPES = ("catalog", "database", "table", "partitions", "statistics", "negative")


async def trusted(r: Rig) -> None:
    """Redis connected, and (with tracking on) its streams and write probes trusted: hits
    may then be served from the versions in process."""
    assert r.cache is not None
    store = r.cache.store
    assert await store.connect(wait=5.0), "redis not reachable"
    tracking = r.options.redis_tracking == "on"
    deadline = time.monotonic() + 10.0
    # A write probe taken (else every look-up is a bypass), and with tracking the streams'
    # beats back too (else no hit is judged in process).
    while not store.write_trust.trusted(time.monotonic()) or (tracking and not store.in_process()):
        assert time.monotonic() < deadline, "redis never became trusted"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("tracking", ["on", "off"])
@pytest.mark.parametrize("seed", [4, 5])
def test_the_fast_paths_give_the_same_bytes_and_counts_on_redis(
    redis_server: RedisServer, tracking: str, seed: int
) -> None:
    def options() -> dict[str, str]:
        return {
            "redis": redis_server.url,
            "redis_key_prefix": f"fast{next(PREFIXES)}-{seed}-{tracking}:",
            "redis_tracking": tracking,
            "cache_scope": "user" if seed % 2 else "shared",
            # A busy machine's slow Redis reply, or late write probe, is not a bypass here:
            # both runs must take the same way at the store.
            "redis_timeout": "5",
            "redis_write_trust": "60",
            # Nothing expires within a run: the two runs take different times.
            **{f"ttl_{scope}": "3600" for scope in TTL_SCOPES},
        }

    async def run() -> None:
        fast = await served("on", seed, 120, ready=trusted, build=build_cache, **options())
        ordinary = await served("off", seed, 120, ready=trusted, build=build_cache, **options())
        # With tracking off every hit is a round trip to Redis: none is answered at once.
        assert_same(fast, ordinary, at_least_at_once=10 if tracking == "on" else 0)

    asyncio.run(run())
