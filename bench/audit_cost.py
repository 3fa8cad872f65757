"""What the audit log costs hits: two proxies side by side, one writing --audit-log.

    .venv/bin/python -m bench.audit_cost [--runs 3000]   # ~1 min

Both run the embedded cache in front of the same real HMS (bench.wide, 3,000 partitions);
one also writes an audit line per call to a file. Calls take turns between them (so the
machine's moments fall on both alike): get_table on a kept connection (an Again),
get_partitions_by_names of 100 repeated, and get_table on a connection of its own per call
(Trino's way: the call known by its bytes). Prints p50 and p99 per call and the ratio, and
the audit lines' size, and the
proxy's own cost of a line, timed in process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.cache import side_by_side
from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    ConnectionPerCall,
    TimedConnection,
    ensure_wide_table,
    p50,
    percentile,
    start_metastore,
)
from proxy import idl
from proxy.audit import AuditLog
from tests.rig.proxy_process import ProxyProcess

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"


def line_cost(folder: Path, lines: int = 200_000) -> float:
    """Microseconds the proxy spends per audit line (made, held, written), in process."""
    log = AuditLog(str(folder / "cost.log"), 1 << 30, 0)
    started = time.perf_counter()
    for n in range(lines):
        log.record(
            "alice",
            "10.1.2.3",
            "get_table",
            BENCH_DB,
            WIDE_TABLE,
            None,
            9000 + n % 7,
            "ok",
            "hit",
            0.000041,
        )
    log.close()
    return (time.perf_counter() - started) / lines * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
    hms = start_metastore(DATA)
    proxies: list[ProxyProcess] = []
    try:
        ensure_wide_table(hms, 3000)
        base = ["--log-level", "warning", "--ttl-table", "3600", "--ttl-partitions", "3600"]
        logs = Path(tempfile.mkdtemp(prefix="audit-", dir=DATA))
        audit_file = logs / "audit.log"
        for extra in ([], ["--audit-log", str(audit_file)]):
            proxies.append(ProxyProcess(DATA, hms.uri, *base, *extra).start())
        plain, audited = proxies
        names = [f"ds=p{i:06d}" for i in range(100)]
        get_table = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
        by_names = idl.encode_call(
            "get_partitions_by_names", 2, db_name=BENCH_DB, tbl_name=WIDE_TABLE, names=names
        )
        cases = [
            ("get_table, kept connection", TimedConnection, get_table, args.runs),
            ("get_partitions_by_names (100), repeated", TimedConnection, by_names, args.runs // 3),
            ("get_table, a connection per call", ConnectionPerCall, get_table, args.runs // 3),
        ]
        print("| call | off p50 ms | on p50 ms | on / off | off p99 ms | on p99 ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, kind, request, runs in cases:
            conns = [kind(plain.port), kind(audited.port)]
            (off, on), _size = side_by_side(conns, [request], runs)
            print(
                f"| {name} | {p50(off) * 1e3:.3f} | {p50(on) * 1e3:.3f} | "
                f"{p50(on) / p50(off):.2f}x | {percentile(off, 0.99) * 1e3:.3f} | "
                f"{percentile(on, 0.99) * 1e3:.3f} |"
            )
        audited.stop()  # (its last lines written)
        proxies.remove(audited)
        lines = audit_file.read_bytes().splitlines()
        size = sum(map(len, lines)) / max(1, len(lines))
        print(f"\n{len(lines)} audit lines, {size:.0f} bytes each")
        print(f"a line made and written, in process: {line_cost(logs):.2f} us")
    finally:
        for proxy in proxies:
            proxy.stop()
        hms.stop()


if __name__ == "__main__":
    main()
