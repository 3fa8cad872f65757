"""How late a write through one proxy is seen through another on the same Redis, with the
versions kept in process (--redis-tracking on, the default), against the real HMS.

    .venv/bin/python -m bench.tracking [--rounds 200]

Each round alters a table through proxy A and then asks proxy B for it back to back until
B answers the new table. Printed: p50/p99 of the time from A's acknowledgement to B's
first new reply; the same for B's reply of a direct get_table (the miss B must make after
hearing of the write, included in the first figure); and B's own measure of its stream's
delivery (hmsproxy_redis_tracking_delivery_seconds, a beat set and heard back).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import BENCH_DB, TimedConnection, p50, percentile, reply_bytes, start_metastore
from proxy import idl
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import client

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"
TABLE = "tracked"


def histogram_quantile(proxy: ProxyProcess, name: str, q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` of histogram ``name``."""
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (metric, labels), value in proxy.metrics().items()
        if metric == f"{name}_bucket"
    )
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= q * total:
            return bound
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    hms = start_metastore(DATA)
    redis_server = RedisServer(DATA / "redis-tracking")
    proxies: list[ProxyProcess] = []
    try:
        redis_server.start()
        with client(hms.host, hms.port) as c:
            if BENCH_DB not in c.get_all_databases():
                raise SystemExit("run bench.cache once first: it makes the bench database")
            if TABLE not in c.get_all_tables(BENCH_DB):
                table = c.get_table(BENCH_DB, "wide")
                table.tableName, table.partitionKeys = TABLE, []
                table.sd.location = table.sd.location + "_tracked"
                c.create_table(table)
        extra = ["--log-level", "warning", "--redis", redis_server.url]
        a = ProxyProcess(DATA / "a", hms.uri, *extra).start()
        b = ProxyProcess(DATA / "b", hms.uri, *extra).start()
        proxies += [a, b]
        read = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=TABLE)
        reader, direct = TimedConnection(b.port), TimedConnection(hms.port)
        seen, misses = [], []
        with client("127.0.0.1", a.port) as writer:
            table = writer.get_table(BENCH_DB, TABLE)
            for round_ in range(args.rounds):
                before = reply_bytes(reader, read)
                reply_bytes(reader, read)  # a hit, versions in process
                table.parameters["round"] = str(round_)
                writer.alter_table(BENCH_DB, TABLE, table)
                acknowledged = time.perf_counter()
                while reply_bytes(reader, read) == before:
                    pass
                seen.append(time.perf_counter() - acknowledged)
                started = time.perf_counter()
                reply_bytes(direct, read)
                misses.append(time.perf_counter() - started)
        local = b.metric("hmsproxy_cache_version_reads_total", source="local")
        remote = b.metric("hmsproxy_cache_version_reads_total", source="redis")
        name = "hmsproxy_redis_tracking_delivery_seconds"
        print(
            f"\n{args.rounds} writes through proxy A, read back through proxy B:\n"
            f"- A's acknowledgement to B's first new reply: p50 {p50(seen) * 1000:.3f} ms, "
            f"p99 {percentile(seen, 0.99) * 1000:.3f} ms, max {max(seen) * 1000:.3f} ms\n"
            f"- of which B's miss (a direct get_table): p50 {p50(misses) * 1000:.3f} ms, "
            f"p99 {percentile(misses, 0.99) * 1000:.3f} ms\n"
            f"- B's stream delivery (beats, histogram buckets): p50 <= "
            f"{histogram_quantile(b, name, 0.5) * 1000:g} ms, p99 <= "
            f"{histogram_quantile(b, name, 0.99) * 1000:g} ms\n"
            f"- B's version look-ups: {local:.0f} in process, {remote:.0f} from Redis"
        )
        reader.close()
        direct.close()
    finally:
        for proxy in proxies:
            proxy.stop()
        redis_server.stop()
        hms.stop()


if __name__ == "__main__":
    main()
