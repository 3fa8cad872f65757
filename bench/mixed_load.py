"""Hits under a mixed workload: many tables read the way Trino reads them while a few are
written every second, on the real HMS, side by side with the direct HMS.

    .venv/bin/python -m bench.mixed_load [--store embedded|redis] [--seconds 20]
        [--tables 24] [--hot 3] [--write-every 1.0]

Each query reads one table as Trino does, every call on a connection of its own: get_table,
then get_partitions_by_names of 20 names. The timed reads go to the ``--tables`` tables no
one writes, through the proxy and straight at the metastore, call by call in turns. Two
phases of ``--seconds`` each: quiet (reads only), then mixed, where another client alters
one of ``--hot`` other tables through the proxy every ``--write-every`` seconds and reads
it back (its refill). Printed per phase: the proxy's p50 and p99 for those hits against
the direct metastore's (timed in turns with them every eighth round), the hits timed, and
the share of hits answered by a fast path, nothing awaited
(``hmsproxy_cache_hits_at_once_total`` over hit and negative_hit look-ups). A write to one
table should cost hits on the others nothing; what it costs them is what this measures.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    BENCH_DB,
    ConnectionPerCall,
    TimedConnection,
    ensure_table,
    percentile,
    start_metastore,
)
from proxy import idl
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import client

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"
PARTITIONS = 60
NAMES = 20
DIRECT_EVERY = 8


def queries(tables: list[str]) -> list[bytes]:
    """Each table's two calls, as Trino makes them for a query over it."""
    out = []
    for n, name in enumerate(tables):
        first = (n * 7) % (PARTITIONS - NAMES)
        names = [f"ds=p{i:06d}" for i in range(first, first + NAMES)]
        out.append(idl.encode_call("get_table", 1, dbname=BENCH_DB, tbl_name=name))
        out.append(
            idl.encode_call(
                "get_partitions_by_names", 1, db_name=BENCH_DB, tbl_name=name, names=names
            )
        )
    return out


def hits(proxy: ProxyProcess) -> tuple[float, float]:
    """(hits answered by a fast path, all hits) so far."""
    metrics = proxy.metrics()
    at_once = metrics.get(("hmsproxy_cache_hits_at_once_total", ()), 0.0)
    total = sum(
        v
        for (name, labels), v in metrics.items()
        if name == "hmsproxy_cache_lookups_total"
        and dict(labels).get("result") in ("hit", "negative_hit")
    )
    return at_once, total


def phase(
    pairs: list[tuple[TimedConnection, TimedConnection]],
    requests: list[bytes],
    lengths: list[tuple[int, int]],
    seconds: float,
) -> tuple[list[float], list[float]]:
    """Proxy timings of ``requests`` round after round for ``seconds``, and the direct
    metastore's of the same calls in turns with them every :data:`DIRECT_EVERY` rounds
    (which of the two goes first alternates): a call straight at it takes ~100 times a
    hit, and would leave few hits to time."""
    direct: list[float] = []
    proxied: list[float] = []
    deadline = time.monotonic() + seconds
    for turn in itertools.count():
        if time.monotonic() >= deadline:
            return direct, proxied
        for (d, p), request, (dl, pl) in zip(pairs, requests, lengths, strict=True):
            if turn % DIRECT_EVERY:
                proxied.append(p.timed(request, pl))
            elif turn % (2 * DIRECT_EVERY):
                proxied.append(p.timed(request, pl))
                direct.append(d.timed(request, dl))
            else:
                direct.append(d.timed(request, dl))
                proxied.append(p.timed(request, pl))


