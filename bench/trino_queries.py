"""What a Trino user feels: Trino 476 planning and running queries over tables of 10,000
partitions, pointed at the metastore directly (its own metastore cache off, and on) and at the
proxy (its cache warm), in one run, side by side.

    .venv/bin/python -m bench.trino_queries [--partitions 10000] [--rounds 5]

One real metastore (2.3.10, Derby, kept under .rig/bench-trino so the tables are built once),
one proxy (embedded store), one Trino with three catalogs on the same tables: ``direct``
(``hive.metastore-cache-ttl=0s``, docs/engines.md's recommendation behind the proxy),
``direct_cached`` (Trino's own cache on, 1 h: every warm query answered inside Trino) and
``proxied`` (cache off, metastore URI the proxy).

What is measured is the metastore's part of a query, so the files are kept out of it: every
partition of both tables points at one folder of the local S3 server (moto) that holds one
empty file. Each query still plans every partition it selects (``get_partition_names_ps``,
then ``get_partitions_by_names`` in batches, and their statistics) and lists each one's
folder, which Trino's file status cache (on for every catalog alike) answers after the first
listing; an empty file makes no split. With files in the partitions, the rig's S3 server
(a Python process) dominates: 6,000 one-row files took 57 s to scan through every path.

The queries: ``count(*)`` over 6,000 of a table's partitions, and a join of two such tables on
the partition column. Each catalog answers each query once to warm up, then the rounds take the
catalogs in turn (a different order each round). Printed: the median wall time (the client's,
submit to last page), Trino's own planning time (``queryStats.planningTime``: the table, the
partition names and their pruning; the partition objects are fetched while splits are made,
within the wall time) and the ratio of each to ``direct``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import time

from hmsclient.genthrift.hive_metastore import ttypes as t

from tests.rig import machine
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.rig.sample import TEXT, client, storage_descriptor
from tests.rig.trino import TrinoServer, hive_catalog, s3_files

DATA = machine.RIG_DIR / "bench-trino"
DB = "bench_trino_shared"
# Every partition's location: one folder with one empty file (see the module docstring).
SHARED = "shared"
TABLES = ("a", "b")
BUCKET = "bench-trino"
BATCH = 500
COLUMNS = (("id", "bigint"),)

CATALOGS = ("direct", "direct_cached", "proxied")
# Listings kept by Trino alike in every catalog: the metastore's part is what differs.
FILE_STATUS_CACHE = {
    "hive.file-status-cache-tables": f"{DB}.*",
    "hive.file-status-cache-expire-time": "1h",
}
TRINO_CACHE_ON = {
    "hive.metastore-cache-ttl": "1h",
    "hive.metastore-stats-cache-ttl": "1h",
    "hive.metastore-cache-maximum-size": "100000",
}


def day(i: int) -> str:
    return f"d{i:05d}"


def ensure_tables(hms: MetastoreServer, partitions: int) -> None:
    """``bench_trino.a`` and ``.b``: ``partitions`` partitions each, by ``ds``, one bigint
    column, text files under ``s3://bench-trino/<table>/ds=<day>``."""
    with client(hms.host, hms.port) as c:
        if DB not in c.get_all_databases():
            c.create_database(t.Database(DB, "", f"s3://{BUCKET}/", {}))
        for name in TABLES:
            base = f"s3://{BUCKET}/{name}"
            if name not in c.get_all_tables(DB):
                c.create_table(
                    t.Table(
                        tableName=name,
                        dbName=DB,
                        owner="bench",
                        sd=storage_descriptor(base, COLUMNS, t, TEXT),
                        partitionKeys=[t.FieldSchema("ds", "string", None)],
                        parameters={},
                        tableType="EXTERNAL_TABLE",
                    )
                )
            have = len(c.get_partition_names(DB, name, -1))
            for first in range(have, partitions, BATCH):
                batch = range(first, min(partitions, first + BATCH))
                c.add_partitions(
                    [
                        t.Partition(
                            values=[day(i)],
                            dbName=DB,
                            tableName=name,
                            sd=storage_descriptor(f"s3://{BUCKET}/{SHARED}", COLUMNS, t, TEXT),
                            parameters={},
                        )
                        for i in batch
                    ]
                )


def ensure_objects(s3: S3Server) -> None:
    """The one folder every partition points at, holding one empty file (moto keeps nothing
    between runs)."""
    objects = s3.client()
    objects.create_bucket(Bucket=BUCKET)
    objects.put_object(Bucket=BUCKET, Key=f"{SHARED}/empty", Body=b"")


