"""Iceberg-shaped commits through the proxy against the same commits made directly, in one run.

    .venv/bin/python -m bench.commits [--commits 300] [--appends 30]

A real HMS that grants locks, real Redis servers, the proxy with the lock fences and the
metastore's base check on (the defaults), and one with both off, to tell what they cost. Two
measurements, each side taking its turn first:

* the HMS calls of one commit, on raw bytes, as Java Iceberg and pyiceberg make them:
  ``lock`` -> ``get_table`` -> ``alter_table_with_environment_context`` (an Iceberg table
  moving ``metadata_location``) -> ``unlock``, each call timed; and the Redis commands the
  proxy sent per commit, from Redis's own ``INFO commandstats``;
* a pyiceberg ``append`` of one row (file writes included), end to end.

Prints p50/p99 per call and per commit: direct, through the proxy without the fence and the
check, with the defaults, the ratio of the defaults to direct and what the fence and the
check add to each call.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import redis
from pyiceberg.catalog.hive import HiveCatalog

from bench.common import TimedConnection, p50, percentile
from proxy import idl
from proxy.wire.framing import MessageReader, Transport
from tests.rig.hms import MetastoreServer
from tests.rig.locking import Endpoint, create_table
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench-commits"
CALLS = ("lock", "get_table", "alter_table_with_environment_context", "unlock")


def iceberg_table(current: Any, step: int) -> Any:
    """The table as an Iceberg commit leaves it: its metadata pointer moved one step."""
    params = dict(current.parameters or {})
    params["table_type"] = "ICEBERG"
    if "metadata_location" in params:
        params["previous_metadata_location"] = params["metadata_location"]
    params["metadata_location"] = f"m/{step}.json"
    current.parameters = params
    return current


class Committer:
    """One long-lived connection making commits on one table, timing each call."""

    def __init__(self, port: int, db: str, table: str) -> None:
        self.conn = TimedConnection(port)
        self.db, self.table = db, table
        self.step = 0
        self.times: dict[str, list[float]] = {c: [] for c in (*CALLS, "commit")}

    def _call(self, name: str, request: bytes) -> object:
        """Send one call, time it to its last reply byte, return its decoded result."""
        started = time.perf_counter()
        self.conn.sock.sendall(request)
        reader = MessageReader(Transport.BUFFERED, 1 << 30)
        while (message := reader.next_message()) is None:
            chunk = self.conn.sock.recv(1 << 20)
            if not chunk:
                raise EOFError(f"{name}: connection closed")
            reader.feed(chunk)
        self.times[name].append(time.perf_counter() - started)
        return idl.decode_result(name, message.body)

    def commit(self) -> None:
        m = idl.module()
        self.step += 1
        started = time.perf_counter()
        component = m.LockComponent(
            type=3, level=2, dbname=self.db, tablename=self.table, operationType=3
        )
        lock: Any = self._call(
            "lock",
            idl.encode_call("lock", 1, rqst=m.LockRequest([component], None, "bench", "h")),
        )
        read: Any = self._call(
            "get_table", idl.encode_call("get_table", 2, dbname=self.db, tbl_name=self.table)
        )
        result: Any = self._call(
            "alter_table_with_environment_context",
            idl.encode_call(
                "alter_table_with_environment_context",
                3,
                dbname=self.db,
                tbl_name=self.table,
                new_tbl=iceberg_table(read.success, self.step),
                environment_context=m.EnvironmentContext(
                    properties={"DO_NOT_UPDATE_STATS": "true"}
                ),
            ),
        )
        assert result.o1 is None and result.o2 is None, result
        unlock = m.UnlockRequest(lockid=lock.success.lockid)
        self._call("unlock", idl.encode_call("unlock", 4, rqst=unlock))
        self.times["commit"].append(time.perf_counter() - started)


def commands(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def report(
    direct: dict[str, list[float]],
    bare: dict[str, list[float]],
    proxied: dict[str, list[float]],
) -> None:
    """p50 per call: direct, a proxy with no fence and no base check, the defaults."""
    heads = ("direct", "no fence", "defaults", "ratio", "fence+check", "p99 direct", "p99 prx")
    print(f"{'call (p50 ms)':38} " + " ".join(f"{h:>11}" for h in heads))
    for name in (*CALLS, "commit"):
        d, b, p = direct[name], bare[name], proxied[name]
        print(
            f"{name:38} {p50(d) * 1e3:11.3f} {p50(b) * 1e3:11.3f} {p50(p) * 1e3:11.3f}"
            f" {p50(p) / p50(d):10.2f}x {(p50(p) - p50(b)) * 1e3:+11.3f}"
            f" {percentile(d, 0.99) * 1e3:11.3f} {percentile(p, 0.99) * 1e3:11.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--appends", type=int, default=30)
    args = parser.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=DATA))
    hms = MetastoreServer(work / "hms", locks=True)
    hms.start()
    store = RedisServer(work / "redis")
    store.start()
    proxy = ProxyProcess(work, hms.uri, "--redis", store.url).start()
    other = RedisServer(work / "redis-bare")
    other.start()
    bare = ProxyProcess(
        work,
        hms.uri,
        "--redis",
        other.url,
        "--lock-fence-seconds",
        "0",
        "--iceberg-expected-location",
        "off",
    ).start()
    try:
        at = Endpoint(hms.host, hms.port)
        create_table(at, hms.warehouse.as_uri(), "bench_commits", "direct", "bare", "proxied")
        direct = Committer(hms.port, "bench_commits", "direct")
        unfenced = Committer(bare.port, "bench_commits", "bare")
        proxied = Committer(proxy.port, "bench_commits", "proxied")
        sides = (direct, unfenced, proxied)
        for _ in range(20):  # warm every path
            for side in sides:
                side.commit()
        for side in sides:
            side.times = {k: [] for k in side.times}
        r = redis.Redis.from_url(store.url)
        before = commands(r)
        for i in range(args.commits):
            for side in sides[i % 3 :] + sides[: i % 3]:  # each first in turn
                side.commit()
        after = commands(r)
        print(f"\nraw commits, {args.commits} each way (lock, get_table, alter, unlock):")
        report(direct.times, unfenced.times, proxied.times)
        used = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
        per = ", ".join(f"{k} {v / args.commits:.1f}" for k, v in sorted(used.items()))
        print(f"Redis commands per proxied commit (defaults): {per}")
        r.close()

        warehouse = (work / "warehouse").as_uri()
        cats = {
            "direct": HiveCatalog("d", uri=hms.uri, warehouse=warehouse),
            "proxy": HiveCatalog("p", uri=f"thrift://127.0.0.1:{proxy.port}", warehouse=warehouse),
        }
        schema = pa.schema([pa.field("n", pa.int64())])
        cats["direct"].create_namespace("bench_ice")
        times: dict[str, list[float]] = {}
        for name, cat in cats.items():
            cat.create_table(f"bench_ice.{name}", schema=schema)
            times[name] = []
        for i in range(args.appends):
            for name in ("direct", "proxy") if i % 2 else ("proxy", "direct"):
                table = cats[name].load_table(f"bench_ice.{name}")
                started = time.perf_counter()
                table.append(pa.table({"n": [i]}, schema=schema))
                times[name].append(time.perf_counter() - started)
        d, p = times["direct"], times["proxy"]
        print(f"\npyiceberg append of one row, {args.appends} each way:")
        print(
            f"direct p50 {p50(d) * 1e3:.1f} ms, proxy p50 {p50(p) * 1e3:.1f} ms "
            f"({p50(p) / p50(d):.2f}x); p99 {percentile(d, 0.99) * 1e3:.1f} / "
            f"{percentile(p, 0.99) * 1e3:.1f} ms"
        )
    finally:
        proxy.stop()
        bare.stop()
        store.stop()
        other.stop()
        hms.stop()


if __name__ == "__main__":
    main()
