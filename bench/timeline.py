"""Where a forwarded call's time goes: the proxy's steps against a do-nothing relay's.

    .venv/bin/python -m bench.timeline [--runs 1500] [--yield-after-reply]

Starts a real HMS (the data of bench.passthrough), a proxy in front of it (``--cache off``)
and a do-nothing relay, each in its own process with timestamps taken inside its protocol
callbacks (``perf_counter``: the same monotonic clock in every process here), and times
``get_table`` through each and directly, taking turns. Each call is then laid out on one
clock: from the client's send to the callback that reads the request, the callback's work
before and after its write to the metastore, the metastore's time, the reply's callback
before and after its write to the client, and from that write to the client's last byte.

The proxy's callbacks are wrapped (not changed) to take the timestamps: a few hundred
nanoseconds each. ``--yield-after-reply``: the proxy calls ``os.sched_yield()`` right after
writing a reply, an experiment (not an option of the proxy): if the client then gets its
reply sooner, it was waiting for the proxy's core.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (
    BENCH_DB,
    WIDE_TABLE,
    TimedConnection,
    ensure_wide_table,
    p50,
    start_metastore,
)
from proxy import idl
from tests.rig.ports import free_ports, wait_for_port

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"

# Run as the proxy's process: timestamps around its callbacks and writes, then the proxy.
PROXY = """
import atexit, os, sys
from time import perf_counter
marks = []
mark = marks.append
from proxy import client_connection
from proxy.conn import protocol
from proxy.handler import dispatch, flight
from proxy.upstream import streams
def wrap(owner, name, before, after):
    original = getattr(owner, name)
    def timed(*args):
        mark((before, perf_counter()))
        original(*args)
        mark((after, perf_counter()))
    setattr(owner, name, timed)
wrap(protocol.ClientProtocol, "data_received", "request", "request done")
wrap(streams.DivertingProtocol, "data_received", "reply", "reply done")
wrap(dispatch, "guarded_write", "write", "written")
wrap(client_connection.ClientConnection, "write_at_once", "write", "written")
if os.environ["YIELD"] == "1":
    original = client_connection.ClientConnection.write_at_once
    def then_yield(self, reply):
        original(self, reply)
        os.sched_yield()
    client_connection.ClientConnection.write_at_once = then_yield
def save():
    with open(os.environ["MARKS"], "w") as out:
        out.writelines(f"{tag}|{at!r}\\n" for tag, at in marks)
atexit.register(save)
from proxy.cli import main
sys.argv = ["proxy", *sys.argv[1:]]
sys.exit(main())
"""

# Run as the relay's process: bench.common's relay floor, with the same timestamps.
RELAY = """
import asyncio, os, signal, socket, sys
from time import perf_counter
import uvloop
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
marks = []
mark = marks.append
host, port = sys.argv[1], int(sys.argv[2])
class Back(asyncio.Protocol):
    def __init__(self, front):
        self.front = front
    def data_received(self, data):
        mark(("reply", perf_counter()))
        mark(("write", perf_counter()))
        self.front.write(data)
        mark(("written", perf_counter()))
        mark(("reply done", perf_counter()))
