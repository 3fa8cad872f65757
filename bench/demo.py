"""The proxy's main job, end to end, on this machine.

    ./scripts/demo.sh            (or: .venv/bin/python -m bench.demo [--rounds N])
    ./scripts/demo.sh --keep-running     and leave it all running, with commands to try

1. starts a real Hive Metastore 2.3.10 from the pyspark jars (Derby, in a temporary folder);
2. starts a Redis server if ``redis-server`` is installed (else the proxy's embedded cache);
3. starts the proxy in front of the metastore;
4. creates a database and a partitioned table of 200 partitions through the proxy, then runs
   the read sequences engines run for every query: Trino's (get_table_req,
   get_partition_names_ps, get_partitions_by_names in batches, get_partitions_statistics_req)
   and Spark's (get_table, get_partitions_by_filter), plus a few writes;
5. runs the same reads straight at the metastore, interleaved, and prints per-method calls,
   outcomes and latency direct vs through the proxy, from the proxy's own /metrics;
6. writes small files into 20 partitions, seals half of them, lists the table's files twice
   over gRPC (sealed listings come from the cache the second time) and asks how many splits
   Trino and Spark would make of it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hmsclient.genthrift.hive_metastore import ttypes as t

from bench.common import TimedConnection
from proxy import idl
from tests.rig.hms import MetastoreServer
from tests.rig.listing import Listings
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import client

DB, TABLE, PARTITIONS = "demo", "page_views", 200


def build_table(port: int, warehouse: str) -> list[str]:
    cols = [
        t.FieldSchema(name, kind, None)
        for name, kind in (("url", "string"), ("user_id", "bigint"), ("ms", "int"))
    ]

    def sd(location: str) -> t.StorageDescriptor:
        return t.StorageDescriptor(
            cols=cols,
            location=location,
            inputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
            outputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
            compressed=False,
            numBuckets=-1,
            serdeInfo=t.SerDeInfo(
                None, "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe", {}
            ),
            bucketCols=[],
            sortCols=[],
            parameters={},
        )

    base = f"{warehouse}/{DB}.db/{TABLE}"
    days = [f"2024-{1 + i // 28:02d}-{1 + i % 28:02d}" for i in range(PARTITIONS)]
    with client("127.0.0.1", port) as c:
        c.create_database(t.Database(DB, "demo", f"{warehouse}/{DB}.db", {}))
        c.create_table(
            t.Table(
                tableName=TABLE,
                dbName=DB,
                owner="demo",
                sd=sd(base),
                partitionKeys=[t.FieldSchema("ds", "string", None)],
                parameters={},
                tableType="EXTERNAL_TABLE",
            )
        )
        c.add_partitions(
            [
                t.Partition(
                    values=[d],
                    dbName=DB,
                    tableName=TABLE,
                    sd=sd(f"{base}/ds={d}"),
                    parameters={"numRows": "100"},
                )
                for d in days
            ]
        )
    return [f"ds={d}" for d in days]


def workload(names: list[str]) -> list[tuple[str, bytes]]:
    """One query's worth of metastore calls, Trino-shaped then Spark-shaped."""
    m = idl.module()
    calls = [
        (
            "get_table_req",
            idl.encode_call("get_table_req", 1, req=m.GetTableRequest(dbName=DB, tblName=TABLE)),
        ),
        (
            "get_partition_names_ps",
            idl.encode_call(
                "get_partition_names_ps",
                2,
                db_name=DB,
                tbl_name=TABLE,
                part_vals=[""],
                max_parts=-1,
            ),
        ),
    ]
    for i in range(0, 40, 20):
        calls.append(
            (
                "get_partitions_by_names",
                idl.encode_call(
                    "get_partitions_by_names",
                    3,
                    db_name=DB,
                    tbl_name=TABLE,
                    names=names[i : i + 20],
                ),
            )
        )
    calls.append(
        (
            "get_partitions_statistics_req",
            idl.encode_call(
                "get_partitions_statistics_req",
                4,
                request=m.PartitionsStatsRequest(
                    dbName=DB, tblName=TABLE, colNames=["ms"], partNames=names[:40]
                ),
            ),
        )
    )
    calls.append(("get_table", idl.encode_call("get_table", 5, dbname=DB, tbl_name=TABLE)))
    calls.append(
        (
            "get_partitions_by_filter",
            idl.encode_call(
                "get_partitions_by_filter",
                6,
                db_name=DB,
                tbl_name=TABLE,
                filter='ds >= "2024-03-01"',
                max_parts=-1,
            ),
        )
    )
    return calls


def timed_round(
    conn: TimedConnection,
    calls: list[tuple[str, bytes]],
    lengths: dict[bytes, int],
    into: dict[str, list[float]],
) -> None:
    for name, request in calls:
        into.setdefault(name, []).append(conn.timed(request, lengths[request]))


