"""When the Redis store stops trying (its breaker) and when it keeps going (pure logic).

The breaker with a real, frozen and killed Redis is tested in tests/integration/test_cache.py.
"""

from __future__ import annotations

from proxy.cache.redis_store import TIMEOUTS_TO_OPEN, RedisStore
from proxy.metrics import Metrics


def _store() -> RedisStore:
    return RedisStore("redis://127.0.0.1:9/0", timeout=0.05, version_ttl=60, metrics=Metrics())


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
