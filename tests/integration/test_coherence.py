"""Writers that bypass the proxy, a follower that dies, a log with a gap, a proxy killed mid-write.

The HMS in the rig writes a real notification log (tests/rig/java/NotificationLog.java, a
stand-in for Hive's DbNotificationListener). Bypassing writes are made with hmsclient
straight at the HMS.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client, create
from tests.rig.waiting import eventually, wait_for_slow_call

pytestmark = pytest.mark.hms

POLL = "0.3"


def by_names(sample: Sample) -> bytes:
    return idl.encode_call(
        "get_partitions_by_names",
        1,
        db_name=sample.db,
        tbl_name=sample.table,
        names=list(sample.partition_names),
    )


def reads(sample: Sample) -> list[tuple[str, bytes]]:
    """What engines ask about the sample table, whole lists and single objects."""
    s = sample
    calls: list[tuple[str, dict[str, object]]] = [
        ("get_table", {"dbname": s.db, "tbl_name": s.table}),
        ("get_table", {"dbname": s.db, "tbl_name": s.unpartitioned}),
        ("get_partition_names", {"db_name": s.db, "tbl_name": s.table, "max_parts": -1}),
        ("get_partitions", {"db_name": s.db, "tbl_name": s.table, "max_parts": -1}),
        (
            "get_partitions_by_names",
            {"db_name": s.db, "tbl_name": s.table, "names": list(s.partition_names)},
        ),
        (
            "get_partition",
            {"db_name": s.db, "tbl_name": s.table, "part_vals": list(s.partition_values)},
        ),
    ]
    return [(m, idl.encode_call(m, 1, **a)) for m, a in calls]


def fresh(hms: MetastoreServer, proxy: ProxyProcess, sample: Sample) -> bool:
    """Does every read through the proxy now equal the same read at the HMS?"""
    return all(
        raw.same_result(m, raw.call("127.0.0.1", proxy.port, r), raw.call(hms.host, hms.port, r))
        for m, r in reads(sample)
    )


def warm(proxy: ProxyProcess, sample: Sample) -> None:
    for _ in range(2):
        for _, request in reads(sample):
            raw.call("127.0.0.1", proxy.port, request)


def seconds_until_fresh(
    hms: MetastoreServer, proxy: ProxyProcess, sample: Sample, limit: float
) -> float:
    started = time.monotonic()
    eventually(lambda: fresh(hms, proxy, sample), limit, "the proxy to serve what the HMS has")
    return time.monotonic() - started


def bypass_writes(hms: MetastoreServer, sample: Sample) -> Iterator[Callable[[], None]]:
    """Writes made straight at the HMS, one kind after another."""
    day = f"2030-01-{int(time.time() * 10) % 28 + 1:02d}"

    def add() -> None:
        with client(hms.host, hms.port) as c:
            template = c.get_partition_by_name(sample.db, sample.table, sample.partition_name)
            template.values = [day, "eu"]
            template.sd.location = None
            c.add_partitions([template])

    def alter_partition() -> None:
        with client(hms.host, hms.port) as c:
            part = c.get_partition_by_name(sample.db, sample.table, sample.partition_name)
            part.parameters["bypass"] = str(time.time())
            c.alter_partition(sample.db, sample.table, part)

    def alter_table() -> None:
        with client(hms.host, hms.port) as c:
            table = c.get_table(sample.db, sample.table)
            table.parameters["bypass"] = str(time.time())
            c.alter_table(sample.db, sample.table, table)

    def drop() -> None:
        with client(hms.host, hms.port) as c:
            c.drop_partition(sample.db, sample.table, [day, "eu"], True)

    yield from (add, alter_partition, alter_table, drop)


def test_bypassing_writes_are_seen_within_a_poll(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    proxy = proxy_factory(
        "--notification-poll", POLL, "--ttl-table", "600", "--ttl-partitions", "600"
    )
    for write in bypass_writes(hms, sample):
        warm(proxy, sample)
        write()
        # One poll, plus the time for the reads of this check: never the 600 s TTL.
        assert seconds_until_fresh(hms, proxy, sample, limit=5) < 3, write.__name__
    events = {
        dict(labels)["type"]: v
        for (name, labels), v in proxy.metrics().items()
        if name == "hmsproxy_notification_events_total" and v
    }
    assert {"ADD_PARTITION", "ALTER_PARTITION", "ALTER_TABLE", "DROP_PARTITION"} <= set(events)
    assert proxy.metric("hmsproxy_notification_leader") == 1


def test_with_notifications_off_the_ttl_bounds_staleness(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    proxy = proxy_factory("--notifications", "off", "--ttl-table", "2", "--ttl-partitions", "2")
    writes = bypass_writes(hms, sample)
    next(writes)()  # add
    warm(proxy, sample)
    next(writes)()  # alter_partition
    stale = raw.call("127.0.0.1", proxy.port, by_names(sample))
    assert not raw.same_result(
        "get_partitions_by_names", stale, raw.call(hms.host, hms.port, by_names(sample))
    )
    assert seconds_until_fresh(hms, proxy, sample, limit=6) < 4
    for write in writes:
        write()


def test_one_follower_at_a_time_and_takeover(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    args = (
        "--redis",
        own_redis.url,
        "--notification-poll",
        POLL,
        "--follower-lease",
        "2",
        "--ttl-table",
        "600",
        "--ttl-partitions",
        "600",
    )
    a, b = proxy_factory(*args), proxy_factory(*args)
    # Once both have polled, each has taken the lease or found it taken: one follows.
    eventually(
        lambda: all(p.metric("hmsproxy_notification_last_poll_timestamp_seconds") for p in (a, b)),
        what="both proxies to poll the follower lease",
    )
    leaders = [p for p in (a, b) if p.metric("hmsproxy_notification_leader") == 1]
    assert len(leaders) == 1
    leader, survivor = leaders[0], (b if leaders[0] is a else a)
    writes = bypass_writes(hms, sample)
    warm(survivor, sample)
    next(writes)()  # just before the follower dies: applied by it or by its successor
    leader.signal(signal.SIGKILL)
    leader.wait(10)
    for write in writes:
        warm(survivor, sample)
        write()
        # The lease (2 s) runs out, the survivor takes over from the last applied event.
        assert seconds_until_fresh(hms, survivor, sample, limit=8) < 6
    assert survivor.metric("hmsproxy_notification_leader") == 1
    assert survivor.metric("hmsproxy_notification_gaps_total") == 0


def test_a_gap_in_the_log_flushes_the_cache(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    args = ("--redis", own_redis.url, "--notification-poll", POLL, "--ttl-partitions", "600")
    first = proxy_factory(*args)
    warm(first, sample)
    assert first.stop() == 0
    writes = bypass_writes(hms, sample)
    next(writes)()  # add
    next(writes)()  # alter: both logged, then purged before any follower sees them
    # Not a wait for the proxy: the two events must age. The purge below drops events older
    # than one second, counted in whole seconds, so they must be two seconds old.
    time.sleep(2.5)
    with client(hms.host, hms.port) as c:
        c.create_database(type(c.get_database(sample.db))("rig_purge_notifications", "", None, {}))
        c.drop_database("rig_purge_notifications", True, True)
    second = proxy_factory(*args)
    assert fresh(hms, second, sample)
    assert second.metric("hmsproxy_notification_gaps_total") == 1
    assert "are gone from the log" in second.log()
    for write in writes:
        write()


def test_a_log_reset_flushes_the_cache(
    own_redis: RedisServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    # A metastore rebuilt from scratch: its event ids restart below the stored position.
    args = ("--redis", own_redis.url, "--notification-poll", POLL)
    old = MetastoreServer(tmp_path / "old")
    old.start()
    sample = create(old.host, old.port, old.warehouse.as_uri())
    try:
        with client(old.host, old.port) as c:
            for i in range(5):  # move the old log well ahead
                c.create_database(type(c.get_database(sample.db))(f"filler{i}", "", None, {}))
        proxy = proxy_factory(*args, upstream=old.uri)
        warm(proxy, sample)
        proxy.stop()
    finally:
        old.stop()
    new = MetastoreServer(tmp_path / "new", port=old.port)
    new.start()
    try:
        sample = create(new.host, new.port, new.warehouse.as_uri())
        proxy = proxy_factory(*args, upstream=new.uri)
        assert fresh(new, proxy, sample)
        assert "log reset" in proxy.log()
    finally:
        new.stop()


def test_a_proxy_killed_mid_write_leaves_no_stale_cache(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    table = "slowwrite_fenced"
    with client(hms.host, hms.port) as c:
        if table not in c.get_all_tables(sample.db):
            template = c.get_table(sample.db, sample.unpartitioned)
            template.tableName, template.sd.location = table, None
            c.create_table(template)
    # No follower (it would mask the fence), long TTLs (they would too), a short fence.
    args = (
        "--redis",
        own_redis.url,
        "--notifications",
        "off",
        "--ttl-table",
        "600",
        "--write-fence-seconds",
        "5",
    )
    victim, observer = proxy_factory(*args), proxy_factory(*args)
    read = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=table)
    for _ in range(2):
        raw.call("127.0.0.1", observer.port, read)
    assert observer.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 1

    def alter() -> None:  # the HMS takes 3 s over it (CallerLog.java)
        with client("127.0.0.1", victim.port) as c:
            t = c.get_table(sample.db, table)
            t.parameters["victim_write"] = str(time.time())
            with contextlib.suppress(Exception):
                c.alter_table(sample.db, table, t)

    writer = threading.Thread(target=alter)
    before = hms.slow_calls_started()
    writer.start()
    wait_for_slow_call(hms, before)  # the alter is at the HMS, three seconds from done
    victim.signal(signal.SIGKILL)  # after forwarding, before invalidating
    victim.wait(10)
    writer.join(30)
    committed = False
    violations = []
    deadline = time.monotonic() + 9  # past the fence (5 s), into cached reads again
    while time.monotonic() < deadline:
        direct = raw.call(hms.host, hms.port, read)
        through = raw.call("127.0.0.1", observer.port, read)
        committed = committed or b"victim_write" in direct
        if committed and b"victim_write" not in through:
            violations.append(time.monotonic())
        time.sleep(0.05)  # the pace of the watch, which lasts its whole 9 s: the scenario
    assert committed, "the HMS never applied the write"
    assert violations == []
    hits = observer.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit")
    assert hits > 1  # after the fence, reads are cached again (the new table)


def test_stale_if_error_serves_cached_reads_while_the_hms_is_down(
    own_hms: MetastoreServer, proxy_factory: ProxyFactory
) -> None:
    sample = create(own_hms.host, own_hms.port, own_hms.warehouse.as_uri())
    proxy = proxy_factory(
        "--ttl-table",
        "1",
        "--stale-if-error",
        "60",
        "--notifications",
        "off",
        upstream=own_hms.uri,
    )
    read = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.table)
    cached = raw.call("127.0.0.1", proxy.port, read)
    own_hms.kill()
    time.sleep(1.5)  # the entry's TTL (1 s) runs out on purpose: the scenario is an expired entry
    assert raw.call("127.0.0.1", proxy.port, read) == cached
    assert proxy.metric("hmsproxy_stale_replies_total", method="get_table") == 1
    other = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.unpartitioned)
    assert raw.call("127.0.0.1", proxy.port, other)[3] == 3  # never cached: a Thrift error
