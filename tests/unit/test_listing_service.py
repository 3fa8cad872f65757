"""The listing service in process (a scripted metastore, the embedded store, a real
directory): a transactional table's partitions are never sealed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy import idl
from proxy.admin._gen import listing_pb2 as pb
from proxy.cache.engine import CacheEngine
from proxy.cache.store import MemoryStore
from proxy.listing.seal import transactional
from proxy.listing.service import ListingService
from proxy.metrics import Metrics
from tests.unit.helpers import PLANNER
from tests.unit.inprocess import options

T = idl.module()
OLD = {"transient_lastDdlTime": "1000"}  # altered long ago: sealed under any rule below


class Metastore:
    """get_table, get_partition(s), get_partitions_by_names of one table partitioned by
    ``ds``; ``parameters`` are the table's (a test changes them)."""

    def __init__(self, root: Path, days: tuple[str, ...]) -> None:
        self.root = root
        self.days = days
        self.parameters: dict[str, str] = {}

    def _partition(self, ds: str) -> Any:
        sd = T.StorageDescriptor(location=f"file:{self.root}/ds={ds}")
        return T.Partition(values=[ds], dbName="db", tableName="t", sd=sd, parameters=dict(OLD))

    async def call(self, method: str, **args: Any) -> Any:
        if method == "get_table":
            return T.Table(
                tableName="t",
                dbName="db",
                sd=T.StorageDescriptor(location=f"file:{self.root}"),
                partitionKeys=[T.FieldSchema(name="ds", type="string")],
                parameters=dict(self.parameters),
            )
        if method == "get_partition":
            return self._partition(args["part_vals"][0])
        if method == "get_partitions":
            return [self._partition(ds) for ds in self.days]
        if method == "get_partitions_by_names":
            return [self._partition(name.split("=", 1)[1]) for name in args["names"]]
        raise AssertionError(method)


def service(root: Path, days: tuple[str, ...]) -> tuple[ListingService, Metastore]:
    metastore = Metastore(root, days)
    metrics = Metrics()
    engine = CacheEngine(
        MemoryStore(1 << 22), PLANNER, metrics, l1_bytes=1 << 20, max_entry_bytes=1 << 20
    )
    return ListingService(options(seal_after=0), metastore, engine, metrics), metastore


def write(root: Path, ds: str, name: str) -> None:
    part = root / f"ds={ds}"
    part.mkdir(parents=True, exist_ok=True)
    (part / name).write_bytes(b"x" * 10)


def names(listing: Any) -> list[str]:
    return sorted(Path(f.path).name for f in listing.files)


@pytest.mark.parametrize(
    "parameters",
    [
        {"transactional": "true"},
        {"TRANSACTIONAL": "True"},  # Hive reads the key and the value in any case
        {"transactional": "true", "transactional_properties": "insert_only"},
        {"transactional_properties": "INSERT_ONLY"},  # Hive's insert-only test alone
    ],
)
def test_a_transactional_tables_partitions_are_listed_live(
    tmp_path: Path, parameters: dict[str, str]
) -> None:
    svc, metastore = service(tmp_path, ("2024-01-01",))
    metastore.parameters = parameters
    write(tmp_path, "2024-01-01", "delta_0000001_0000001")

    async def scenario() -> list[Any]:
        first = await svc.table_listings("db", "t", "", False)
        write(tmp_path, "2024-01-01", "delta_0000002_0000002")  # a commit: no metadata change
        second = await svc.table_listings("db", "t", "", False)
        return [first[0], second[0]]

    try:
        first, second = asyncio.run(scenario())
    finally:
        svc.close()
    assert (first.sealed, first.from_cache) == (False, False)
    assert (second.sealed, second.from_cache) == (False, False)
    assert names(second) == ["delta_0000001_0000001", "delta_0000002_0000002"]


def test_a_table_made_transactional_no_longer_gets_its_cached_listings(tmp_path: Path) -> None:
    svc, metastore = service(tmp_path, ("2024-01-01", "2024-01-02"))
    for ds in ("2024-01-01", "2024-01-02"):
        write(tmp_path, ds, "part-0")

    async def scenario() -> list[list[Any]]:
        plain = await svc.table_listings("db", "t", "", False)
        cached = await svc.table_listings("db", "t", "", False)
        # ALTER TABLE SET TBLPROPERTIES ('transactional'='true') bumps no partition's
        # version, so the listings stored while the table was plain are still current.
        metastore.parameters = {"transactional": "true"}
        write(tmp_path, "2024-01-01", "delta_0000001_0000001")
        request = pb.ListPartitionFilesRequest(
            database="db", table="t", partition_values=["2024-01-01"]
        )
        one = await svc.ListPartitionFiles(request, Context())  # type: ignore[arg-type]
        whole = await svc.table_listings("db", "t", "", False)
        return [plain, cached, [one], whole]

    try:
        plain, cached, (one,), whole = asyncio.run(scenario())
    finally:
        svc.close()
    assert [(p.sealed, p.from_cache) for p in plain] == [(True, False)] * 2
    assert [(p.sealed, p.from_cache) for p in cached] == [(True, True)] * 2  # the control
    assert (one.sealed, one.from_cache) == (False, False)
    assert names(one) == ["delta_0000001_0000001", "part-0"]
    assert [(p.sealed, p.from_cache) for p in whole] == [(False, False)] * 2
    assert names(whole[0]) == ["delta_0000001_0000001", "part-0"]


class Context:
    """A gRPC context as the service uses it: a refusal fails the test."""

    async def abort(self, code: Any, message: str) -> None:
        raise AssertionError(f"{code}: {message}")


def test_transactional_parameters() -> None:
    assert transactional({"transactional": "true"})
    assert transactional({"Transactional": " TRUE "})
    assert transactional({"transactional_properties": "insert_only"})
    assert not transactional(None)
    assert not transactional({})
    assert not transactional({"transactional": "false"})
    assert not transactional({"transactional": "false", "transactional_properties": "default"})
    assert not transactional({"transactional_properties": "default"})