def follower_caught_up(proxy: ProxyProcess, event_id: int, timeout: float = 30.0) -> None:
    """Wait (at most ``timeout``) until the proxy has applied the metastore's notification
    events up to ``event_id``, if it follows the log (the demo's one proxy is the log's
    follower: a standby's count would not move). The demo's own writes come back through
    the log as invalidations, later on a busy machine; a listing filled before one of them
    lands is refused as stale (rightly: it was read under older versions), and the second
    call would then find nothing cached."""
    deadline = time.monotonic() + timeout
    while proxy.metric("hmsproxy_notification_enabled"):
        if proxy.metric("hmsproxy_notification_last_event_id") >= event_id:
            return
        if time.monotonic() > deadline:
            print(f"  (the proxy had not applied the log up to event {event_id} in {timeout:g} s)")
            return
        time.sleep(0.05)


def listing_demo(proxy: ProxyProcess, warehouse: Path, names: list[str]) -> None:
    """Files in 20 partitions (40 files of 300 KB each), half of them sealed by a marker."""
    for name in names[:20]:
        directory = warehouse / f"{DB}.db" / TABLE / name
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(40):
            with open(directory / f"part-{i:05d}.parquet", "wb") as f:
                f.truncate(300 * 1024)
    with client("127.0.0.1", proxy.port) as c:
        for name in names[:10]:
            part = c.get_partition_by_name(DB, TABLE, name)
            part.parameters["sealed"] = "true"
            c.alter_partition(DB, TABLE, part)
        last_event = c.get_current_notificationEventId().eventId
    follower_caught_up(proxy, last_event)
    api = Listings(proxy)
    where = f'ds <= "{names[19][3:]}"'
    rounds = []
    for _ in range(2):
        started = time.perf_counter()
        listings = api.table(DB, TABLE, where)
        rounds.append((time.perf_counter() - started, sum(p.from_cache for p in listings)))
    files = sum(len(p.files) for p in listings)
    print(
        f"\nFile listings of {len(listings)} partitions ({files} files; 10 sealed by the"
        f" parameter sealed=true):\n  first call {rounds[0][0] * 1000:.1f} ms"
        f" ({rounds[0][1]} from cache), second call {rounds[1][0] * 1000:.1f} ms"
        f" ({rounds[1][1]} from cache; the open ones are always listed live)"
    )
    if rounds[1][1] < 10:  # (why, from the proxy's counts: a busy machine's Redis, say)
        counts = {
            "refused as stale": proxy.metric("hmsproxy_listing_stale_fills_total"),
            "cache errors": proxy.metric_sum("hmsproxy_cache_errors_total"),
        }
        print(f"  (not every sealed listing came from the cache the second time: {counts})")
    for engine in ("trino", "spark"):
        plan = api.splits(DB, TABLE, partition_filter=where, engine=engine)
        print(
            f"  {engine}: {plan.splits:,} splits for {plan.files:,} files of 300 KB"
            f" ({plan.small_files:,} under 32 MiB); compacted into {plan.compacted_files} files:"
            f" {plan.compacted_splits} splits"
        )