class Writer:
    """Alters one of the hot tables through the proxy every ``every`` seconds, and reads it
    back (as an engine would, refilling its entry): in a process of its own, so that the
    timing client shares no interpreter lock with it."""

    def __init__(self, port: int, tables: list[str], every: float) -> None:
        context = multiprocessing.get_context("fork")
        self.stopped = context.Event()
        self.writes = context.Value("i", 0)
        self.process = context.Process(target=self.run, args=(port, tables, every), daemon=True)

    def run(self, port: int, tables: list[str], every: float) -> None:
        with client("127.0.0.1", port) as c:
            for n in itertools.count():
                if self.stopped.wait(every):
                    return
                name = tables[n % len(tables)]
                table = c.get_table(BENCH_DB, name)
                table.parameters = {**(table.parameters or {}), "bench.write": str(n)}
                c.alter_table(BENCH_DB, name, table)
                c.get_table(BENCH_DB, name)
                with self.writes.get_lock():
                    self.writes.value += 1

    def start(self) -> None:
        self.process.start()

    def stop(self) -> int:
        """Stop it; the writes it made."""
        self.stopped.set()
        self.process.join()
        return int(self.writes.value)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["embedded", "redis"], default="embedded")
    parser.add_argument("--seconds", type=float, default=20.0, help="of each phase")
    parser.add_argument("--tables", type=int, default=24, help="tables read, never written")
    parser.add_argument("--hot", type=int, default=3, help="tables written")
    parser.add_argument("--write-every", type=float, default=1.0, help="seconds")
    args = parser.parse_args()

    hms = start_metastore(DATA)
    redis_server = RedisServer(DATA / "redis-mixed") if args.store == "redis" else None
    proxy = None
    stops: list[Callable[[], None]] = []
    try:
        read = [f"mixed_{n:02d}" for n in range(args.tables)]
        hot = [f"mixed_hot_{n:02d}" for n in range(args.hot)]
        for name in read + hot:
            ensure_table(hms, name, PARTITIONS)
        extra = ["--log-level", "warning", "--memory-cache-bytes", "1GiB"]
        extra += ["--ttl-table", "3600", "--ttl-partitions", "3600"]  # (nothing expires)
        if redis_server is not None:
            redis_server.start()
            stops.append(redis_server.stop)
            extra += ["--redis", redis_server.url]
        proxy = ProxyProcess(DATA, hms.uri, *extra).start()
        requests = queries(read)
        pairs = [(ConnectionPerCall(hms.port), ConnectionPerCall(proxy.port)) for _ in requests]
        lengths = [
            (d.reply_length(r), p.reply_length(r))
            for (d, p), r in zip(pairs, requests, strict=True)
        ]
        phase(pairs, requests, lengths, 2.0)  # (warm: every reply cached, JITs warm)
        print(
            f"{args.tables} tables read ({len(requests)} calls a round, each on a connection of"
            f" its own), {args.hot} written every {args.write_every:g} s; store {args.store};"
            f" {args.seconds:g} s a phase"
        )
        print(
            "| phase | writes | direct p50 ms | proxy p50 ms | ratio | direct p99 ms"
            " | proxy p99 ms | ratio | hits timed | hits by a fast path |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name in ("quiet", "mixed"):
            writer = Writer(proxy.port, hot, args.write_every) if name == "mixed" else None
            before = hits(proxy)
            if writer is not None:
                writer.start()
            direct, proxied = phase(pairs, requests, lengths, args.seconds)
            writes = writer.stop() if writer is not None else 0
            after = hits(proxy)
            at_once = (after[0] - before[0]) / max(1.0, after[1] - before[1])
            d50, p50 = statistics.median(direct), statistics.median(proxied)
            d99, p99 = percentile(direct, 0.99), percentile(proxied, 0.99)
            print(
                f"| {name} | {writes} | {d50 * 1e3:.3f}"
                f" | {p50 * 1e3:.3f} | {p50 / d50:.3f}x | {d99 * 1e3:.3f} | {p99 * 1e3:.3f}"
                f" | {p99 / d99:.3f}x | {len(proxied)} | {at_once:.1%} |",
                flush=True,
            )
    finally:
        if proxy is not None:
            proxy.stop()
        for stop in stops:
            stop()
        hms.stop()


if __name__ == "__main__":
    main()
