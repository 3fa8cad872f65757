"""Pass-through cost of the proxy, measured against the direct HMS in the same run.

    .venv/bin/python -m bench.passthrough [--partitions 10000] [--runs 2000]

Starts a real HMS (Derby, data kept under .rig/bench so the 10,000-partition table is built
once), and a proxy in front of it. Direct and proxied calls alternate on two long-lived
connections so both see the same machine noise; latency is timed on raw bytes, from the
request sent to the last reply byte received (no client decoding).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
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
    direct: TimedConnection, proxied: TimedConnection, request: bytes, runs: int
) -> tuple[list[float], list[float], int]:
    length = direct.reply_length(request)
    assert proxied.reply_length(request) == length
    d, p = [], []
    for i in range(runs):
        # Alternate which goes first, so neither always runs on a warmer machine.
        if i % 2:
            d.append(direct.timed(request, length))
            p.append(proxied.timed(request, length))
        else:
            p.append(proxied.timed(request, length))
            d.append(direct.timed(request, length))
    return d, p, length


def report(name: str, d: list[float], p: list[float], size: int) -> str:
    added = (p50(p) - p50(d)) * 1000
    return (
        f"| {name} | {size:,} | {p50(d) * 1000:.2f} | {p50(p) * 1000:.2f} | {added:+.2f} | "
        f"{(p50(p) / p50(d) - 1) * 100:+.1f}% | {percentile(d, 0.99) * 1000:.2f} | "
        f"{percentile(p, 0.99) * 1000:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2000, help="get_table calls per side")
    parser.add_argument("--big-runs", type=int, default=20, help="get_partitions calls per side")
    args = parser.parse_args()

    hms = start_metastore(DATA)
    proxy = None
    try:
        print(f"metastore {hms.uri}; preparing {args.partitions:,} partitions ...", flush=True)
        ensure_wide_table(hms, args.partitions)
        proxy = ProxyProcess(DATA, hms.uri, "--log-level", "warning", "--cache", "off").start()
        direct, proxied = TimedConnection(hms.port), TimedConnection(proxy.port)
        rows = []
        get_table = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
        rows.append(report("get_table", *measure(direct, proxied, get_table, args.runs)))
        names = [f"ds=p{i:06d}" for i in range(100)]
        by_names = idl.encode_call(
            "get_partitions_by_names", 2, db_name=BENCH_DB, tbl_name=WIDE_TABLE, names=names
        )
        rows.append(
            report(
                "get_partitions_by_names (100)",
                *measure(direct, proxied, by_names, max(20, args.runs // 10)),
            )
        )
        everything = idl.encode_call(
            "get_partitions", 3, db_name=BENCH_DB, tbl_name=WIDE_TABLE, max_parts=-1
        )
        rows.append(
            report(
                f"get_partitions ({args.partitions:,})",
                *measure(direct, proxied, everything, args.big_runs),
            )
        )
        print()
        print(
            "| call | reply bytes | direct p50 ms | proxied p50 ms | added p50 ms | added"
            " | direct p99 ms | proxied p99 ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))
        direct.close()
        proxied.close()
    finally:
        if proxy is not None:
            proxy.stop()
        hms.stop()


if __name__ == "__main__":
    main()