class Relay(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.back, self.early = transport, None, []
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        asyncio.ensure_future(self.open())
    async def open(self):
        loop = asyncio.get_running_loop()
        self.back, _ = await loop.create_connection(lambda: Back(self.transport), host, port)
        for data in self.early:
            self.back.write(data)
    def data_received(self, data):
        mark(("request", perf_counter()))
        mark(("write", perf_counter()))
        if self.back is None:
            self.early.append(data)
        else:
            self.back.write(data)
        mark(("written", perf_counter()))
        mark(("request done", perf_counter()))
async def main():
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    server = await loop.create_server(Relay, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await stop
asyncio.run(main())
with open(os.environ["MARKS"], "w") as out:
    out.writelines(f"{tag}|{at!r}\\n" for tag, at in marks)
"""

# The marks one call leaves, in order, and what lies between each and the next.
STEPS = ["request", "write", "written", "request done", "reply", "write", "written", "reply done"]
SPANS = [
    ("the request's callback, before its write", 0, 1),
    ("its write to the metastore", 1, 2),
    ("the request's callback, after its write", 2, 3),
    ("the metastore (from the write to the reply's callback)", 2, 4),
    ("the reply's callback, before its write", 4, 5),
    ("its write to the client", 5, 6),
    ("the reply's callback, after its write", 6, 7),
]


def read_marks(path: Path) -> tuple[list[float], list[str]]:
    pairs = sorted(
        (float(at), tag)
        for tag, at in (line.rstrip("\n").split("|") for line in path.read_text().splitlines())
    )
    return [at for at, _ in pairs], [tag for _, tag in pairs]


def layout(
    calls: list[tuple[float, float]], times: list[float], tags: list[str]
) -> list[list[float]]:
    """Per call: the spans of SPANS, then from the client's send to the request's callback,
    from the write to the client to its last byte, and the whole call (seconds); calls whose
    marks are not the expected eight in order are left out."""
    rows = []
    for sent, got in calls:
        at = bisect.bisect_left(times, sent)
        if tags[at : at + len(STEPS)] != STEPS:
            continue
        t = times[at : at + len(STEPS)]
        spans = [t[b] - t[a] for _, a, b in SPANS]
        rows.append([*spans, t[0] - sent, got - t[6], got - sent])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1500, help="get_table calls per side")
    parser.add_argument("--partitions", type=int, default=10_000, help="as bench.passthrough")
    parser.add_argument("--yield-after-reply", action="store_true")
    args = parser.parse_args()
    hms = start_metastore(DATA)
    work = Path(tempfile.mkdtemp(prefix="timeline-"))
    marks = {"proxy": work / "proxy.marks", "relay": work / "relay.marks"}
    processes: list[subprocess.Popen[str]] = []
    try:
        ensure_wide_table(hms, args.partitions)
        port, metrics_port, admin_port = free_ports(3)
        env = dict(os.environ, MARKS=str(marks["proxy"]), YIELD=str(int(args.yield_after_reply)))
        options = ["--upstream", hms.uri, "--listen", f"127.0.0.1:{port}"]
        options += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
        options += ["--admin-listen", f"127.0.0.1:{admin_port}"]
        options += ["--log-level", "warning", "--cache", "off"]
        command = [sys.executable, "-c", PROXY, "serve", *options]
        processes.append(subprocess.Popen(command, env=env, text=True))
        wait_for_port(port, 30)
        env = dict(os.environ, MARKS=str(marks["relay"]))
        command = [sys.executable, "-c", RELAY, hms.host, str(hms.port)]
        relay = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        processes.append(relay)
        assert relay.stdout is not None
        ports = {"direct": hms.port, "proxy": port, "relay": int(relay.stdout.readline())}
        conns = {side: TimedConnection(p) for side, p in ports.items()}
        request = idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=WIDE_TABLE)
        length = conns["direct"].reply_length(request)
        for conn in conns.values():
            assert conn.reply_length(request) == length
        calls: dict[str, list[tuple[float, float]]] = {side: [] for side in conns}
        orders = list(itertools.permutations(conns))
        for i in range(args.runs):
            for side in orders[i % len(orders)]:
                sent = time.perf_counter()
                took = conns[side].timed(request, length)
                calls[side].append((sent, sent + took))
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        hms.stop()
    rows = {side: layout(calls[side], *read_marks(marks[side])) for side in marks}
    direct = p50([got - sent for sent, got in calls["direct"]])
    print(f"\nget_table, {args.runs} calls each, p50 in us (direct: {direct * 1e6:.0f} us)")
    print(f"calls laid out: proxy {len(rows['proxy'])}, relay {len(rows['relay'])}\n")
    names = [name for name, _, _ in SPANS]
    names = [
        "from the client's send to the request's callback",
        *names,
        "from the write to the client to its last byte",
        "the whole call",
    ]
    order = [len(SPANS), *range(len(SPANS)), len(SPANS) + 1, len(SPANS) + 2]
    print("| step | proxy | relay |")
    print("|---|---:|---:|")
    for name, k in zip(names, order, strict=True):
        cells = [p50([row[k] for row in rows[side]]) * 1e6 for side in ("proxy", "relay")]
        print(f"| {name} | {cells[0]:.1f} | {cells[1]:.1f} |")


if __name__ == "__main__":
    main()
