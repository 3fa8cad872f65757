"""File listings of what a real Spark INSERT wrote: equal to a walk of the directories, cached
when sealed, live when open, fresh after another INSERT through the proxy or straight at the
metastore (seen by the notification follower)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from subprocess import Popen

import pytest

from tests.conftest import ProxyFactory
from tests.rig import spark
from tests.rig.hms import MetastoreServer
from tests.rig.listing import Listings, alter_partition, files_of, local_path, walk
from tests.rig.waiting import wait_for_follower

pytestmark = pytest.mark.hms

DB = "spark_listing"
DAYS = ("2024-05-01", "2024-05-02", "2024-05-03")


def steps(uri: str, warehouse: Path, *sql: str) -> AbstractContextManager[Popen[str]]:
    """Spark running ``sql`` (see spark_steps.py) against the metastore at ``uri``."""
    return spark.running("spark_steps", uri, warehouse.as_uri(), *sql)


def finish(job: Popen[str]) -> None:
    assert "DONE" in spark.finish(job, timeout=300)


def insert(ds: str, row: int) -> str:
    return f"INSERT INTO {DB}.events PARTITION (ds='{ds}') VALUES ({row}, 'more')"


@pytest.mark.spark
def test_listings_of_files_spark_wrote(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    # Sealed by a marker parameter only: the partitions are seconds old, and a Spark INSERT
    # keeps a partition's parameters, so only invalidation can make a listing fresh.
    proxy = proxy_factory("--seal-marker", "sealed=true", "--ttl-listings", "3600")
    api = Listings(proxy)
    go = tmp_path / "go"
    rows = ", ".join(f"({i}, 'x', '{ds}')" for i, ds in enumerate(DAYS * 2))
    with steps(
        f"thrift://127.0.0.1:{proxy.port}",
        hms.warehouse,
        f"CREATE DATABASE {DB}",
        f"CREATE TABLE {DB}.events (id INT, v STRING) PARTITIONED BY (ds STRING) "
        "STORED AS TEXTFILE",
        f"INSERT INTO {DB}.events PARTITION (ds) VALUES {rows}",
        f"wait:{go}",
        insert(DAYS[0], 100),
    ) as job:
        spark.wait_ready(job)
        for ds in (DAYS[0], DAYS[2]):
            alter_partition("127.0.0.1", proxy.port, DB, "events", ds, sealed="true")
        wait_for_follower(hms, proxy)  # those writes' own events, applied before filling

        first = api.table(DB, "events")
        assert [list(p.partition_values) for p in first] == [[d] for d in DAYS]
        for listing in first:
            assert listing.files, "Spark wrote no files?"
            assert files_of(listing) == walk(Path(local_path(listing.location)), recursive=False)
        assert [p.sealed for p in first] == [True, False, True]
        assert not any(p.from_cache for p in first)
        second = api.table(DB, "events")
        assert [p.from_cache for p in second] == [True, False, True]  # open: live every time
        assert [list(p.files) for p in second] == [list(p.files) for p in first]
        plan = api.splits(DB, "events")
        assert plan.files == sum(len(p.files) for p in first) and plan.splits == plan.files

        go.touch()  # Spark inserts into the sealed DAYS[0], through the proxy
        finish(job)
    fresh = api.partition(DB, "events", DAYS[0])
    assert not fresh.from_cache and fresh.sealed
    assert len(fresh.files) == len(first[0].files) + 1
    assert files_of(fresh) == walk(Path(local_path(fresh.location)), recursive=False)

    # Straight at the metastore, into the other sealed partition: the follower sees it.
    with steps(hms.uri, hms.warehouse, insert(DAYS[2], 300)) as job:
        finish(job)
    wait_for_follower(hms, proxy)
    fresh = api.partition(DB, "events", DAYS[2])
    assert not fresh.from_cache
    assert len(fresh.files) == len(first[2].files) + 1
    assert files_of(fresh) == walk(Path(local_path(fresh.location)), recursive=False)
    assert api.partition(DB, "events", DAYS[2]).from_cache
