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


def connect(args: argparse.Namespace) -> tuple[grpc.Channel, list[tuple[str, str]]]:
    metadata = []
    if args.token_file:
        metadata.append(("authorization", f"Bearer {Path(args.token_file).read_text().strip()}"))
    return grpc.insecure_channel(args.admin), metadata


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
    channel, metadata = connect(args)
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
    for progress in stub.Warm(request, metadata=metadata):
        last = progress
        if progress.partitions_total:
            done, total = progress.partitions_done, progress.partitions_total
            width = 30
            filled = int(width * done / total)
            bar = "#" * filled + "-" * (width - filled)
            print(
                f"\r{args.target} [{bar}] {done}/{total} partitions",
                end="",
                file=sys.stderr,
                flush=True,
            )
    print(file=sys.stderr)
    total = last.partitions_total if last else 0
    print(f"warmed {args.target}: table, partition names, {total} partitions")
    return 0


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
