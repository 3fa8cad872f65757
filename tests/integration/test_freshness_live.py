"""The freshness check against the real Hive Metastore 2.3.10 and a real Redis: a table changed
straight at the metastore while the proxy does not follow the notification log is served
stale from the cache (stale within the TTL by design), until the check re-reads a hit,
counts it as unlogged on /metrics (not a mismatch: nothing to alert on), logs it, and the
table is answered from the metastore. With the log followed, such writes are never counted
stale at all."""

from __future__ import annotations

import os
import time

import pytest

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client, storage_descriptor, table
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms


def new_table(hms: MetastoreServer, sample: Sample, prefix: str) -> str:
    """A table of this test's own in the sample database: its name."""
    name = f"{prefix}_{os.getpid()}_{time.monotonic_ns()}"
    location = f"{hms.warehouse.as_uri()}/{sample.db}.db/{name}"
    with client(hms.host, hms.port) as c:
        c.create_table(table(sample.db, name, storage_descriptor(location)))
    return name


def test_a_stale_hit_is_counted_and_its_table_then_read_from_the_metastore(
    hms: MetastoreServer, sample: Sample, redis_server: RedisServer, proxy_factory: ProxyFactory
) -> None:
    name = new_table(hms, sample, "freshness")
    proxy = proxy_factory(
        "--redis",
        redis_server.url,
        "--redis-key-prefix",
        f"{name}:",  # (a Redis of the session's: this test's keys apart)
        "--notifications",
        "off",
        "--freshness-check-rate",
        "20",
        "--freshness-quarantine",
        "60",
    )
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=name)

    def through_proxy() -> bytes:
        return raw.call("127.0.0.1", proxy.port, request)

    def changed(reply: bytes) -> bool:
        got = idl.decode_result("get_table", reply[12 + len("get_table") :]).success
        return bool(got.parameters.get("changed") == "yes")

    through_proxy()
    through_proxy()
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") >= 1
    # Straight at the metastore: with the log not followed, the proxy cannot know.
    with client(hms.host, hms.port) as c:
        new = c.get_table(sample.db, name)
        new.parameters["changed"] = "yes"
        c.alter_table(sample.db, name, new)
    direct = raw.call(hms.host, hms.port, request)
    assert changed(direct)
    assert not changed(through_proxy())  # a stale hit

    def found() -> bool:
        through_proxy()  # (hits for the check to take)
        return proxy.metric("hmsproxy_freshness_checks_total", result="unlogged") >= 1

    eventually(found, 30, "the freshness check to count the stale hit")
    # The log not followed: stale within the TTL by design, never a mismatch (the alert).
    assert proxy.metric("hmsproxy_freshness_checks_total", result="mismatch") == 0
    assert proxy.metric("hmsproxy_freshness_mismatches_total", method="get_table") == 0
    assert f"a cached reply of get_table for {sample.db}.{name}" in proxy.log()
    assert "the notification log is not followed" in proxy.log()
    # From the metastore now, and for the quarantine: neither a hit nor filled.
    for _ in range(3):
        hits = proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit")
        upstream = proxy.metric(
            "hmsproxy_upstream_requests_total", method="get_table", outcome="ok"
        )
        reply = through_proxy()
        assert raw.same_result("get_table", reply, direct) and changed(reply)
        assert (
            proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == hits
        )
        assert (
            proxy.metric("hmsproxy_upstream_requests_total", method="get_table", outcome="ok")
            == upstream + 1
        )


def test_writes_the_notification_log_shows_are_never_counted_stale(
    hms: MetastoreServer, sample: Sample, redis_server: RedisServer, proxy_factory: ProxyFactory
) -> None:
    """Straight at the metastore, with the log followed: hits are stale until the follower
    applies the write's event (about a poll), and the check waits for the follower before it
    judges, so none of them is counted."""
    name = new_table(hms, sample, "followed")
    proxy = proxy_factory(
        "--redis",
        redis_server.url,
        "--redis-key-prefix",
        f"{name}:",
        "--notification-poll",
        "0.3",
        "--freshness-check-rate",
        "20",
    )
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=name)
    for round_ in range(4):
        with client(hms.host, hms.port) as c:
            new = c.get_table(sample.db, name)
            new.parameters["round"] = str(round_)
            c.alter_table(sample.db, name, new)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            raw.call("127.0.0.1", proxy.port, request)
    checks = {
        result: proxy.metric("hmsproxy_freshness_checks_total", result=result)
        for result in ("match", "mismatch", "unlogged", "changed", "undecided", "failed")
    }
    assert checks["mismatch"] == 0 and checks["unlogged"] == 0, checks
    assert checks["match"] >= 1, checks
