"""Versions in process, kept coherent by Redis (--redis-tracking), against the real HMS and a
real redis-server: hits without a round trip, another proxy's writes within the bound, and
no in-process hit while the invalidation stream is cut, stalled or flushed."""

from __future__ import annotations

import time

import pytest
import redis

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

MAX_LAG = 1.0


def local_reads(proxy: ProxyProcess) -> float:
    return proxy.metric("hmsproxy_cache_version_reads_total", source="local")


def redis_reads(proxy: ProxyProcess) -> float:
    return proxy.metric("hmsproxy_cache_version_reads_total", source="redis")


def hits(proxy: ProxyProcess) -> float:
    return proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit")


def trusted(proxy: ProxyProcess) -> bool:
    return proxy.metric("hmsproxy_redis_tracking_up") == 1


def table_read(sample: Sample) -> bytes:
    return idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.unpartitioned)


def alter(port: int, sample: Sample, value: str) -> None:
    with client("127.0.0.1", port) as c:
        table = c.get_table(sample.db, sample.unpartitioned)
        table.parameters["round"] = value
        c.alter_table(sample.db, sample.unpartitioned, table)


def pair(proxy_factory: ProxyFactory, url: str, *extra: str) -> tuple[ProxyProcess, ProxyProcess]:
    args = ["--redis", url, "--redis-key-prefix", f"trk-{time.monotonic_ns()}:"]
    # A busy machine's Redis replies may take longer than the default 50 ms: not the point.
    lag = ["--redis-tracking-max-lag", str(MAX_LAG), "--redis-timeout", "1"]
    return proxy_factory(*args, *lag), proxy_factory(*args, *lag, *extra)


def test_hits_read_their_versions_in_process(
    hms: MetastoreServer, proxy_factory: ProxyFactory, redis_server: RedisServer, sample: Sample
) -> None:
    proxy = proxy_factory(
        "--redis", redis_server.url, "--redis-key-prefix", "trk-hits:", "--redis-timeout", "1"
    )
    eventually(lambda: trusted(proxy), what="the invalidation stream delivering")
    read = table_read(sample)
    direct = raw.call(hms.host, hms.port, read)
    with raw.RawConnection("127.0.0.1", proxy.port) as conn:
        assert conn.call(read) == direct  # the miss; its fill is learned with its versions
        conn.call(read)  # the first hit reads Redis once more (the L1 copy of the reply)
        before_local, before_redis = local_reads(proxy), redis_reads(proxy)
        for _ in range(50):
            assert conn.call(read) == direct
    assert local_reads(proxy) - before_local == 50
    assert redis_reads(proxy) == before_redis  # not one Redis round trip for 50 hits
    assert proxy.metric("hmsproxy_redis_tracking_delivery_seconds_count") > 0


def test_a_write_through_another_proxy_is_seen_within_the_bound(
    hms: MetastoreServer, proxy_factory: ProxyFactory, redis_server: RedisServer, sample: Sample
) -> None:
    a, b = pair(proxy_factory, redis_server.url)
    eventually(lambda: trusted(a) and trusted(b), what="both streams delivering")
    read = table_read(sample)
    raw.call("127.0.0.1", b.port, read)
    raw.call("127.0.0.1", b.port, read)
    # An engine's long-lived connection to b, whose repeated call b answers again from
    # its last hit (proxy.handler.again): the same bound.
    with raw.RawConnection("127.0.0.1", b.port) as engine:
        engine.call(read)
        engine.call(read)
        delays = []
        for round_ in range(5):
            alter(a.port, sample, f"seen-{round_}")
            acknowledged = time.monotonic()
            direct = raw.call(hms.host, hms.port, read)
            eventually(
                lambda: engine.call(read) == direct,  # noqa: B023 (used at once)
                MAX_LAG,
                "the other proxy serving the write",
                interval=0.002,
            )
            delays.append(time.monotonic() - acknowledged)
            assert raw.call("127.0.0.1", b.port, read) == direct
            # ... and hits resume from process memory on b. Not always the next two: the
            # alter's notification event, applied by the follower a moment later, may
            # invalidate the fill once more (then a miss, and a hit that reads Redis once).
            local = local_reads(b)
            eventually(
                lambda: engine.call(read) == direct and local_reads(b) > local,  # noqa: B023
                what="in-process hits on b again",
            )
    print(f"seen through the other proxy after {[round(d * 1000, 1) for d in delays]} ms")


