"""The admin port: invalidate, flush, stats, warm; the token; health for Kubernetes probes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from proxy import idl
from proxy.admin._gen import admin_pb2 as pb
from proxy.admin._gen import admin_pb2_grpc as pb_grpc
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.ports import free_port
from tests.rig.proxy_process import NOT_SERVING, REPO, SERVING, ProxyProcess, health, upstream_calls
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client, create
from tests.rig.waiting import eventually

M = idl.module()


def admin(proxy: ProxyProcess) -> pb_grpc.AdminStub:
    return pb_grpc.AdminStub(grpc.insecure_channel(f"127.0.0.1:{proxy.admin_port}"))


def cli(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args, "--admin", f"127.0.0.1:{proxy.admin_port}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.fixture
def quiet(proxy_factory: ProxyFactory) -> ProxyProcess:
    """No follower and long TTLs: only the admin API can make it see a bypassing write."""
    return proxy_factory("--notifications", "off", "--ttl-table", "600", "--ttl-partitions", "600")


def by_names(sample: Sample, names: list[str]) -> bytes:
    return idl.encode_call(
        "get_partitions_by_names", 1, db_name=sample.db, tbl_name=sample.table, names=names
    )


@pytest.mark.hms
def test_invalidate_a_table_and_one_partition(
    hms: MetastoreServer, quiet: ProxyProcess, sample: Sample
) -> None:
    table_read = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.table)
    names = list(sample.partition_names)
    for _ in range(2):
        raw.call("127.0.0.1", quiet.port, table_read)
        raw.call("127.0.0.1", quiet.port, by_names(sample, names))
    with client(hms.host, hms.port) as c:  # behind the proxy's back
        t = c.get_table(sample.db, sample.table)
        t.parameters["admin_test"] = str(time.time())
        c.alter_table(sample.db, sample.table, t)
        p = c.get_partition_by_name(sample.db, sample.table, sample.partition_name)
        p.parameters["admin_test"] = str(time.time())
        c.alter_partition(sample.db, sample.table, p)
    assert raw.call("127.0.0.1", quiet.port, table_read) != raw.call(hms.host, hms.port, table_read)
    reply = admin(quiet).Invalidate(pb.InvalidateRequest(database=sample.db, table=sample.table))
    assert reply.scopes >= 1
    assert raw.call("127.0.0.1", quiet.port, table_read) == raw.call(hms.host, hms.port, table_read)
    # The partition: through the CLI, and only that one.
    hits = quiet.metric("hmsproxy_cache_partitions_total", result="hit")
    raw.call("127.0.0.1", quiet.port, by_names(sample, names))  # re-filled after the table reset
    done = cli(
        quiet, "invalidate", f"{sample.db}.{sample.table}", "--partition", sample.partition_name
    )
    assert done.returncode == 0, done.stderr
    hits = quiet.metric("hmsproxy_cache_partitions_total", result="hit")
    through = raw.call("127.0.0.1", quiet.port, by_names(sample, names))
    assert raw.same_result(
        "get_partitions_by_names", through, raw.call(hms.host, hms.port, by_names(sample, names))
    )
    assert quiet.metric("hmsproxy_cache_partitions_total", result="hit") == hits + len(names) - 1


@pytest.mark.hms
def test_flush_and_stats(quiet: ProxyProcess, sample: Sample) -> None:
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.table)
    for _ in range(3):
        raw.call("127.0.0.1", quiet.port, request)
    # On a connection still open, the calls it answered again (proxy.handler.again) are
    # counted when they are asked for.
    with raw.RawConnection("127.0.0.1", quiet.port) as conn:
        for _ in range(4):
            conn.call(request)
        stats = admin(quiet).Stats(pb.StatsRequest())
    table = next(m for m in stats.methods if m.method == "get_table")
    assert (table.hits, table.misses) == (6, 1)
    assert stats.store == "embedded" and stats.entries >= 1 and stats.bytes > 0
    assert admin(quiet).FlushAll(pb.FlushAllRequest()).keys_removed >= 1
    raw.call("127.0.0.1", quiet.port, request)
    assert quiet.metric("hmsproxy_cache_lookups_total", method="get_table", result="miss") == 2
    shown = cli(quiet, "stats")
    assert shown.returncode == 0 and "get_table" in shown.stdout and "hit ratio" in shown.stdout


@pytest.mark.hms
def test_warm_then_a_trino_read_is_fully_cached(
    hms: MetastoreServer, quiet: ProxyProcess, sample: Sample
) -> None:
    done = cli(quiet, "warm", f"{sample.db}.{sample.table}", "--batch", "4")
    assert done.returncode == 0, done.stderr
    assert f"{len(sample.partition_names)}/{len(sample.partition_names)} partitions" in done.stderr
    before = upstream_calls(quiet)
    names = list(sample.partition_names)
    trino = [
        idl.encode_call(
            "get_table_req",
            1,
            req=M.GetTableRequest(
                sample.db,
                sample.table,
                M.ClientCapabilities([M.ClientCapability.INSERT_ONLY_TABLES]),
            ),
        ),
        idl.encode_call(
            "get_partition_names", 1, db_name=sample.db, tbl_name=sample.table, max_parts=-1
        ),
        by_names(sample, names[:3]),
        by_names(sample, names[3:]),
    ]
    for request in trino:
        raw.call("127.0.0.1", quiet.port, request)
    assert upstream_calls(quiet) == before  # everything came from the cache


@pytest.mark.hms
def test_warm_with_a_partition_filter(quiet: ProxyProcess, sample: Sample) -> None:
    progress = list(
        admin(quiet).Warm(
            pb.WarmRequest(database=sample.db, table=sample.table, partition_filter='region = "eu"')
        )
    )
    assert progress[-1].stage == "done" and progress[-1].partitions_total == 3
    with pytest.raises(grpc.RpcError) as err:
        list(admin(quiet).Warm(pb.WarmRequest(database=sample.db, table="no_such_table")))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND


@pytest.mark.hms
def test_a_token_guards_the_admin_api_off_loopback(
    proxy_factory: ProxyFactory, tmp_path: Path, sample: Sample
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port = free_port()
    proxy = proxy_factory("--admin-listen", f"0.0.0.0:{port}", "--admin-token-file", str(token))
    proxy.admin_port = port
    with pytest.raises(grpc.RpcError) as err:
        admin(proxy).Stats(pb.StatsRequest())
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError):
        admin(proxy).FlushAll(pb.FlushAllRequest(), metadata=[("authorization", "Bearer wrong")])
    assert (
        admin(proxy).Stats(pb.StatsRequest(), metadata=[("authorization", "Bearer s3cret")]).store
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "stats",
            "--admin",
            f"127.0.0.1:{proxy.admin_port}",
            "--token-file",
            str(token),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert health(proxy, "") == SERVING  # probes need no token


def test_a_public_admin_port_without_a_token_does_not_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--upstream",
            "thrift://h:9083",
            "--admin-listen",
            "0.0.0.0:19999",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    assert "admin_token_file: required" in done.stderr


@pytest.mark.hms
def test_health_follows_the_metastore_and_redis(
    own_hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory
) -> None:
    create(own_hms.host, own_hms.port, own_hms.warehouse.as_uri())
    proxy = proxy_factory(
        "--redis", own_redis.url, "--ready-without-redis", "off", upstream=own_hms.uri
    )
    eventually(lambda: health(proxy, "readiness") == SERVING)
    own_hms.stop()
    eventually(lambda: health(proxy, "readiness") == NOT_SERVING)
    assert health(proxy, "") == SERVING  # liveness never depends on the metastore
    own_hms.start()
    eventually(lambda: health(proxy, "readiness") == SERVING, timeout=30)
    own_redis.stop()
    eventually(lambda: health(proxy, "readiness") == NOT_SERVING)
    assert health(proxy, "") == SERVING
    own_redis.start()
    eventually(lambda: health(proxy, "readiness") == SERVING, timeout=30)


@pytest.mark.hms
def test_degraded_mode_stays_ready_without_redis(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    proxy = proxy_factory("--redis", RedisServer(tmp_path / "never").url)  # nothing listens
    eventually(lambda: health(proxy, "readiness") == SERVING)
    assert proxy.metric("hmsproxy_cache_available") == 0
