"""When the Redis store stops trying (its breaker) and when it keeps going (pure logic).

The breaker is a value (proxy.retry.Breaker) on a fake clock here, then inside the store,
which decides what counts as a timeout and what as a failure, and logs and counts. The
breaker with a real, frozen and killed Redis is tested in tests/integration/test_cache.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from proxy.cache.redis_link import TIMEOUTS_TO_OPEN, redis_failure
from proxy.cache.redis_store import RedisStore
from proxy.cache.store import CacheUnavailable
from proxy.metrics import Metrics
from proxy.retry import Backoff, Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: Clock) -> Breaker:
    backoff = Backoff(base=0.2, cap=5.0, _random=random.Random(7))
    return Breaker(backoff, timeouts_to_open=3, clock=clock)


def test_timeouts_open_it_only_when_they_outnumber_successes_within_a_second() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.succeeded()
    for _ in range(3):
        assert breaker.timed_out() is None  # three, not more than the successes
    opened = breaker.timed_out()
    assert opened is not None and opened.first
    assert not breaker.ready()


def test_fewer_timeouts_than_the_threshold_never_open_it() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(100):
        assert breaker.timed_out() is None
        assert breaker.timed_out() is None
        clock.now += 1.0  # each second starts a new count
    assert breaker.ready()


def test_the_count_starts_again_each_second() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(50):
        breaker.succeeded()
    clock.now += 0.999
    for _ in range(10):
        assert breaker.timed_out() is None  # the successes of this second still outnumber
    clock.now += 0.001  # a new second: 10 timeouts and no success are forgotten too
    for _ in range(2):
        assert breaker.timed_out() is None
    assert breaker.timed_out() is not None


def test_a_failure_opens_it_at_once_then_backs_off_then_lets_attempts_through() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    for _ in range(50):
        breaker.succeeded()
    opened = breaker.failed()
    assert opened.first and 0.1 <= opened.delay <= 0.2
    assert not breaker.ready()
    clock.now += opened.delay
    assert breaker.ready()  # the backoff is over: an attempt may go
    failed_at = clock.now
    again = breaker.failed()  # it failed too: a longer wait, and no second warning
    assert not again.first and 0.2 <= again.delay <= 0.4
    clock.now = failed_at + again.delay * 0.99
    assert not breaker.ready()
    clock.now = failed_at + again.delay
    assert breaker.ready()
    assert breaker.succeeded()  # closed by this success
    assert breaker.ready()
    assert not breaker.succeeded()  # already closed
    assert breaker.failed().first  # a new outage


def test_the_backoff_grows_to_its_cap() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    delays = [breaker.failed().delay for _ in range(12)]
    assert all(2.5 <= d <= 5.0 for d in delays[6:])


def test_try_now_lets_one_attempt_through_an_open_breaker() -> None:
    clock = Clock()
    breaker = _breaker(clock)
    breaker.failed()
    assert not breaker.ready()
    breaker.try_now()
    assert breaker.ready()
    breaker.failed()
    assert not breaker.ready()


# -- inside the store: which errors are timeouts, and what it reports -------------------------


def _store() -> RedisStore:
    """A store whose breaker's clock stands still: the counts here all fall in one second,
    however slowly the machine runs the test."""
    return RedisStore(
        "redis://127.0.0.1:9/0",
        timeout=0.05,
        version_ttl=60,
        metrics=Metrics(),
        breaker=_breaker(Clock()),
    )


def test_a_few_late_replies_among_many_good_ones_do_not_open_the_breaker() -> None:
    store = _store()
    for _ in range(50):
        store._succeeded()
    for _ in range(TIMEOUTS_TO_OPEN * 5):
        store._failed("get", TimeoutError())
        assert store.available  # each of those calls went to the metastore, nothing more
    assert store.metrics.registry.get_sample_value("hmsproxy_cache_available") == 1


def test_timeouts_that_outnumber_successes_open_it() -> None:
    store = _store()
    store._succeeded()
    for _ in range(TIMEOUTS_TO_OPEN - 1):
        store._failed("get", TimeoutError())
    assert store.available
    store._failed("get", TimeoutError())
    assert not store.available
    assert store.metrics.registry.get_sample_value("hmsproxy_cache_available") == 0


def test_a_connection_failure_opens_it_at_once() -> None:
    store = _store()
    for _ in range(50):
        store._succeeded()
    store._failed("get", ConnectionRefusedError())
    assert not store.available


def test_a_connect_timeout_is_a_connection_failure() -> None:
    store = _store()
    store._failed("connect", TimeoutError())
    assert not store.available


def test_the_store_says_when_redis_answers_again() -> None:
    clock = Clock()
    store = RedisStore(
        "redis://127.0.0.1:9/0",
        timeout=0.05,
        version_ttl=60,
        metrics=Metrics(),
        breaker=_breaker(clock),
    )
    store._failed("get", ConnectionRefusedError())
    assert store.metrics.registry.get_sample_value("hmsproxy_cache_available") == 0
    assert (
        store.metrics.registry.get_sample_value("hmsproxy_cache_errors_total", {"operation": "get"})
        == 1
    )
    clock.now += 10
    assert store.available
    store._succeeded()
    assert store.metrics.registry.get_sample_value("hmsproxy_cache_available") == 1


def test_a_write_to_a_connection_uvloop_closed_is_redis_failing_not_a_bug() -> None:
    # Seen under load on uvloop: redis-py's connect wrote to a transport uvloop had closed
    # ("the handler is closed", a RuntimeError), which reached the client as an internal
    # error. It is Redis failing: the store fails open and drops its client.
    async def run() -> None:
        store = _store()

        class Closed:
            def pipeline(self, transaction: bool) -> Any:
                return self

            def get(self, key: str) -> None:
                pass

            async def execute(self, raise_on_error: bool) -> Any:
                raise RuntimeError(
                    "unable to perform operation on <TCPTransport closed=True>; the handler is"
                    " closed"
                )

            async def aclose(self) -> None:
                pass

        store._client = Closed()
        with pytest.raises(CacheUnavailable):
            await store._run("get", [("get", ("k",), {})])
        assert store._client is None  # dropped: the next operation connects afresh
        assert not store.available
        assert redis_failure(RuntimeError("the handler is closed"))
        assert not redis_failure(RuntimeError("coroutine was never awaited"))  # a bug: raised
        await store.close()

    asyncio.run(run())