def test_with_tracking_off_every_hit_reads_redis_and_another_proxys_write_is_seen_at_once(
    hms: MetastoreServer, proxy_factory: ProxyFactory, redis_server: RedisServer, sample: Sample
) -> None:
    a, b = pair(proxy_factory, redis_server.url, "--redis-tracking", "off")
    read = table_read(sample)
    raw.call("127.0.0.1", b.port, read)
    assert b.metric("hmsproxy_redis_tracking_up") == 0
    for round_ in range(3):
        alter(a.port, sample, f"off-{round_}")
        seen = raw.call("127.0.0.1", b.port, read)  # immediately after a's reply
        direct = raw.call(hms.host, hms.port, read)
        assert seen == direct
        # The next read is a hit unless the alter's notification event, applied by a
        # follower a moment later, invalidated the fill once more: then the one after is.
        before = hits(b)
        eventually(
            lambda: raw.call("127.0.0.1", b.port, read) == direct and hits(b) > before,  # noqa: B023
            what="a hit on b",
        )
    assert local_reads(b) == 0
    assert hits(b) >= 3


def test_a_cut_stream_serves_no_in_process_hit_until_resubscribed(
    hms: MetastoreServer, proxy_factory: ProxyFactory, own_redis: RedisServer, sample: Sample
) -> None:
    a, b = pair(proxy_factory, own_redis.url)
    eventually(lambda: trusted(a) and trusted(b), what="both streams delivering")
    read = table_read(sample)
    admin = redis.Redis.from_url(own_redis.url)
    with raw.RawConnection("127.0.0.1", b.port) as engine:  # (its repeats answered again)
        for round_ in range(3):
            raw.call("127.0.0.1", b.port, read)
            raw.call("127.0.0.1", b.port, read)
            engine.call(read)
            engine.call(read)
            # Both streams are cut; the write lands while b hears nothing from Redis.
            assert admin.client_kill_filter(_type="pubsub") >= 2
            alter(a.port, sample, f"cut-{round_}")
            direct = raw.call(hms.host, hms.port, read)
            assert engine.call(read) == direct
            assert raw.call("127.0.0.1", b.port, read) == direct
            eventually(lambda: trusted(b), what="b's stream back")
    assert b.metric("hmsproxy_redis_tracking_resyncs_total", reason="stream_lost") >= 3
    # In-process hits again after the resubscription (not always the next call: the last
    # alter's notification event, applied by the follower a moment later, may invalidate
    # the fill once more).
    local = local_reads(b)
    eventually(
        lambda: raw.call("127.0.0.1", b.port, read) == direct and local_reads(b) > local,
        what="in-process hits on b again",
    )


def test_a_stalled_stream_sends_hits_to_redis(
    hms: MetastoreServer, proxy_factory: ProxyFactory, own_redis: RedisServer, sample: Sample
) -> None:
    # CLIENT PAUSE WRITE holds every write (the beats too) and lets reads through: the
    # stream delivers nothing, so after the bound the proxy no longer trusts its copy. (A
    # proxy whose own writes are held stops reading Redis at all after --redis-write-trust:
    # test_redis_refusals; set long here, to see the stream's own bound alone.)
    proxy = proxy_factory(
        "--redis",
        own_redis.url,
        "--redis-tracking-max-lag",
        str(MAX_LAG),
        "--redis-timeout",
        "1",
        "--redis-write-trust",
        "60",
    )
    eventually(lambda: trusted(proxy), what="the stream delivering")
    read = table_read(sample)
    direct = raw.call(hms.host, hms.port, read)
    engine = raw.RawConnection("127.0.0.1", proxy.port)  # (its repeats answered again)
    for _ in range(3):
        engine.call(read)
    admin = redis.Redis.from_url(own_redis.url)
    admin.execute_command("CLIENT", "PAUSE", "4000", "WRITE")
    try:
        eventually(lambda: not trusted(proxy), 3 * MAX_LAG, "the copy no longer trusted")
        before = redis_reads(proxy)
        assert raw.call("127.0.0.1", proxy.port, read) == direct
        assert redis_reads(proxy) == before + 1  # the hit asked Redis for its versions
        assert engine.call(read) == direct
        assert redis_reads(proxy) == before + 2  # ... and so did the one asked again
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        engine.close()
    eventually(lambda: trusted(proxy), 10, "trusted again once the beats come back")


def test_a_flush_of_redis_is_heard(
    hms: MetastoreServer, proxy_factory: ProxyFactory, own_redis: RedisServer, sample: Sample
) -> None:
    proxy = proxy_factory("--redis", own_redis.url, "--redis-timeout", "1")
    eventually(lambda: trusted(proxy), what="the stream delivering")
    read = table_read(sample)
    for _ in range(3):
        raw.call("127.0.0.1", proxy.port, read)
    misses = proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="miss")
    redis.Redis.from_url(own_redis.url).flushall()
    # The versions are gone from Redis: the reply in process must not be served under the
    # versions the proxy remembered.
    eventually(
        lambda: (
            raw.call("127.0.0.1", proxy.port, read) is not None
            and proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="miss")
            > misses
        ),
        5,
        "a miss after the flush",
    )