def seconds(duration: str) -> float:
    """An airlift Duration as Trino prints it (``12.34ms``, ``1.20s``, ``2.00m``)."""
    found = re.fullmatch(r"([\d.]+)(ns|us|ms|s|m|h|d)", duration)
    if found is None:
        raise ValueError(f"not a duration: {duration!r}")
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    return float(found.group(1)) * scale[found.group(2)]


def queries(partitions: int) -> dict[str, str]:
    low, high = day(partitions // 5), day(partitions // 5 + partitions * 3 // 5 - 1)
    return {
        f"count(*), {partitions * 3 // 5:,} partitions": (
            f"SELECT count(*) FROM {{c}}.{DB}.a WHERE ds BETWEEN '{low}' AND '{high}'"
        ),
        f"join of two tables, {partitions * 3 // 5:,} partitions each": (
            f"SELECT count(*) FROM {{c}}.{DB}.a x JOIN {{c}}.{DB}.b y "
            f"ON x.ds = y.ds AND x.id = y.id "
            f"WHERE x.ds BETWEEN '{low}' AND '{high}' AND y.ds BETWEEN '{low}' AND '{high}'"
        ),
    }


def measure(trino: TrinoServer, sql: str, catalog: str) -> tuple[float, float]:
    """(wall seconds, Trino's planning seconds) of one run of ``sql`` in ``catalog``."""
    started = time.perf_counter()
    result = trino.query(sql.format(c=catalog), timeout=900)
    wall = time.perf_counter() - started
    stats = trino.query_info(result.query_id)["queryStats"]
    return wall, seconds(stats["planningTime"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    DATA.mkdir(parents=True, exist_ok=True)
    hms = MetastoreServer(DATA / "hms")
    s3 = S3Server(DATA / "s3")
    proxy: ProxyProcess | None = None
    trino: TrinoServer | None = None
    try:
        hms.start()
        s3.start()
        built = time.monotonic()
        ensure_tables(hms, args.partitions)
        ensure_objects(s3)
        print(f"tables ready in {time.monotonic() - built:.0f} s")
        proxy = ProxyProcess(
            DATA / "proxy",
            hms.uri,
            "--log-level", "warning",
            "--memory-cache-bytes", "1GiB",
            # Warm means warm: nothing expires during the run, however slow the machine.
            "--ttl-table", "3600", "--ttl-partitions", "3600",
        )  # fmt: skip
        proxy.start()
        proxy_uri = f"thrift://127.0.0.1:{proxy.port}"
        files = s3_files(s3.endpoint, ACCESS_KEY, SECRET_KEY, REGION) | FILE_STATUS_CACHE
        shutil.rmtree(DATA / "trino", ignore_errors=True)  # a fresh server each run
        trino = TrinoServer(
            DATA / "trino",
            {
                "direct": hive_catalog(hms.uri, files),
                "direct_cached": hive_catalog(hms.uri, files, **TRINO_CACHE_ON),
                "proxied": hive_catalog(proxy_uri, files),
            },
            heap="2G",
            query_memory="512MB",
        )
        trino.start()  # assigned first: a start that times out is stopped below
        print(f"Trino 476 started in {trino.started_in:.0f} s")
        for name, sql in queries(args.partitions).items():
            for catalog in CATALOGS:
                measure(trino, sql, catalog)  # warm-up: listings, the proxy's cache, Trino's
            walls: dict[str, list[float]] = {c: [] for c in CATALOGS}
            plans: dict[str, list[float]] = {c: [] for c in CATALOGS}
            for round_ in range(args.rounds):
                order = CATALOGS[round_ % 3 :] + CATALOGS[: round_ % 3]
                for catalog in order:
                    wall, plan = measure(trino, sql, catalog)
                    walls[catalog].append(wall)
                    plans[catalog].append(plan)
            print(f"\n{name} (median of {args.rounds} warm runs)")
            print(f"  {'catalog':<15}{'wall':>9}{'/direct':>9}{'planning':>10}{'/direct':>9}")
            base_wall = statistics.median(walls["direct"])
            base_plan = statistics.median(plans["direct"])
            for catalog in CATALOGS:
                wall = statistics.median(walls[catalog])
                plan = statistics.median(plans[catalog])
                print(
                    f"  {catalog:<15}{wall:>8.2f}s{wall / base_wall:>8.2f}x"
                    f"{plan:>9.2f}s{plan / base_plan:>8.2f}x"
                )
    finally:
        for part in (trino, proxy, s3, hms):
            if part is not None:
                part.stop()


if __name__ == "__main__":
    main()
