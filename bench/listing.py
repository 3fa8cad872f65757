"""Cached vs live listing of one partition directory of 10,000 files, in one run.

    .venv/bin/python -m bench.listing [--files 10000] [--runs 50] [--s3]

Two partitions of one table point at the same directory: one carries the seal marker (its
listing is cached, in Redis), the other does not (listed from storage on every call). Both
are asked for through ListPartitionFiles, alternately, on the real HMS, a real Redis, and
the local filesystem; with ``--s3``, also on a local S3-compatible server (moto), which
pages a listing 1,000 objects at a time as S3 does.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import BENCH_DB, p50, percentile, start_metastore
from tests.rig.listing import Listings, create_table
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.rig.sample import client

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench"
SIZE = 500 * 1024


def local_directory(files: int) -> Path:
    """``files`` files of 500 KB (sparse: no disk used), made once."""
    directory = DATA / f"listing-{files}"
    if not (directory / ".done").exists():
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            with open(directory / f"part-{i:05d}-c000.snappy.parquet", "wb") as f:
                f.truncate(SIZE)
        (directory / ".done").touch()
    return directory


def ensure_table(hms_host: str, hms_port: int, name: str, location: str) -> None:
    """``bench.<name>``: partitions ``sealed`` (with the marker) and ``open``, both at
    ``location``."""
    with client(hms_host, hms_port) as c:
        if BENCH_DB in c.get_all_databases() and name in c.get_all_tables(BENCH_DB):
            c.drop_table(BENCH_DB, name, False)
    create_table(hms_host, hms_port, BENCH_DB, name, location, ("sealed", "open"))
    with client(hms_host, hms_port) as c:
        for ds, params in (("sealed", {"sealed": "true"}), ("open", {})):
            part = c.get_partition(BENCH_DB, name, [ds])
            part.sd.location = location
            part.parameters.update(params)
            c.alter_partition(BENCH_DB, name, part)


def compare(api: Listings, table: str, runs: int) -> tuple[list[float], list[float], int]:
    def timed(ds: str) -> Callable[[], tuple[float, int, bool]]:
        def run() -> tuple[float, int, bool]:
            started = time.perf_counter()
            listing = api.partition(BENCH_DB, table, ds)
            return time.perf_counter() - started, len(listing.files), listing.from_cache

        return run

    sealed, live = timed("sealed"), timed("open")
    _, files, _ = sealed()  # fills the cache
    cached_times, live_times = [], []
    for i in range(runs):
        for which, out in ((sealed, cached_times), (live, live_times))[:: 1 if i % 2 else -1]:
            seconds, count, from_cache = which()
            assert count == files and from_cache == (which is sealed)
            out.append(seconds)
    return cached_times, live_times, files


def report(label: str, cached: list[float], live: list[float], files: int) -> None:
    print(
        f"| {label} | {files:,} | {p50(live) * 1000:.1f} | {p50(cached) * 1000:.1f} | "
        f"{p50(live) / p50(cached):.1f}x | {percentile(live, 0.99) * 1000:.1f} | "
        f"{percentile(cached, 0.99) * 1000:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--s3", action="store_true", help="also on a local S3 server (moto)")
    args = parser.parse_args()

    hms = start_metastore(DATA)
    redis_server = RedisServer(DATA / "redis")
    s3 = S3Server(DATA / "s3") if args.s3 else None
    proxy = None
    try:
        redis_server.start()
        directory = local_directory(args.files)
        ensure_table(hms.host, hms.port, "listing_local", f"file:{directory}")
        extra = ["--redis", redis_server.url, "--seal-marker", "sealed=true"]
        extra += ["--log-level", "warning"]
        if s3 is not None:
            s3.start()
            objects = s3.client()
            objects.create_bucket(Bucket="bench")
            for i in range(args.files):
                objects.put_object(Bucket="bench", Key=f"dir/part-{i:05d}", Body=b"x")
            ensure_table(hms.host, hms.port, "listing_s3", "s3a://bench/dir")
            extra += ["--s3-endpoint-url", s3.endpoint, "--s3-region", REGION]
            extra += ["--s3-access-key", ACCESS_KEY, "--s3-secret-key", SECRET_KEY]
        proxy = ProxyProcess(DATA, hms.uri, *extra).start()
        api = Listings(proxy)

        scans = []
        for _ in range(args.runs):
            started = time.perf_counter()
            with os.scandir(directory) as entries:
                for entry in entries:
                    entry.stat()
            scans.append(time.perf_counter() - started)

        print(
            "\n| storage | files | live p50 ms | cached p50 ms | cached speed-up"
            " | live p99 ms | cached p99 ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        report("local filesystem", *compare(api, "listing_local", args.runs))
        if s3 is not None:
            report("S3 API (moto, local)", *compare(api, "listing_s3", max(5, args.runs // 5)))
        print(
            f"\nfloor: os.scandir + stat of the same {args.files:,} files in this process, "
            f"p50 {p50(scans) * 1000:.1f} ms"
        )
    finally:
        if proxy is not None:
            proxy.stop()
        if s3 is not None:
            s3.stop()
        redis_server.stop()
        hms.stop()


if __name__ == "__main__":
    main()
