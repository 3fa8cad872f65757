"""The cache against the real HMS and real Redis: hits, invalidation, identity, fail-open."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess, upstream_calls
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client
from tests.rig.waiting import eventually
from tests.rig.workload import Workload, hits

pytestmark = pytest.mark.hms

M = idl.module()


def trino_select(sample: Sample, seqid: int) -> list[bytes]:
    """What Trino sends for SELECT ... FROM sales WHERE ds = '2024-01-01': each on its own
    connection, like Trino."""
    names = [n for n in sample.partition_names if n.startswith("ds=2024-01-01")]
    return [
        idl.encode_call(
            "get_table_req", seqid, req=M.GetTableRequest(dbName=sample.db, tblName=sample.table)
        ),
        idl.encode_call(
            "get_partition_names_ps",
            seqid,
            db_name=sample.db,
            tbl_name=sample.table,
            part_vals=["2024-01-01", ""],
            max_parts=-1,
        ),
        idl.encode_call(
            "get_partitions_by_names", seqid, db_name=sample.db, tbl_name=sample.table, names=names
        ),
        idl.encode_call(
            "get_partitions_statistics_req",
            seqid,
            request=M.PartitionsStatsRequest(sample.db, sample.table, ["amount", "item"], names),
        ),
    ]


@pytest.fixture(params=["embedded", "redis"])
def any_store(
    request: pytest.FixtureRequest, own_redis: RedisServer, proxy_factory: ProxyFactory
) -> ProxyProcess:
    """A proxy on each cache store: the in-process copies in front of Redis must hit too."""
    if request.param == "redis":
        return proxy_factory("--redis", own_redis.url)
    return proxy_factory()


def test_trino_select_replayed_is_answered_without_the_hms(
    hms: MetastoreServer, any_store: ProxyProcess, sample: Sample
) -> None:
    first = [raw.call("127.0.0.1", any_store.port, r) for r in trino_select(sample, 11)]
    direct = [raw.call(hms.host, hms.port, r) for r in trino_select(sample, 11)]
    assert first == direct
    calls_before, reads_before = upstream_calls(any_store), len(hms.callers())
    second = [raw.call("127.0.0.1", any_store.port, r) for r in trino_select(sample, 11)]
    assert second == direct
    assert upstream_calls(any_store) == calls_before  # the HMS received nothing
    assert len(hms.callers()) == reads_before
    for method in (
        "get_table_req",
        "get_partition_names_ps",
        "get_partitions_by_names",
        "get_partitions_statistics_req",
    ):
        assert any_store.metric("hmsproxy_cache_lookups_total", method=method, result="hit") == 1, (
            method
        )


def _by_names(port: int, sample: Sample, names: list[str], seqid: int = 3) -> bytes:
    request = idl.encode_call(
        "get_partitions_by_names", seqid, db_name=sample.db, tbl_name=sample.table, names=names
    )
    return raw.call("127.0.0.1", port, request)


def test_by_names_fetches_only_the_partitions_it_lacks(
    hms: MetastoreServer, any_store: ProxyProcess, sample: Sample
) -> None:
    names = list(sample.partition_names)
    absent = ["ds=1999-12-31/region=eu", "ds=1999-12-31/region=us"]
    _by_names(any_store.port, sample, names[:4] + absent[:1])  # caches 4, and 1 as absent
    calls_before = upstream_calls(any_store)
    wanted = list(reversed(names)) + absent  # any order, some absent, some new
    through = _by_names(any_store.port, sample, wanted)
    assert raw.same_result("get_partitions_by_names", through, _by_names(hms.port, sample, wanted))
    assert upstream_calls(any_store) == calls_before + 1  # one call, for the 3 it lacked
    assert any_store.metric("hmsproxy_cache_partitions_total", result="hit") == 5  # 4 + 1 absent
    assert any_store.metric("hmsproxy_cache_partitions_total", result="miss") == 5 + 3


def test_a_name_of_other_columns_is_answered_as_the_metastore_answers_it(
    hms: MetastoreServer, any_store: ProxyProcess, sample: Sample
) -> None:
    # The metastore matches a name whole, its columns too: ``dt=...`` names none of a table
    # partitioned by ``ds``, though its values are a partition's. The proxy answers neither
    # with the other's partitions, nor keeps one's answer for the other.
    right = [sample.partition_name]
    wrong = ["dt=" + sample.partition_name.removeprefix("ds=")]
    empty = _by_names(hms.port, sample, wrong)
    assert len(empty) < len(_by_names(hms.port, sample, right))  # (the premise)
    for names in (wrong, wrong, right, right, wrong, right + wrong, wrong + right):
        through = _by_names(any_store.port, sample, names)
        direct = _by_names(hms.port, sample, names)
        assert raw.same_result("get_partitions_by_names", through, direct), names


def test_a_write_to_one_partition_keeps_the_others(
    hms: MetastoreServer, any_store: ProxyProcess, sample: Sample
) -> None:
    names = list(sample.partition_names)
    _by_names(any_store.port, sample, names)
    with client("127.0.0.1", any_store.port) as c:
        part = c.get_partition_by_name(sample.db, sample.table, names[2])
        part.parameters["touched"] = str(time.time())
        c.alter_partition(sample.db, sample.table, part)
    hits = any_store.metric("hmsproxy_cache_partitions_total", result="hit")
    fresh = _by_names(any_store.port, sample, names)
    assert raw.same_result("get_partitions_by_names", fresh, _by_names(hms.port, sample, names))
    assert (
        any_store.metric("hmsproxy_cache_partitions_total", result="hit") == hits + len(names) - 1
    )


def test_not_found_is_remembered_until_created(
    hms: MetastoreServer, proxy: ProxyProcess, sample: Sample
) -> None:
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name="appears_later")
    not_found = raw.call(hms.host, hms.port, request)
    for _ in range(2):
        assert raw.call("127.0.0.1", proxy.port, request) == not_found
    assert (
        proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="negative_hit") == 1
    )
    with client("127.0.0.1", proxy.port) as c:
        table = c.get_table(sample.db, sample.unpartitioned)
        table.tableName = "appears_later"
        table.sd.location = None
        c.create_table(table)
    try:
        reply = raw.call("127.0.0.1", proxy.port, request)
        assert reply == raw.call(hms.host, hms.port, request)
        assert idl.decode_result("get_table", reply[21:]).success is not None
    finally:
        with client(hms.host, hms.port) as c:
            c.drop_table(sample.db, "appears_later", True)


@pytest.fixture
def shared_redis(redis_server: RedisServer) -> list[str]:
    return ["--redis", redis_server.url, "--redis-key-prefix", f"shared-{time.monotonic_ns()}:"]


def test_two_proxies_on_one_redis_see_each_others_writes(
    hms: MetastoreServer, proxy_factory: ProxyFactory, shared_redis: list[str], sample: Sample
) -> None:
    a, b = proxy_factory(*shared_redis), proxy_factory(*shared_redis)
    read = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.unpartitioned)
    raw.call("127.0.0.1", a.port, read)
    raw.call("127.0.0.1", b.port, read)  # both have it now (b from a's fill)
    assert b.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 1
    for round_ in range(3):
        with client("127.0.0.1", a.port) as c:
            table = c.get_table(sample.db, sample.unpartitioned)
            table.parameters["round"] = str(round_)
            c.alter_table(sample.db, sample.unpartitioned, table)
        seen = raw.call("127.0.0.1", b.port, read)  # immediately after a's reply
        assert seen == raw.call(hms.host, hms.port, read)


def test_user_scope_never_serves_one_users_reply_to_another(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    proxy = proxy_factory("--cache-scope", "user")
    table = sample.unpartitioned

    def read_as(user: str | None) -> bytes:
        with raw.RawConnection("127.0.0.1", proxy.port) as conn:
            if user:
                conn.call(idl.encode_call("set_ugi", 1, user_name=user, group_names=[f"{user}s"]))
            return conn.call(idl.encode_call("get_table", 2, dbname=sample.db, tbl_name=table))

    before = len(hms.callers())
    for _ in range(3):
        for user in ("alice", "bob", None):
            read_as(user)
    reads = [
        u for e, t, u in hms.callers()[before:] if e == "READ_TABLE" and t.endswith("." + table)
    ]
    # Each identity was fetched from the HMS once, as itself; the rest were its own hits.
    assert sorted(reads) == sorted(["alice", "bob", os.environ.get("USER", "root")])
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 6


def test_with_auth_reads_are_keyed_by_user_in_shared_scope(
    proxy: ProxyProcess, sample: Sample
) -> None:
    def read(user: str) -> bytes:
        return raw.call(
            "127.0.0.1",
            proxy.port,
            idl.encode_call(
                "get_partition_with_auth",
                1,
                db_name=sample.db,
                tbl_name=sample.table,
                part_vals=list(sample.partition_values),
                user_name=user,
                group_names=[],
            ),
        )

    read("alice")
    read("bob")
    read("alice")
    assert (
        proxy.metric(
            "hmsproxy_cache_lookups_total", method="get_partition_with_auth", result="miss"
        )
        == 2
    )
    assert (
        proxy.metric("hmsproxy_cache_lookups_total", method="get_partition_with_auth", result="hit")
        == 1
    )


def test_partitions_take_a_quarter_of_their_bytes_in_redis(
    proxy_factory: ProxyFactory, redis_server: RedisServer, sample: Sample
) -> None:
    prefix = f"size-{time.monotonic_ns()}:"
    proxy = proxy_factory("--redis", redis_server.url, "--redis-key-prefix", prefix)
    reply = _by_names(proxy.port, sample, list(sample.partition_names))
    assert _by_names(proxy.port, sample, list(sample.partition_names)) == reply
    r = redis.Redis(port=redis_server.port)
    stored = [r.strlen(k) for k in r.scan_iter(match=f"{prefix}*:p:*")]
    r.close()
    assert len(stored) == len(sample.partition_names)
    raw_bytes = len(reply) - 30  # the partitions, without the message and list headers
    assert sum(stored) <= 0.25 * raw_bytes, (sum(stored), raw_bytes)


# -- Redis failing -----------------------------------------------------------------------------


def test_redis_killed_and_restarted_under_load(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    proxy = proxy_factory("--redis", own_redis.url)
    with Workload(hms, proxy, sample) as load:
        eventually(lambda: hits(proxy) > 0, what="hits under load")
        own_redis.stop()
        rounds = load.rounds
        # The outage is seen, and at least three rounds of calls (and their writes) are
        # answered during it.
        eventually(lambda: proxy.metric_sum("hmsproxy_cache_errors_total") > 0, what="errors")
        eventually(
            lambda: load.rounds >= rounds + 3 + load.write_every, what="rounds during the outage"
        )
        hits_during_outage = hits(proxy)
        own_redis.start()  # same port, empty
        eventually(lambda: hits(proxy) > hits_during_outage + 5, 30, "hits again")
    assert load.errors == [] and load.failed_replies == []
    assert load.mismatches == []
    assert hits(proxy) > hits_during_outage + 5  # hits resumed without a restart
    assert proxy.metric_sum("hmsproxy_cache_errors_total") > 0
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="bypass") > 0


def test_redis_frozen_with_writes_pending(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    # SIGSTOP keeps Redis's data: entries filled before the freeze are still there after it,
    # and the writes made meanwhile must be applied before any of them is served again.
    proxy = proxy_factory("--redis", own_redis.url, "--redis-timeout", "0.05")
    assert own_redis.process is not None
    with Workload(hms, proxy, sample) as load:
        eventually(lambda: hits(proxy) > 0, what="hits under load")
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        try:
            # Writes are made while Redis does not answer, and their invalidations kept.
            eventually(
                lambda: "could not apply an invalidation" in proxy.log(),
                30,
                "an invalidation kept pending",
            )
            rounds = load.rounds
            eventually(lambda: load.rounds >= rounds + 3, 30, "reads while Redis is frozen")
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        eventually(
            lambda: "pending invalidations applied" in proxy.log(), 30, "the pending applied"
        )
        applied = hits(proxy)
        eventually(lambda: hits(proxy) > applied, 30, "hits after the pending were applied")
    assert load.errors == [] and load.failed_replies == []
    assert load.mismatches == []


def test_starts_and_serves_with_redis_down(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path, sample: Sample
) -> None:
    later = RedisServer(tmp_path / "later")
    proxy = proxy_factory("--redis", later.url)
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.table)
    direct = raw.call(hms.host, hms.port, request)
    assert raw.call("127.0.0.1", proxy.port, request) == direct

    def table_hits() -> float:
        assert raw.call("127.0.0.1", proxy.port, request) == direct
        return proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit")

    with later:  # Redis comes up now
        eventually(table_hits, 15, "hits to resume once Redis is up", interval=0.2)
