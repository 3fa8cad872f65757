"""The worst day of a metastore, with the proxy's protections on and off, side by side.

    .venv/bin/python -m bench.protections [--partitions 500000] [--heavy 20] [--small 50]

A real HMS 2.3.10 (``--heap``, 768m as the tests run it) with ``bench.huge`` of
``--partitions`` partitions (made once, kept under .rig/bench) and ten small tables. Three
runs through a proxy with the cache off (so every call reaches the metastore): quiet (the
small callers alone), protected (the heavy line, one at a time; the 100 MiB reply limit;
a limit of 50,000 partitions a call), unprotected (as before issue 42: no limit, no heavy
line, replies up to 1 GiB). Each loaded run: ``--heavy`` clients fetch the whole huge table
at once while ``--small`` clients of other users make small calls. Prints the metastore's
heap peak, the small callers' p50 and p99, what the heavy fetches got, and whether the
metastore survived (docs/reliability.md). The metastore is restarted before each run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import BENCH_DB, ensure_table
from tests.rig.bulk_partitions import make_partitioned_table
from tests.rig.hms import MetastoreServer
from tests.rig.protection_load import SUMMARY_HEAD, run_load, summary
from tests.rig.proxy_process import ProxyProcess

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"
HUGE = "huge"
SMALL = [f"small{i}" for i in range(10)]

PROTECTED = ["--max-partitions-per-call", "50000", "--heavy-max-concurrent", "1"]
UNPROTECTED = [
    "--max-partitions-per-call", "0", "--heavy-max-concurrent", "0", "--max-reply-bytes", "1GiB",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=500_000)
    parser.add_argument("--heavy", type=int, default=20)
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0, help="at least, each run")
    parser.add_argument("--heap", default="768m", help="the metastore's -Xmx")
    parser.add_argument("--pause", type=float, default=1.0, help="a small caller's, between calls")
    parser.add_argument("--runs", default="quiet,protected,unprotected")
    parser.add_argument("--timeout", type=float, default=300.0, help="a client's, per call")
    args = parser.parse_args()
    hms = MetastoreServer(DATA / f"hms-huge-{args.partitions}", heap=args.heap)
    hms.start()
    try:
        for name in SMALL:
            ensure_table(hms, name, 2)
        make_partitioned_table(hms, BENCH_DB, HUGE, args.partitions)  # (once: kept)
    finally:
        hms.stop()
    rows = []
    for run in args.runs.split(","):
        hms.start()
        extra = PROTECTED if run == "protected" else UNPROTECTED
        proxy = ProxyProcess(
            DATA, hms.uri, "--cache", "off", "--upstream-max-idle", "64", "--log-level", "warning",
            *extra,
        )  # fmt: skip
        proxy.start()
        try:
            assert hms.process is not None
            pid = hms.process.pid
            # Warm first (connections made, code compiled), as a metastore in service is.
            run_load(proxy.port, pid, lambda: True, BENCH_DB, HUGE, SMALL, heavy=0,
                     small=args.small, seconds=5, pause=args.pause)  # fmt: skip
            result = run_load(
                proxy.port,
                hms.process.pid,
                lambda: hms.process is not None and hms.process.poll() is None,
                BENCH_DB,
                HUGE,
                SMALL,
                heavy=0 if run == "quiet" else args.heavy,
                small=args.small,
                seconds=args.seconds,
                pause=args.pause,
                timeout=args.timeout,
            )
        finally:
            proxy.stop()
            hms.stop()
        rows.append(summary(run, result))
        print(rows[-1], flush=True)
        for text, times in result.texts.most_common(3):
            print(f"    {times} x {text}", flush=True)
    print(f"\n{args.partitions:,} partitions, {args.heavy} heavy and {args.small} small clients")
    print(SUMMARY_HEAD)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
