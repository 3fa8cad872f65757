"""Two builds of the proxy side by side on one metastore, against the floor.

    git worktree add /tmp/wt-base <commit>   # then, in it: ln -s <this checkout>/.venv .venv
    (cd /tmp/wt-base && .venv/bin/python setup.py build_ext --inplace -q)
    .venv/bin/python -m bench.builds --base /tmp/wt-base [--rounds 3] [--seconds 5]

``bench.cache`` measures one build at a time; between two of its runs the machine's hour
moves the floor itself by a third or more, so two builds a few percent apart cannot be told
apart that way. Here both builds run at once (embedded store) on one real metastore, and:

* get_table hits are timed on one connection to each build and to the floor, alternated
  call by call (``bench.cache``'s ``side_by_side``): p50 and the ratio to the floor;
* get_partitions (10,000) hits on one connection, alternated likewise (a 12 MB reply);
* get_table hits on a connection per call (Trino's way: connect, call, last byte, close),
  alternated likewise: p50, the ratio to the floor, and each process's CPU time per call
  (from ``/proc``, in 10 ms ticks: 10 us per call over 1,000 calls, 20 us over 500);
* 64 connections of get_table hits load each build and the floor in turn, for
  ``--seconds`` each, the builds' order alternating round by round: calls per second.

``--base``: a checkout of the other build, with its C extensions built (its own code is
run, with this checkout's virtualenv if it links it). This checkout is "this".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.cache import load, side_by_side
from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    ConnectionPerCall,
    ReplayFloor,
    TimedConnection,
    ensure_wide_table,
    p50,
    reply_bytes,
    start_metastore,
)
from proxy import idl
from tests.rig.ports import free_port, wait_for_port

HERE = Path(__file__).resolve().parent.parent
DATA = HERE / ".rig" / "bench"


def start_proxy(
    code: Path, upstream: str, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], int]:
    """The proxy of the checkout at ``code`` (its own modules first on the path), with the
    ``extra`` flags."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            *("-m", "proxy", "serve", "--upstream", upstream),
            *("--listen", f"127.0.0.1:{port}"),
            *("--metrics-listen", f"127.0.0.1:{free_port()}"),
            *("--admin-listen", f"127.0.0.1:{free_port()}"),
            *("--log-level", "warning", "--memory-cache-bytes", "1GiB"),
            *("--ttl-table", "3600", "--ttl-partitions", "3600"),
            *extra,
        ],
        cwd=code,
        env=dict(os.environ, PYTHONPATH=str(code)),
    )
    return process, port


def cpu_split(pid: int) -> tuple[float, float]:
    """The process's user and system CPU time so far, in seconds (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, user and system."""
    return sum(cpu_split(pid))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="the other build's checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2000, help="calls per round, each build")
    parser.add_argument("--seconds", type=float, default=5.0, help="each 64-connection load")
    args = parser.parse_args()
    if not (args.base / "proxy" / "__init__.py").is_file():
        parser.error(f"--base: no proxy package in {args.base}")
    hms = start_metastore(DATA)
    processes: list[subprocess.Popen[bytes]] = []
    floor = None
    try:
        ensure_wide_table(hms, 10_000)
        ports: dict[str, int] = {}
        for name, code in (("base", args.base.resolve()), ("this", HERE)):
            process, ports[name] = start_proxy(code, hms.uri)
            processes.append(process)
            wait_for_port(ports[name], 60, alive=lambda p=process: p.poll() is None)
        request = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
        reply = reply_bytes(TimedConnection(hms.port), request)
        wide = idl.encode_call(
            "get_partitions", 2, db_name=BENCH_DB, tbl_name=WIDE_TABLE, max_parts=-1
        )
        wide_reply = reply_bytes(TimedConnection(hms.port), wide)
        floor = ReplayFloor([(request, reply), (wide, wide_reply)], "uvloop", DATA / "floor")
        ports["floor"] = floor.port
        names = ("base", "this", "floor")
        conns = [TimedConnection(ports[name]) for name in names]
        print(f"\nget_table hits on one connection, alternated call by call ({args.runs} each)\n")
        print("| round | base p50 us | this p50 us | floor p50 us |")
        print("|---|---:|---:|---:|")
        for n in range(args.rounds):
            (b, t, f), size = side_by_side(conns, [request], args.runs, True)
            print(
                f"| {n + 1} | {p50(b) * 1e6:.1f} ({p50(b) / p50(f):.2f}x) | "
                f"{p50(t) * 1e6:.1f} ({p50(t) / p50(f):.2f}x) | {p50(f) * 1e6:.1f} |"
            )
        wide_runs = max(50, args.runs // 10)
        print(f"\nget_partitions (10,000) hits on one connection, alternated ({wide_runs} each)\n")
        print("| round | base p50 ms | this p50 ms | floor p50 ms |")
        print("|---|---:|---:|---:|")
        for n in range(args.rounds):
            (b, t, f), _ = side_by_side(conns, [wide], wide_runs, True)
            print(
                f"| {n + 1} | {p50(b) * 1e3:.2f} ({p50(b) / p50(f):.2f}x) | "
                f"{p50(t) * 1e3:.2f} ({p50(t) / p50(f):.2f}x) | {p50(f) * 1e3:.2f} |"
            )
        for conn in conns:
            conn.close()
        pids = {"base": processes[0].pid, "this": processes[1].pid, "floor": floor.process.pid}
        each = [ConnectionPerCall(ports[name]) for name in names]
        calls = max(500, args.runs // 2)
        print(f"\nget_table hits on a connection per call, alternated ({calls} each)\n")
        head = "| round | base p50 us | this p50 us | floor p50 us | CPU per call: base |"
        print(head + " this | floor |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for n in range(args.rounds):
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            (b, t, f), _ = side_by_side(each, [request], calls, False)
            cpu = {
                name: (cpu_seconds(pid) - before[name]) / calls * 1e6 for name, pid in pids.items()
            }
            print(
                f"| {n + 1} | {p50(b) * 1e6:.1f} ({p50(b) / p50(f):.2f}x) | "
                f"{p50(t) * 1e6:.1f} ({p50(t) / p50(f):.2f}x) | {p50(f) * 1e6:.1f} | "
                f"{cpu['base']:.0f} us | {cpu['this']:.0f} us | {cpu['floor']:.0f} us |"
            )
        print(f"\n64 connections of get_table hits, {args.seconds:g} s each, calls/s\n")
        print("| round | base | this | floor |")
        print("|---|---:|---:|---:|")
        for n in range(args.rounds + 1):
            rate = {}
            order = names if n % 2 == 0 else ("this", "base", "floor")
            for name in order:
                calls, _ = asyncio.run(load(ports[name], request, size, 64, args.seconds))
                rate[name] = calls / args.seconds
            print(
                f"| {n + 1} | {rate['base']:,.0f} ({rate['base'] / rate['floor']:.2f}x) | "
                f"{rate['this']:,.0f} ({rate['this'] / rate['floor']:.2f}x) | "
                f"{rate['floor']:,.0f} |"
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
