"""``hms-cache-proxy invalidate | warm | stats``: the admin API from a shell."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from proxy.admin._gen import admin_pb2 as pb
from proxy.admin._gen import admin_pb2_grpc as pb_grpc
from proxy.cache.keys import PartitionNameError, parse_partition_name
from proxy.config import ENV_PREFIX


def common(p: argparse.ArgumentParser) -> None:
    """Where the admin port is, and its token: every admin-port command takes these."""
    p.add_argument(
        "--admin",
        default=os.environ.get(ENV_PREFIX + "ADMIN_LISTEN", "127.0.0.1:9091"),
        help="the proxy's admin address (default: $HMS_CACHE_PROXY_ADMIN_LISTEN or 127.0.0.1:9091)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get(ENV_PREFIX + "ADMIN_TOKEN_FILE"),
        help="file with the admin bearer token (default: $HMS_CACHE_PROXY_ADMIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--admin-ca",
        default=os.environ.get(ENV_PREFIX + "ADMIN_CA"),
        metavar="PATH",
        help="PEM CA bundle: talk TLS to an admin port started with --admin-tls-cert "
        "(default: $HMS_CACHE_PROXY_ADMIN_CA)",
    )


class Unusable(Exception):
    """A command-line argument that cannot be used (a file that cannot be read)."""


def connect(args: argparse.Namespace) -> tuple[grpc.Channel, list[tuple[str, str]]]:
    metadata = []
    if args.token_file:
        metadata.append(("authorization", f"Bearer {_read(args.token_file, '--token-file')}"))
    if args.admin_ca:
        ca = _read(args.admin_ca, "--admin-ca").encode()
        return grpc.secure_channel(args.admin, grpc.ssl_channel_credentials(ca)), metadata
    return grpc.insecure_channel(args.admin), metadata


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise Unusable(f"{flag} {path}: {exc.strerror or exc}") from exc


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "invalidate", help="forget what the cache holds for a table or database"
    )
    p.add_argument("target", help="db or db.table")
    p.add_argument(
        "--partition",
        action="append",
        default=[],
        metavar="SPEC",
        help="only this partition, as its name (ds=2024-01-01/region=eu); repeatable",
    )
    common(p)
    p = commands.add_parser("warm", help="prefetch a table and its partitions into the cache")
    p.add_argument("target", help="db.table")
    p.add_argument("--where", default="", help='a Hive partition filter, e.g. ds >= "2024-01-01"')
    p.add_argument("--batch", type=int, default=100, help="partitions per get_partitions_by_names")
    common(p)
    p = commands.add_parser("stats", help="hit ratios by method, entries, follower state")
    common(p)
    p = commands.add_parser("flush", help="forget everything the cache holds")
    common(p)


def run(args: argparse.Namespace) -> int:
    try:
        channel, metadata = connect(args)
    except Unusable as exc:
        print(f"hms-cache-proxy {args.command}: {exc}", file=sys.stderr)
        return 2
    stub = pb_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
    try:
        return int(globals()[f"_{args.command}"](stub, metadata, args))
    except grpc.RpcError as exc:
        print(
            f"hms-cache-proxy {args.command}: {exc.code().name}: {exc.details()}", file=sys.stderr
        )
        return 1


def _invalidate(stub: Any, metadata: list[tuple[str, str]], args: argparse.Namespace) -> int:
    db, _, table = args.target.partition(".")
    parts = []
    for spec in args.partition:
        try:
            parts.append(pb.PartitionValues(values=list(parse_partition_name(spec)[1])))
        except PartitionNameError:
            print(f"hms-cache-proxy invalidate: not a partition name: {spec}", file=sys.stderr)
            return 2
    reply = stub.Invalidate(
        pb.InvalidateRequest(database=db, table=table, partitions=parts), metadata=metadata
    )
    which = f" {', '.join(args.partition)}" if parts else ""
    print(f"invalidated {args.target}{which} ({reply.scopes} scopes)")
    return 0


def _warm(stub: Any, metadata: list[tuple[str, str]], args: argparse.Namespace) -> int:
    db, _, table = args.target.partition(".")
    if not table:
        print("hms-cache-proxy warm: give db.table", file=sys.stderr)
        return 2
    request = pb.WarmRequest(
        database=db, table=table, partition_filter=args.where, batch_size=args.batch
    )
    last = None
    bar = Progress(args.target)
    for progress in stub.Warm(request, metadata=metadata):
        last = progress
        if progress.partitions_total:
            bar.show(progress.partitions_done, progress.partitions_total)
    bar.end()
    total = last.partitions_total if last else 0
    print(f"warmed {args.target}: table, partition names, {total} partitions")
    return 0


class Progress:
    """A progress bar redrawn in place on a terminal; elsewhere (a log, a pipe) a line at
    each tenth of the way, without carriage returns."""

    def __init__(self, label: str, out: Any = None) -> None:
        self.label = label
        self.out = out or sys.stderr
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self._tenth = -1
        self._drawn = False

    def show(self, done: int, total: int) -> None:
        if self.tty:
            filled = int(30 * done / total)
            bar = "#" * filled + "-" * (30 - filled)
            print(f"\r{self.label} [{bar}] {done}/{total} partitions", end="", file=self.out)
            self.out.flush()
            self._drawn = True
            return
        tenth = 10 * done // total
        if tenth != self._tenth:
            self._tenth = tenth
            print(f"{self.label}: {done}/{total} partitions", file=self.out, flush=True)

    def end(self) -> None:
        if self._drawn:
            print(file=self.out)


def _stats(stub: Any, metadata: list[tuple[str, str]], args: argparse.Namespace) -> int:
    s = stub.Stats(pb.StatsRequest(), metadata=metadata)
    print(f"{'method':38} {'hits':>8} {'neg':>6} {'misses':>8} {'bypass':>7} {'hit ratio':>9}")
    for m in sorted(s.methods, key=lambda m: -(m.hits + m.misses)):
        print(
            f"{m.method:38} {m.hits:>8} {m.negative_hits:>6} {m.misses:>8} {m.bypasses:>7} "
            f"{m.hit_ratio:>9.1%}"
        )
    print(
        f"\noverall hit ratio {s.hit_ratio:.1%}; "
        f"partitions {s.partitions_hit} hit, {s.partitions_missed} fetched"
    )
    print(
        f"store {s.store} ({'available' if s.store_available else 'UNAVAILABLE'}): "
        f"{s.entries} entries, {s.bytes:,} bytes in this proxy"
    )
    who = "this proxy" if s.notification_leader else "another proxy or none"
    print(f"notification follower: {who}, last event {s.last_event_id}")
    return 0


def _flush(stub: Any, metadata: list[tuple[str, str]], args: argparse.Namespace) -> int:
    reply = stub.FlushAll(pb.FlushAllRequest(), metadata=metadata)
    print(f"flushed: {reply.keys_removed} keys removed")
    return 0
