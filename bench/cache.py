"""Cache hits against the direct HMS, in one run, on the real HMS and a real Redis.

    .venv/bin/python -m bench.cache [--store redis|embedded] [--seconds 10]

Prints, as ratios: get_table, get_partitions_by_names of 100 and get_partitions of 10,000
(10.7 MB) served from the cache vs made directly; the hit p50 vs a raw Redis GET of the
same stored value (the floor: one Redis round trip from a Python client); hits per second
with 64 concurrent connections; Redis bytes per cached partition vs its Thrift bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import redis

from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    TimedConnection,
    asyncio_echo_floor,
    ensure_wide_table,
    loopback_transfer_floor,
    p50,
    percentile,
    start_metastore,
)
from proxy import idl
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"


def side_by_side(
    direct: TimedConnection, cached: TimedConnection, request: bytes, runs: int
) -> tuple[list[float], list[float], int]:
    length = direct.reply_length(request)
    assert cached.reply_length(request) == length  # fills the cache
    cached.reply_length(request)
    d, c = [], []
    for i in range(runs):
        first, second = (direct, cached) if i % 2 else (cached, direct)
        t1 = first.timed(request, length)
        t2 = second.timed(request, length)
        (d if first is direct else c).append(t1)
        (c if first is direct else d).append(t2)
    return d, c, length


async def load(
    port: int, request: bytes, length: int, connections: int, seconds: float
) -> tuple[int, list[float]]:
    """``connections`` clients each sending ``request`` back to back; calls completed."""
    done = 0
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < stop:
            started = time.perf_counter()
            writer.write(request)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            done += 1
        writer.close()

    await asyncio.gather(*(client() for _ in range(connections)))
    return done, latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["redis", "embedded"], default="redis")
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="duration of the 64-connection load"
    )
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--event-loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="the proxy's"
    )
    args = parser.parse_args()

    hms = start_metastore(DATA)
    redis_server = RedisServer(DATA / "redis") if args.store == "redis" else None
    proxy = None
    try:
        ensure_wide_table(hms, args.partitions)
        extra = ["--log-level", "warning", "--memory-cache-bytes", "1GiB"]
        extra += ["--event-loop", args.event_loop]
        if redis_server is not None:
            redis_server.start()
            extra += ["--redis", redis_server.url]
        proxy = ProxyProcess(DATA, hms.uri, *extra).start()
        direct, cached = TimedConnection(hms.port), TimedConnection(proxy.port)
        names = [f"ds=p{i:06d}" for i in range(100)]
        cases = [
            (
                "get_table",
                idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE),
                args.runs,
            ),
            (
                "get_partitions_by_names (100)",
                idl.encode_call(
                    "get_partitions_by_names", 2, db_name=BENCH_DB, tbl_name=WIDE_TABLE, names=names
                ),
                max(50, args.runs // 10),
            ),
            (
                f"get_partitions ({args.partitions:,})",
                idl.encode_call(
                    "get_partitions", 3, db_name=BENCH_DB, tbl_name=WIDE_TABLE, max_parts=-1
                ),
                30,
            ),
        ]
        rows = []
        results = {}
        for name, request, runs in cases:
            d, c, size = side_by_side(direct, cached, request, runs)
            results[name] = (d, c, size)
            rows.append(
                f"| {name} | {size:,} | {p50(d) * 1000:.3f} | {p50(c) * 1000:.3f} | "
                f"{p50(d) / p50(c):.1f}x | {percentile(d, 0.99) * 1000:.2f} | "
                f"{percentile(c, 0.99) * 1000:.2f} |"
            )
        print(f"\nstore: {args.store}\n")
        print(
            "| call | reply bytes | direct p50 ms | hit p50 ms | hit speed-up"
            " | direct p99 ms | hit p99 ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))

        if redis_server is not None:
            r = redis.Redis(port=redis_server.port)
            key = next(r.scan_iter(match="*:e:get_table:*"))
            floor = []
            for _ in range(args.runs):
                started = time.perf_counter()
                r.get(key)
                floor.append(time.perf_counter() - started)
            hit = p50(results["get_table"][1])
            print(
                f"\nget_table hit p50 {hit * 1000:.3f} ms vs raw Redis GET of the same value "
                f"(redis-py, {r.strlen(key)} bytes) p50 {p50(floor) * 1000:.3f} ms: "
                f"{hit / p50(floor):.2f}x the floor"
            )
            part_sizes = [r.strlen(k) for k in r.scan_iter(match="*:p:*")]
            memory = [r.memory_usage(k) or 0 for k in r.scan_iter(match="*:p:*")]
            thrift_bytes = (results["get_partitions_by_names (100)"][2] - 40) / 100
            stored = statistics.mean(part_sizes)
            print(
                f"Redis bytes per cached partition: {stored:.0f} stored "
                f"({stored / thrift_bytes:.1%} of its {thrift_bytes:.0f} Thrift bytes), "
                f"{statistics.mean(memory):.0f} with Redis's own overhead"
            )
            r.close()

        echo = asyncio_echo_floor()
        big = results[cases[2][0]][2]
        print(
            f"\nfloors on this machine: a do-nothing Python asyncio echo round trip p50 "
            f"{echo * 1000:.3f} ms; receiving {big:,} bytes over loopback p50 "
            f"{loopback_transfer_floor(big) * 1000:.2f} ms"
        )
        request, (d, c, length) = cases[0][1], results["get_table"]
        calls, latencies = asyncio.run(
            load(proxy.port, request, length, args.connections, args.seconds)
        )
        print(
            f"\n{args.connections} connections, get_table hits for {args.seconds:g} s: "
            f"{calls / args.seconds:,.0f} hits/s, p50 {p50(latencies) * 1000:.2f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1000:.2f} ms"
        )
        direct.close()
        cached.close()
    finally:
        if proxy is not None:
            proxy.stop()
        if redis_server is not None:
            redis_server.stop()
        hms.stop()


if __name__ == "__main__":
    main()
