"""Faults under load, each with nothing lost and no stale answer: a Redis Cluster master
killed, the metastore killed and restarted, a proxy killed and restarted in a write burst;
and many identities that never share an entry."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from proxy import idl
from proxy.cache.keys import Naming, TableRef
from proxy.wire.binary import MessageType, parse_header
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisCluster, RedisServer
from tests.rig.sample import Sample, client, create
from tests.rig.waiting import eventually
from tests.rig.workload import Workload, hits

pytestmark = pytest.mark.hms


def owner(cluster: RedisCluster, key: str) -> RedisServer | None:
    try:
        return cluster.master_of(key)
    except LookupError:  # between the master's death and its replica's promotion
        return None


def proxy_on_cluster(
    cluster: RedisCluster, sample: Sample, proxy_factory: ProxyFactory
) -> tuple[str, RedisServer, RedisServer, ProxyProcess]:
    """A proxy on ``cluster``, seeded by another node than the master holding the sample
    table's versions: (that key, that master, the seed, the proxy)."""
    key = Naming().versions(TableRef.of(sample.db, sample.table).tag)
    victim = cluster.master_of(key)
    seed = next(n for n in cluster.nodes if n is not victim)
    proxy = proxy_factory("--redis", f"redis://127.0.0.1:{seed.port}", "--redis-mode", "cluster")
    return key, victim, seed, proxy


def test_a_redis_cluster_master_killed_under_load(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample, tmp_path: Path
) -> None:
    with RedisCluster(tmp_path / "cluster", nodes=6, replicas=1) as cluster:
        key, victim, seed, proxy = proxy_on_cluster(cluster, sample, proxy_factory)
        with Workload(hms, proxy, sample) as load:
            eventually(lambda: hits(proxy) > 5)
            victim.stop()  # SIGKILL: its replica takes over after the node timeout (2 s)
            eventually(lambda: owner(cluster, key) not in (None, victim), timeout=30)
            eventually(lambda: "cluster_state:ok" in cluster.state(seed), timeout=30)
            after_failover = hits(proxy)
            eventually(lambda: hits(proxy) > after_failover + 10, timeout=30)
        assert load.errors == [] and load.failed_replies == []
        assert load.mismatches == []
        assert proxy.metric("hmsproxy_cache_available") == 1


def test_a_graceful_cluster_failover_under_load(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample, tmp_path: Path
) -> None:
    """CLUSTER FAILOVER: the old master stays up as a replica, its slots answer MOVED. The
    proxy's probes (and streams) follow the new master: it serves hits again, not only
    after a reconnect."""
    import redis

    with RedisCluster(tmp_path / "cluster", nodes=6, replicas=1) as cluster:
        key, victim, _, proxy = proxy_on_cluster(cluster, sample, proxy_factory)
        with redis.Redis(port=victim.port) as r:
            victim_id = r.execute_command("CLUSTER", "MYID")
            victim_id = victim_id.decode() if isinstance(victim_id, bytes) else victim_id
            nodes = r.execute_command("CLUSTER", "NODES")
        lines = nodes.decode() if isinstance(nodes, bytes) else nodes
        if isinstance(lines, dict):  # (redis-py may parse it)
            replica_port = next(
                int(addr.split(":")[1].split("@")[0])
                for addr, info in lines.items()
                if info.get("master_id") == victim_id
            )
        else:
            replica_port = next(
                int(line.split()[1].split(":")[1].split("@")[0])
                for line in lines.splitlines()
                if line.split()[3] == victim_id
            )
        with Workload(hms, proxy, sample) as load:
            eventually(lambda: hits(proxy) > 5)
            with redis.Redis(port=replica_port) as r:
                r.execute_command("CLUSTER", "FAILOVER")
            eventually(lambda: owner(cluster, key) not in (None, victim), timeout=30)
            after_failover = hits(proxy)
            eventually(lambda: hits(proxy) > after_failover + 10, timeout=30)
        assert load.errors == [] and load.failed_replies == []
        assert load.mismatches == []
        assert proxy.metric("hmsproxy_redis_writes_taken") == 1


def test_the_metastore_killed_and_restarted_under_load(
    own_hms: MetastoreServer, proxy_factory: ProxyFactory
) -> None:
    sample = create(own_hms.host, own_hms.port, own_hms.warehouse.as_uri())
    # Short TTLs, so that entries expire during the outage and --stale-if-error matters.
    proxy = proxy_factory(
        *("--stale-if-error", "120", "--ttl-table", "1", "--ttl-partitions", "1"),
        upstream=own_hms.uri,
    )
    # A hang is a call without an answer in 15 s (the proxy's own timeouts: 2 s to
    # connect, 6 s to read).
    with Workload(own_hms, proxy, sample, call_timeout=15) as load:
        eventually(lambda: load.rounds > 10)
        own_hms.kill()
        eventually(lambda: proxy.metric("hmsproxy_upstream_available") == 0)
        rounds_down = load.rounds
        eventually(lambda: load.rounds > rounds_down + 5)  # the workload goes on, answered
        own_hms.start()  # same port, same Derby database
        eventually(lambda: proxy.metric("hmsproxy_upstream_available") == 1, timeout=60)
        rounds_up = load.rounds
        eventually(lambda: load.rounds > rounds_up + 10)
    assert load.errors == []  # no hangs, nothing unexpected
    assert load.mismatches == []  # never a wrong or stale answer while the HMS was there
    assert load.failed_replies == []  # and no error once it was back: it reconnected
    served = sum(
        proxy.metric("hmsproxy_stale_replies_total", method=m)
        for m in ("get_table", "get_partition_names")
    )
    assert served > 0  # --stale-if-error answered cached reads while the HMS was down
    assert load.outage_replies > 0  # and prompt Thrift errors for the rest


