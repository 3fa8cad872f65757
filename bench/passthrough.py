"""Pass-through cost of the proxy, measured against the direct HMS in the same run.

    .venv/bin/python -m bench.passthrough [--partitions 10000] [--runs 2000]

Starts a real HMS (Derby, data kept under .rig/bench so the 10,000-partition table is built
once), a proxy in front of it (``--cache off``: every call passed through), the same proxy
with ``--fast-paths off`` (every call the ordinary, awaited way) and the relay floor: a
do-nothing asyncio relay in front of the same HMS (what one more Python hop costs, before a
proxy does anything). The four take turns on long-lived connections, through every order of
them, so all see the same machine noise; latency
is timed on raw bytes, from the request sent to the last reply byte received (no client
decoding). And ``get_table`` on a connection per call, as Trino makes its calls, timed from
the connect: the proxy's calls go out on its pooled metastore connections, the relay's and
the direct ones each on a new metastore connection.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
from pathlib import Path

from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    ConnectionPerCall,
    RelayFloor,
    TimedConnection,
    ensure_wide_table,
    p50,
    percentile,
    start_metastore,
)
from proxy import idl
from tests.rig.proxy_process import ProxyProcess

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"


def measure(
    conns: list[TimedConnection] | list[ConnectionPerCall], request: bytes, runs: int
) -> tuple[list[list[float]], int]:
    """Each connection's timings of ``request``, taking turns through every order of them
    (what ran just before a call matters on this machine: see bench.cache)."""
    length = conns[0].reply_length(request)
    for conn in conns[1:]:
        assert conn.reply_length(request) == length
    times: list[list[float]] = [[] for _ in conns]
    orders = list(itertools.permutations(range(len(conns))))
    for i in range(runs):
        for k in orders[i % len(orders)]:
            times[k].append(conns[k].timed(request, length))
    return times, length


def report(name: str, times: list[list[float]], size: int) -> str:
    d, p, r, o = times

    def adds(t: list[float]) -> str:
        return f"{(p50(t) - p50(d)) * 1000:+.2f} ({(p50(t) / p50(d) - 1) * 100:+.1f}%)"

    return (
        f"| {name} | {size:,} | {p50(d) * 1000:.2f} | {p50(p) * 1000:.2f} | {adds(p)} | "
        f"{adds(o)} | {adds(r)} | {percentile(d, 0.99) * 1000:.2f} | "
        f"{percentile(p, 0.99) * 1000:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2000, help="get_table calls per side")
    parser.add_argument("--big-runs", type=int, default=20, help="get_partitions calls per side")
    parser.add_argument(
        "--event-loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="the proxy's"
    )
    args = parser.parse_args()

    hms = start_metastore(DATA)
    proxy = ordinary = relay = None
    try:
        print(f"metastore {hms.uri}; preparing {args.partitions:,} partitions ...", flush=True)
        ensure_wide_table(hms, args.partitions)
        loop = ["--event-loop", args.event_loop]
        options = ("--log-level", "warning", "--cache", "off", *loop)
        proxy = ProxyProcess(DATA, hms.uri, *options)
        proxy.start()
        # The same proxy with every forwarded call taken the ordinary, awaited way.
        ordinary = ProxyProcess(DATA, hms.uri, *options, "--fast-paths", "off")
        ordinary.start()
        has_uvloop = importlib.util.find_spec("uvloop") is not None
        relay = RelayFloor(
            hms.host,
            hms.port,
            "uvloop" if args.event_loop != "asyncio" and has_uvloop else "asyncio",
        )
        ports = (hms.port, proxy.port, relay.port, ordinary.port)
        conns = [TimedConnection(port) for port in ports]
        rows = []
        get_table = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
        rows.append(report("get_table", *measure(conns, get_table, args.runs)))
        each = [ConnectionPerCall(port) for port in ports]
        rows.append(
            report(
                "get_table, a connection per call",
                *measure(each, get_table, max(50, args.runs // 10)),
            )
        )
        names = [f"ds=p{i:06d}" for i in range(100)]
        by_names = idl.encode_call(
            "get_partitions_by_names", 2, db_name=BENCH_DB, tbl_name=WIDE_TABLE, names=names
        )
        rows.append(
            report(
                "get_partitions_by_names (100)",
                *measure(conns, by_names, max(20, args.runs // 10)),
            )
        )
        everything = idl.encode_call(
            "get_partitions", 3, db_name=BENCH_DB, tbl_name=WIDE_TABLE, max_parts=-1
        )
        rows.append(
            report(
                f"get_partitions ({args.partitions:,})", *measure(conns, everything, args.big_runs)
            )
        )
        print()
        print(
            "| call | reply bytes | direct p50 ms | proxied p50 ms | the proxy adds (p50 ms)"
            " | with --fast-paths off | a do-nothing relay adds | direct p99 ms"
            " | proxied p99 ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))
        for conn in conns:
            conn.close()
    finally:
        if relay is not None:
            relay.stop()
        for process in (proxy, ordinary):
            if process is not None:
                process.stop()
        hms.stop()


if __name__ == "__main__":
    main()
