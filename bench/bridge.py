"""What the bridge for old clients costs in front of HMS 4.0.1 (simulated), in one run.

    .venv/bin/python -m bench.bridge [--runs 1000]

A real HMS 2.3.10 with the HMS 4.0.1 simulation in front of it (tests/rig/hms4.py, in a
process of its own: refuses get_table and get_table_objects_by_name, relays everything
else), and two proxies in front of the simulation: one with the cache off (every call goes
to the metastore) and one with it on. The simulation's relay is one more hop for
everything, so the bridge's own cost is read against the call the bridge makes, sent
unbridged on the same path: each row alternates the old call with its ``_req`` form.

* ``get_table`` vs ``get_table_req``, cache off: what bridging a miss costs;
* the same through the caching proxy: a hit of a bridged entry vs a hit of a _req entry;
* ``get_table_objects_by_name`` (10 tables) vs its ``_req``, cache off.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
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
from tests.rig.sample import client, storage_descriptor, table

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"
M = idl.module()


def alternate(
    a: TimedConnection, ra: bytes, b: TimedConnection, rb: bytes, runs: int
) -> tuple[list[float], list[float], int, int]:
    la, lb = a.reply_length(ra), b.reply_length(rb)
    xs, ys = [], []
    for i in range(runs):
        if i % 2:
            xs.append(a.timed(ra, la))
            ys.append(b.timed(rb, lb))
        else:
            ys.append(b.timed(rb, lb))
            xs.append(a.timed(ra, la))
    return xs, ys, la, lb


def row(name: str, base: list[float], got: list[float], size: int) -> str:
    return (
        f"| {name} | {size:,} | {p50(base) * 1000:.3f} | {p50(got) * 1000:.3f} | "
        f"{(p50(got) - p50(base)) * 1000:+.3f} | {p50(got) / p50(base):.2f}x | "
        f"{percentile(got, 0.99) * 1000:.2f} |"
    )


def ensure_tables(hms_host: str, hms_port: int, count: int) -> list[str]:
    names = [f"bridge_{i}" for i in range(count)]
    with client(hms_host, hms_port) as c:
        have = set(c.get_all_tables(BENCH_DB))
        for name in names:
            if name not in have:
                c.create_table(table(BENCH_DB, name, storage_descriptor(f"/tmp/bench/{name}")))
    return names


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000, help="calls per side and row")
    args = parser.parse_args()
    hms = start_metastore(DATA)
    proxies: list[ProxyProcess] = []
    try:
        ensure_wide_table(hms, 10)  # the bench database and a table in it
        names = ensure_tables(hms.host, hms.port, 10)
        relay = subprocess.Popen(
            [sys.executable, "-m", "tests.rig.hms4", hms.host, str(hms.port)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=DATA.parents[1],
        )
        try:
            assert relay.stdout is not None
            uri = f"thrift://127.0.0.1:{relay.stdout.readline().split()[1]}"
            quiet = ("--log-level", "warning")
            uncached = ProxyProcess(DATA, uri, *quiet, "--cache", "off").start()
            cached = ProxyProcess(DATA, uri, *quiet).start()
            proxies += [uncached, cached]
            off, on = TimedConnection(uncached.port), TimedConnection(cached.port)
            req = idl.encode_call(
                "get_table_req", 1, req=M.GetTableRequest(dbName=BENCH_DB, tblName=WIDE_TABLE)
            )
            old = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
            rows = []
            base, got, _, size = alternate(off, req, off, old, args.runs)
            rows.append(row("get_table, bridged miss (cache off)", base, got, size))
            base, got, _, size = alternate(on, req, on, old, args.runs)
            rows.append(row("get_table, hit of a bridged entry", base, got, size))
            reqs = idl.encode_call(
                "get_table_objects_by_name_req",
                2,
                req=M.GetTablesRequest(dbName=BENCH_DB, tblNames=names),
            )
            olds = idl.encode_call("get_table_objects_by_name", 2, dbname=BENCH_DB, tbl_names=names)
            base, got, _, size = alternate(off, reqs, off, olds, args.runs)
            rows.append(row("get_table_objects_by_name (10), bridged (cache off)", base, got, size))
            off.close()
            on.close()
        finally:
            relay.kill()
            relay.wait()
        print()
        print("| call | reply bytes | its _req, p50 ms | p50 ms | added ms | ratio | p99 ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))
    finally:
        for proxy in proxies:
            proxy.stop()
        hms.stop()


if __name__ == "__main__":
    main()