def _burst_value(reply: bytes) -> int | None:
    if reply == raw.CLOSED or reply[3] != MessageType.REPLY:
        return None
    header = parse_header(reply, 0, len(reply))
    assert header is not None
    part = idl.decode_result("get_partition_by_name", reply[header.length :]).success
    return int(part.parameters.get("burst", "0"))


def test_a_proxy_killed_and_restarted_during_a_write_burst(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    args = ("--redis", own_redis.url, "--write-fence-seconds", "5")
    writer, reader = proxy_factory(*args), proxy_factory(*args)
    read = idl.encode_call(
        "get_partition_by_name",
        1,
        db_name=sample.db,
        tbl_name=sample.table,
        part_name=sample.partition_name,
    )
    acked: list[tuple[float, int]] = []  # (when the writer heard back, value written)
    stale: list[str] = []
    reads = [0]
    stop = threading.Event()

    def write_burst() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                with client("127.0.0.1", writer.port, timeout=15) as c:
                    part = c.get_partition_by_name(sample.db, sample.table, sample.partition_name)
                    part.parameters["burst"] = str(n)
                    c.alter_partition(sample.db, sample.table, part)
                acked.append((time.monotonic(), n))
            except Exception:
                # The proxy is down: this write was never acknowledged. A pause before the next
                # attempt, not a wait for anything.
                time.sleep(0.05)

    def read_loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            floor = max((n for t, n in acked if t < started), default=0)
            for proxy in (reader, writer):
                try:
                    value = _burst_value(raw.call("127.0.0.1", proxy.port, read))
                except (ConnectionError, OSError):
                    continue  # the writer proxy is down
                reads[0] += 1
                if value is not None and value < floor:
                    stale.append(f"read {value} after {floor} was acknowledged")

    threads = [threading.Thread(target=write_burst), threading.Thread(target=read_loop)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: len(acked) > 20)
        writer.signal(signal.SIGKILL)  # mid-burst: some write was forwarded, not invalidated
        writer.wait(10)
        killed_at, read_at = len(acked), reads[0]
        # Reads go on at the reader while the writer is down, its last write perhaps
        # forwarded and not invalidated: the ones that could be stale.
        eventually(lambda: reads[0] > read_at + 20, what="reads while the writer is down")
        writer.start()  # the same ports, a new process
        eventually(lambda: len(acked) > killed_at + 20, timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert stale == []
    assert reads[0] > 100
    final = _burst_value(raw.call(hms.host, hms.port, read))
    for proxy in (reader, writer):
        assert _burst_value(raw.call("127.0.0.1", proxy.port, read)) == final


def test_many_identities_never_share_an_entry(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    args = ("--redis", own_redis.url, "--cache-scope", "user")
    proxies = [proxy_factory(*args), proxy_factory(*args)]
    users = [f"user{i:02d}" for i in range(40)]
    tables = [sample.table, sample.unpartitioned]
    before = len(hms.callers())

    def work(user: str) -> int:
        calls = 0
        for _ in range(3):
            for proxy in proxies:
                with raw.RawConnection("127.0.0.1", proxy.port) as conn:
                    ugi = idl.encode_call("set_ugi", 1, user_name=user, group_names=[f"{user}-g"])
                    conn.call(ugi)
                    for table in tables:
                        request = idl.encode_call("get_table", 2, dbname=sample.db, tbl_name=table)
                        reply = conn.call(request)
                        assert reply[3] == MessageType.REPLY, reply
                        calls += 1
        return calls

    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(work, users))
    fetched = [
        (user, target.rsplit(".", 1)[1])
        for event, target, user in hms.callers()[before:]
        if event == "READ_TABLE" and target.rsplit(".", 1)[1] in tables
    ]
    # Every identity fetched every table from the HMS as itself: no identity was ever
    # answered from an entry another identity filled (its own first read would be missing).
    assert set(fetched) == {(u, t) for u in users for t in tables}
    # And only about once: the rest were hits on its own entries, shared by both proxies.
    assert len(fetched) <= len(users) * len(tables) * 2
    served = sum(
        p.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") for p in proxies
    )
    assert served >= total - len(fetched)
