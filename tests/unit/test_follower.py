"""What a standby proxy believes about the notification log (it does not follow it itself)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from proxy.cache.store import MemoryStore
from proxy.config import load
from proxy.follower import NotificationFollower
from proxy.metrics import Metrics
from proxy.upstream import UpstreamPool
from tests.unit.helpers import engine


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


def test_a_log_that_stands_still_is_said_once_per_change(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not every 30 s of a long run: once when the log stops moving under writes, once
    (info) when it moves again."""
    from proxy import follower as module

    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    e = engine(MemoryStore(1 << 20))
    options = load({"upstream": "thrift://h:1"}, {})
    follower = NotificationFollower(options, e, UpstreamPool(options, Metrics()), Metrics())
    writes = [0]
    monkeypatch.setattr(type(e), "writes", property(lambda self: writes[0]))
    caplog.set_level(logging.INFO, logger="proxy.follower")
    follower._check_log_is_written(5)
    for _ in range(10):  # five minutes of writes while the log stays at 5
        writes[0] += 1
        clock[0] += 31
        follower._check_log_is_written(5)
    assert not follower.state.active
    follower._check_log_is_written(6)  # it moves
    assert follower.state.active
    lines = [r.getMessage() for r in caplog.records]
    assert sum("did not move" in line for line in lines) == 1
    assert sum("moves again" in line for line in lines) == 1