def try_it(
    work: Path, hms: MetastoreServer, redis: RedisServer | None, proxy: ProxyProcess
) -> None:
    """Leave everything running and say how to use it (the README's commands, live ports)."""
    admin = f"--admin 127.0.0.1:{proxy.admin_port}"
    cli = ".venv/bin/hms-cache-proxy"
    pids = [p.pid for p in (hms.process, redis.process if redis else None, proxy.process) if p]
    stop = work / "stop.sh"
    stop.write_text("#!/bin/sh\n" + "".join(f"kill {pid} 2>/dev/null\n" for pid in pids))
    stop.chmod(0o755)
    print(
        f"""
The metastore, {"Redis, " if redis else ""}and the proxy keep running. Point a client at
thrift://127.0.0.1:{proxy.port}, open http://127.0.0.1:{proxy.metrics_port}/ (the status
page), or try:

  {cli} stats {admin}
  {cli} warm {DB}.{TABLE} --where 'ds >= "2024-03-01"' {admin}
  {cli} invalidate {DB}.{TABLE} --partition ds=2024-01-01 {admin}
  {cli} splits {DB}.{TABLE} --where "ds <= '2024-01-20'" --engine trino {admin}
  {cli} ls {DB}.{TABLE} --partition ds=2024-01-01 {admin}

Stop them with {stop} (logs and data are in {work})."""
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=50, help="query rounds on each side")
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the metastore, Redis and the proxy running, and print commands to try",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hms-cache-proxy-demo-"))
    hms = MetastoreServer(work / "hms")
    redis = RedisServer(work / "redis") if shutil.which("redis-server") else None
    proxy: ProxyProcess | None = None
    doing = "starting"

    def step(text: str) -> None:
        nonlocal doing
        doing = text
        print(f"* {text}", flush=True)

    ok = False
    try:
        step("starting a Hive Metastore 2.3.10 (pyspark jars, Derby)")
        hms.start()
        extra: list[str] = []
        if redis is not None:
            step("starting redis-server")
            redis.start()
            extra = ["--redis", redis.url]
        else:
            print("  (redis-server not installed: the proxy uses its embedded cache)")
        extra += ["--seal-marker", "sealed=true"]
        step("starting the proxy")
        proxy = ProxyProcess(work, hms.uri, "--log-level", "warning", *extra).start()
        print(
            f"  proxy listening on 127.0.0.1:{proxy.port} -> {hms.uri}"
            f" (metrics on :{proxy.metrics_port}, admin on :{proxy.admin_port})"
        )
        step(f"creating {DB}.{TABLE} with {PARTITIONS} partitions through the proxy")
        names = build_table(proxy.port, hms.warehouse.as_uri())
        run_workload(proxy, hms, names, args.rounds, step)
        step("listing files and planning splits over gRPC")
        listing_demo(proxy, hms.warehouse, names)
        ok = True
    except (Exception, KeyboardInterrupt) as exc:
        what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logs = sorted(str(p.relative_to(work)) for p in work.rglob("*.log"))
        where = f" ({', '.join(logs)})" if logs else " (no log was written yet)"
        print(f"demo failed while {doing}: {what} -- logs kept in {work}{where}", file=sys.stderr)
    finally:
        if ok and args.keep_running and proxy is not None:
            try_it(work, hms, redis, proxy)
        else:
            if proxy is not None:
                proxy.stop()
            if redis is not None:
                redis.stop()
            hms.stop()
            if ok:
                shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def run_workload(
    proxy: ProxyProcess,
    hms: MetastoreServer,
    names: list[str],
    rounds: int,
    step: Callable[[str], None],
) -> None:
    calls = workload(names)
    direct, proxied = TimedConnection(hms.port), TimedConnection(proxy.port)
    lengths = {}
    for _, request in calls:
        lengths[request] = direct.reply_length(request)
        if proxied.reply_length(request) != lengths[request]:
            raise RuntimeError("a reply through the proxy differs from the metastore's")
    step(
        f"running {rounds} query rounds ({len(calls)} calls each)"
        " through the proxy and directly, interleaved"
    )
    d_times: dict[str, list[float]] = {}
    p_times: dict[str, list[float]] = {}
    started = time.monotonic()
    for _ in range(rounds):
        timed_round(proxied, calls, lengths, p_times)
        timed_round(direct, calls, lengths, d_times)
    with client("127.0.0.1", proxy.port) as c:  # a write through the proxy
        part = c.get_partition_by_name(DB, TABLE, names[0])
        part.parameters["numRows"] = "101"
        c.alter_partition(DB, TABLE, part)
    elapsed = time.monotonic() - started
    direct.close()
    proxied.close()
    summary(proxy, rounds, elapsed, d_times, p_times)


def summary(
    proxy: ProxyProcess,
    rounds: int,
    elapsed: float,
    d_times: dict[str, list[float]],
    p_times: dict[str, list[float]],
) -> None:
    metrics = proxy.metrics()
    print()
    print(f"Summary ({rounds} rounds in {elapsed:.1f} s)")
    print(
        f"{'method':32} {'calls':>6} {'ok':>6} {'errors':>6}"
        f" {'direct p50':>11} {'proxy p50':>10} {'hits':>6}"
    )

    def sample(metric: str, **labels: str) -> float:
        return metrics.get((metric, tuple(sorted(labels.items()))), 0.0)

    for name in sorted(set(d_times) | {"alter_partition", "add_partitions", "create_table"}):
        ok = sample("hmsproxy_requests_total", method=name, outcome="ok")
        errors = sum(
            sample("hmsproxy_requests_total", method=name, outcome=o)
            for o in ("user_error", "upstream_error", "internal_error")
        )
        hits = sample("hmsproxy_cache_lookups_total", method=name, result="hit")
        dp = f"{statistics.median(d_times[name]) * 1000:.2f} ms" if name in d_times else "-"
        pp = f"{statistics.median(p_times[name]) * 1000:.2f} ms" if name in p_times else "-"
        print(
            f"{name:32} {int(ok + errors):>6} {int(ok):>6} {int(errors):>6}"
            f" {dp:>11} {pp:>10} {int(hits):>6}"
        )
    total_direct = sum(sum(v) for v in d_times.values())
    total_proxy = sum(sum(v) for v in p_times.values())
    print(
        f"\nmetastore time for the whole workload: direct {total_direct:.2f} s,"
        f" through the proxy {total_proxy:.2f} s"
    )
    upstream = sum(v for (n, _), v in metrics.items() if n == "hmsproxy_upstream_requests_total")
    opened = sample("hmsproxy_upstream_connects_total", result="ok")
    print(
        f"calls the proxy sent to the metastore: {int(upstream)};"
        f" connections it opened: {int(opened)}"
    )


if __name__ == "__main__":
    sys.exit(main())
