"""What a standby proxy believes about the notification log (it does not follow it itself)."""

from __future__ import annotations

import asyncio
import time

from proxy.cache.store import MemoryStore
from proxy.config import load
from proxy.follower import NotificationFollower
from proxy.metrics import Metrics
from proxy.upstream import UpstreamPool
from tests.unit.test_cache_engine import engine


class Standby(MemoryStore):
    """A store whose follower lease another proxy holds."""

    async def lease(self, key: str, token: str, ttl: float) -> bool:
        return False


def test_a_standby_follows_the_leaders_word_and_not_for_long_without_it() -> None:
    async def run() -> None:
        store = Standby(1 << 20)
        e = engine(store)
        options = load({"upstream": "thrift://h:1", "notification_poll": "1"}, {})
        follower = NotificationFollower(options, e, UpstreamPool(options, Metrics()), Metrics())
        await follower.poll()
        assert not follower.following  # no leader has said the log is followed
        await store.put(follower.verdict_key, b"1", 5)
        await follower.poll()
        assert follower.following
        await store.put(follower.verdict_key, b"0", 5)  # the leader saw the log stand still
        await follower.poll()
        assert not follower.following
        await store.put(follower.verdict_key, b"1", 5)
        await follower.poll()
        follower._last_success = time.time() - 60  # and then no poll for a minute
        assert not follower.following

    asyncio.run(run())
