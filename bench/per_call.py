"""Trino's way, two builds side by side: a connection per get_table hit, CPU split in two.

    .venv/bin/python -m bench.per_call <checkout A> "<A's flags>" <checkout B> "<B's flags>" \
        [rounds]

Both proxies (embedded store) run on one real metastore with the floor server; get_table
hits on a connection per call (connect, call, last byte, close) are alternated in batches of
1,000 between A, B and the floor, the order swapped each round. Printed: p50, its ratio to
the floor, and each process's user and system CPU time per call (``/proc``, 10 ms ticks:
1 us per call over 10,000 calls). A checkout needs its C extensions built (see
``bench.builds``); the same checkout twice with different flags compares options.
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from bench.builds import DATA, cpu_split, start_proxy
from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    ConnectionPerCall,
    ReplayFloor,
    TimedConnection,
    ensure_wide_table,
    reply_bytes,
    start_metastore,
)
from proxy import idl
from tests.rig.ports import wait_for_port

BATCH = 1000


def main() -> None:
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    a_code, a_flags, b_code, b_flags = sys.argv[1:5]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    hms = start_metastore(DATA)
    processes: list[subprocess.Popen[bytes]] = []
    floor = None
    try:
        ensure_wide_table(hms, 10_000)
        request = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
        a, a_port = start_proxy(Path(a_code).resolve(), hms.uri, shlex.split(a_flags))
        processes.append(a)
        wait_for_port(a_port, 60, alive=lambda: a.poll() is None)
        b, b_port = start_proxy(Path(b_code).resolve(), hms.uri, shlex.split(b_flags))
        processes.append(b)
        wait_for_port(b_port, 60, alive=lambda: b.poll() is None)
        floor = ReplayFloor(
            [(request, reply_bytes(TimedConnection(hms.port), request))], "uvloop", DATA / "floor"
        )
        each = {
            "A": (ConnectionPerCall(a_port), a.pid),
            "B": (ConnectionPerCall(b_port), b.pid),
            "floor": (ConnectionPerCall(floor.port), floor.process.pid),
        }
        length = {name: conn.reply_length(request) for name, (conn, _) in each.items()}
        for name, (conn, _) in each.items():  # warm: cached, and the loops' paths run
            for _ in range(BATCH):
                conn.timed(request, length[name])
        samples: dict[str, list[float]] = {name: [] for name in each}
        user = dict.fromkeys(each, 0.0)
        system = dict.fromkeys(each, 0.0)
        for n in range(rounds):
            for name in ("A", "B", "floor") if n % 2 == 0 else ("B", "A", "floor"):
                conn, pid = each[name]
                u0, s0 = cpu_split(pid)
                for _ in range(BATCH):
                    samples[name].append(conn.timed(request, length[name]))
                u1, s1 = cpu_split(pid)
                user[name] += u1 - u0
                system[name] += s1 - s0
        calls = rounds * BATCH
        base = statistics.median(samples["floor"])
        print("| | p50 us | / floor | user CPU per call | system CPU per call |")
        print("|---|---:|---:|---:|---:|")
        for name in each:
            p50 = statistics.median(samples[name])
            print(
                f"| {name} | {p50 * 1e6:.1f} | {p50 / base:.2f}x | "
                f"{user[name] / calls * 1e6:.0f} us | {system[name] / calls * 1e6:.0f} us |"
            )
    finally:
        if floor is not None:
            floor.stop()
        for process in processes:
            process.kill()
            process.wait()
        hms.stop()


if __name__ == "__main__":
    main()
