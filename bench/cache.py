"""Cache hits against the direct HMS, in one run, on the real HMS and a real Redis.

    .venv/bin/python -m bench.cache [--store redis|embedded] [--seconds 10]

Prints, as ratios: get_table, get_partitions_by_names of 100 (the same request repeated,
and requests of other names assembled from partitions other requests cached, with names
mostly read before and with names all new) and
get_partitions of 10,000 (10.7 MB) served from the cache vs made directly, and vs the floor:
a do-nothing asyncio server on the proxy's event loop that answers the same request with the
same reply bytes (the cost of one Python round trip here); hits per second with 64
concurrent connections against the floor server's with the same load generator; Redis
bytes per cached partition vs its Thrift bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import redis

from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    ConnectionPerCall,
    ReplayFloor,
    TimedConnection,
    asyncio_echo_floor,
    ensure_wide_table,
    loopback_transfer_floor,
    p50,
    percentile,
    reply_bytes,
    start_metastore,
)
from proxy import idl
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"


def side_by_side(
    conns: list[TimedConnection], requests: list[bytes], runs: int, fill: bool = True
) -> tuple[list[list[float]], int]:
    """Each connection's timings, taking turns call by call (so that the machine's moments
    fall on all alike); request ``i % len(requests)`` on run ``i``. ``fill``: ask each
    request once before timing (the cache then holds its whole reply).

    The turns go through every order of the connections, so each follows each other as
    often: what ran just before a call matters here (a metastore call leaves the CPU's
    caches full of the JVM's memory, and whatever comes next pays for it), and rotating one
    order (direct, proxy, floor) put the proxy after the metastore twice as often as the
    floor."""
    length = conns[0].reply_length(requests[0])
    for conn in conns[1:] if fill else ():
        for request in requests:
            assert conn.reply_length(request) == length
    times: list[list[float]] = [[] for _ in conns]
    orders = list(itertools.permutations(range(len(conns))))
    for i in range(runs):
        request = requests[i % len(requests)]
        for k in orders[i % len(orders)]:
            times[k].append(conns[k].timed(request, length))
    return times, length


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
    if args.partitions < 3000:
        parser.error("--partitions: at least 3000 (the assembled cases name partitions to 2,999)")

    hms = start_metastore(DATA)
    redis_server = RedisServer(DATA / "redis") if args.store == "redis" else None
    proxy = None
    stops: list[Callable[[], None]] = []
    try:
        ensure_wide_table(hms, args.partitions)
        extra = ["--log-level", "warning", "--memory-cache-bytes", "1GiB"]
        # Hits are measured: nothing may expire during the run, however slow the machine.
        extra += ["--ttl-table", "3600", "--ttl-partitions", "3600"]
        extra += ["--event-loop", args.event_loop]
        if redis_server is not None:
            redis_server.start()
            extra += ["--redis", redis_server.url]
        proxy = ProxyProcess(DATA, hms.uri, *extra).start()
        direct, cached = TimedConnection(hms.port), TimedConnection(proxy.port)

        def by_names(seqid: int, first: int) -> bytes:
            names = [f"ds=p{i:06d}" for i in range(first, first + 100)]
            return idl.encode_call(
                "get_partitions_by_names", seqid, db_name=BENCH_DB, tbl_name=WIDE_TABLE, names=names
            )

        # Before the assembled case: partitions 0-999 cached by ten requests of 100; then
        # requests of 100 names starting elsewhere, each asked once: assembled from
        # partitions the others cached (names but the few at each request's end seen in
        # the requests before). Before the case of new names: 1000-2999 cached likewise;
        # then requests straddling two of those, each of names the proxy has not read
        # before (the cached requests' names were read by the planner, not by assembly).
        assembled = [by_names(4, first) for first in range(1, 900, 2)]
        new_names = [by_names(5, first) for first in range(1050, 2950, 100)]
        prepared = {
            "get_partitions_by_names (100), assembled": range(0, 1000, 100),
            "get_partitions_by_names (100), assembled, names new": range(1000, 3000, 100),
        }
        partition_bytes: list[int] = []
        cases = [
            (
                "get_table",
                [idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)],
                args.runs,
            ),
            ("get_partitions_by_names (100), repeated", [by_names(2, 0)], max(50, args.runs // 5)),
            ("get_partitions_by_names (100), assembled", assembled, len(assembled)),
            ("get_partitions_by_names (100), assembled, names new", new_names, len(new_names)),
            (
                f"get_partitions ({args.partitions:,})",
                [
                    idl.encode_call(
                        "get_partitions", 3, db_name=BENCH_DB, tbl_name=WIDE_TABLE, max_parts=-1
                    )
                ],
                30,
            ),
        ]
        # The floor answers each request with the HMS's own reply bytes (an assembled reply is
        # the size of a repeated one; the floor replays the same reply for them).
        pairs = [(r, reply_bytes(direct, r)) for _, requests, _ in cases for r in requests]
        loop = "uvloop" if args.event_loop != "asyncio" and _has_uvloop() else "asyncio"
        floor_server = ReplayFloor(pairs, loop, DATA / "floor")
        stops.append(floor_server.stop)
        floor = TimedConnection(floor_server.port)
        rows = []
        results = {}
        for name, requests, runs in cases:
            fill = name not in prepared
            if not fill:
                # Redis's bytes per partition of the repeated request's 100 (before the
                # assembled cases cache more).
                if redis_server is not None and not partition_bytes:
                    with redis.Redis(port=redis_server.port) as r:
                        partition_bytes = [r.strlen(k) for k in r.scan_iter(match="*:p:*")]
                for first in prepared[name]:
                    cached.reply_length(by_names(9, first))
            (d, c, f), size = side_by_side([direct, cached, floor], requests, runs, fill)
            results[name] = (d, c, size)
            rows.append(row(name, size, d, c, f))
        # Trino's way: each call on a connection of its own (the proxy's is then a hit
        # answered as a connection's first call).
        name = "get_table, a connection per call"
        each = [ConnectionPerCall(port) for port in (hms.port, proxy.port, floor_server.port)]
        (d, c, f), size = side_by_side(each, cases[0][1], max(100, args.runs // 5))
        rows.insert(1, row(name, size, d, c, f))
        print(f"\nstore: {args.store}, floor server on {loop}\n")
        print(
            "| call | reply bytes | direct p50 ms | hit p50 ms | floor p50 ms | hit / floor"
            " | direct / hit | hit p99 ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))

        if redis_server is not None:
            r = redis.Redis(port=redis_server.port)
            key = next(r.scan_iter(match="*:e:get_table:*"))
            gets = []
            for _ in range(args.runs):
                started = time.perf_counter()
                r.get(key)
                gets.append(time.perf_counter() - started)
            hit = p50(results["get_table"][1])
            print(
                f"\nget_table hit p50 {hit * 1000:.3f} ms vs raw Redis GET of the same value "
                f"(redis-py, {r.strlen(key)} bytes) p50 {p50(gets) * 1000:.3f} ms: "
                f"{hit / p50(gets):.2f}x it"
            )
            part_sizes = partition_bytes
            memory = [r.memory_usage(k) or 0 for k in r.scan_iter(match="*:p:*")]
            thrift_bytes = (results["get_partitions_by_names (100), repeated"][2] - 40) / 100
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
        request, length = cases[0][1][0], results["get_table"][2]
        out = {}
        for name, port in (("proxy", proxy.port), ("floor", floor_server.port)):
            calls, latencies = asyncio.run(
                load(port, request, length, args.connections, args.seconds)
            )
            out[name] = calls / args.seconds
            print(
                f"\n{args.connections} connections, get_table from the {name} for "
                f"{args.seconds:g} s: {calls / args.seconds:,.0f} calls/s, p50 "
                f"{p50(latencies) * 1000:.2f} ms, p99 {percentile(latencies, 0.99) * 1000:.2f} ms"
            )
        print(f"hits/s vs the floor server's: **{out['proxy'] / out['floor']:.2f}x**")
        reads = {
            source: proxy.metric("hmsproxy_cache_version_reads_total", source=source)
            for source in ("local", "redis")
        }
        print(f"version look-ups by source: {reads}")
        direct.close()
        cached.close()
        floor.close()
    finally:
        for stop in stops:
            stop()
        if proxy is not None:
            proxy.stop()
        if redis_server is not None:
            redis_server.stop()
        hms.stop()


def row(name: str, size: int, direct: list[float], hit: list[float], floor: list[float]) -> str:
    """One call's row of the table: p50s in ms, the hit against the floor and the direct."""
    return (
        f"| {name} | {size:,} | {p50(direct) * 1000:.3f} | {p50(hit) * 1000:.3f} | "
        f"{p50(floor) * 1000:.3f} | **{p50(hit) / p50(floor):.2f}x** | "
        f"{p50(direct) / p50(hit):.1f}x | {percentile(hit, 0.99) * 1000:.2f} |"
    )


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
