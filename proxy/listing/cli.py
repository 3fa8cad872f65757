"""``hms-cache-proxy splits | ls``: split plans and file listings from a shell."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

import grpc

from proxy.admin._gen import listing_pb2 as pb
from proxy.admin._gen import listing_pb2_grpc as pb_grpc
from proxy.admin.cli import Unusable, common, connect
from proxy.cache.keys import PartitionNameError, parse_partition_name

COMMANDS = ("splits", "ls")


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "splits",
        help="how many splits an engine makes of a scan, and what small files cost",
    )
    p.add_argument("target", help="db.table")
    p.add_argument(
        "--where", default="", help="a Hive partition filter, e.g. \"ds >= '2021-01-03'\""
    )
    p.add_argument("--engine", choices=("trino", "spark"), default="trino")
    p.add_argument("--max-split-size", type=int, default=0, help="Trino: bytes (default 64 MiB)")
    p.add_argument(
        "--max-initial-split-size", type=int, default=0, help="Trino: bytes (default 32 MiB)"
    )
    p.add_argument("--max-initial-splits", type=int, default=0, help="Trino: (default 200)")
    p.add_argument(
        "--max-partition-bytes",
        type=int,
        default=0,
        help="Spark: spark.sql.files.maxPartitionBytes (default 128 MiB)",
    )
    p.add_argument(
        "--open-cost",
        type=int,
        default=0,
        help="Spark: spark.sql.files.openCostInBytes (default 4 MiB)",
    )
    p.add_argument(
        "--parallelism", type=int, default=0, help="Spark: default parallelism (default 1)"
    )
    p.add_argument(
        "--target-file-size", type=int, default=0, help="for the compaction estimate (128 MiB)"
    )
    common(p)
    p = commands.add_parser("ls", help="the files of a table or of one partition")
    p.add_argument("target", help="db.table")
    p.add_argument("--partition", default="", metavar="SPEC", help="e.g. ds=2024-01-01")
    p.add_argument("--where", default="", help="a Hive partition filter")
    p.add_argument("--recursive", action="store_true", help="include subdirectories")
    common(p)


def run(args: argparse.Namespace) -> int:
    db, _, table = args.target.partition(".")
    if not table:
        print(f"hms-cache-proxy {args.command}: give db.table", file=sys.stderr)
        return 2
    try:
        channel, metadata = connect(args)
    except Unusable as exc:
        print(f"hms-cache-proxy {args.command}: {exc}", file=sys.stderr)
        return 2
    stub = pb_grpc.ListingStub(channel)  # type: ignore[no-untyped-call]
    try:
        if args.command == "splits":
            return _splits(stub, metadata, db, table, args)
        return _ls(stub, metadata, db, table, args)
    except grpc.RpcError as exc:
        print(
            f"hms-cache-proxy {args.command}: {exc.code().name}: {exc.details()}", file=sys.stderr
        )
        return 1


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _splits(
    stub: Any, metadata: list[tuple[str, str]], db: str, table: str, args: argparse.Namespace
) -> int:
    plan = stub.PlanSplits(
        pb.PlanSplitsRequest(
            database=db,
            table=table,
            partition_filter=args.where,
            engine=args.engine,
            max_split_size=args.max_split_size,
            max_initial_split_size=args.max_initial_split_size,
            max_initial_splits=args.max_initial_splits,
            max_partition_bytes=args.max_partition_bytes,
            open_cost_in_bytes=args.open_cost,
            spark_parallelism=args.parallelism,
            target_file_size=args.target_file_size,
        ),
        metadata=metadata,
    )
    scope = f" where {args.where}" if args.where else ""
    print(
        f"{args.target}{scope}: {plan.partitions:,} partitions, {plan.files:,} files, "
        f"{_size(plan.bytes)}"
    )
    print(f"{plan.engine} would make {plan.splits:,} splits")
    print("\nfile sizes:")
    for bucket in plan.histogram:
        print(f"  {bucket.label:>11}  {bucket.files:>10,} files  {_size(bucket.bytes):>11}")
    share = plan.small_files / plan.files if plan.files else 0.0
    print(
        f"\nsmall files (under {_size(plan.small_file_threshold)}): {plan.small_files:,} "
        f"({share:.0%})"
    )
    target = args.target_file_size or 128 << 20
    print(
        f"compacting each partition into {_size(target)} files: {plan.compacted_files:,} files, "
        f"{plan.compacted_splits:,} {plan.engine} splits"
    )
    return 0


def _ls(
    stub: Any, metadata: list[tuple[str, str]], db: str, table: str, args: argparse.Namespace
) -> int:
    if args.partition:
        try:
            values = list(parse_partition_name(args.partition)[1])
        except PartitionNameError:
            print(f"hms-cache-proxy ls: not a partition name: {args.partition}", file=sys.stderr)
            return 2
        listings = [
            stub.ListPartitionFiles(
                pb.ListPartitionFilesRequest(
                    database=db, table=table, partition_values=values, recursive=args.recursive
                ),
                metadata=metadata,
            )
        ]
    else:
        listings = stub.ListTableFiles(
            pb.ListTableFilesRequest(
                database=db, table=table, partition_filter=args.where, recursive=args.recursive
            ),
            metadata=metadata,
        ).partitions
    for listing in listings:
        how = "cached" if listing.from_cache else "live"
        state = "sealed" if listing.sealed else "open"
        print(f"# {listing.location} ({state}, {how}, {len(listing.files)} files)")
        if listing.files:
            print(f"{'bytes':>14}  {'modified (UTC)':19}  path")
        for f in listing.files:
            print(f"{f.size:>14,}  {_when(f.modification_time_ms)}  {f.path}")
    return 0


def _when(ms: int) -> str:
    """A file's modification time, as people read it."""
    if ms <= 0:
        return f"{'-':19}"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
