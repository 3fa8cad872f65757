"""Tables whose partition directories hold real files, and the listing API as a client sees it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import grpc
from hmsclient.genthrift.hive_metastore import ttypes as t

from proxy.admin._gen import listing_pb2 as pb
from proxy.admin._gen import listing_pb2_grpc as pb_grpc
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import ORC, bucketed, client, partition, storage_descriptor, table

Files = set[tuple[str, int, int]]  # (local path, size, modification time in ms)


def create_table(
    host: str,
    port: int,
    db: str,
    name: str,
    location: str,
    partitions: Sequence[str] = (),
    parameters: dict[str, str] | None = None,
    *,
    acid_shape: bool = False,
    table_parameters: dict[str, str] | None = None,
) -> None:
    """A table partitioned by ``ds`` (unpartitioned if ``partitions`` is empty), each
    partition at ``location/ds=<value>``, with ``parameters`` on every partition: external
    and Parquet, or with ``acid_shape`` managed, bucketed and ORC (what the metastore asks
    of a table with ``table_parameters`` ``transactional=true``)."""

    def sd(where: str) -> t.StorageDescriptor:
        if not acid_shape:
            return storage_descriptor(where)
        return bucketed(storage_descriptor(where, stored_as=ORC), "item", 2)

    with client(host, port) as c:
        if db not in c.get_all_databases():
            c.create_database(t.Database(db, "", None, {}))
        keys = ("ds",) if partitions else ()
        kind = "MANAGED_TABLE" if acid_shape else "EXTERNAL_TABLE"
        c.create_table(
            table(db, name, sd(location), keys=keys, parameters=table_parameters, table_type=kind)
        )
        if partitions:
            c.add_partitions(
                [
                    partition(db, name, [ds], sd(f"{location}/ds={ds}"), parameters)
                    for ds in partitions
                ]
            )


def alter_partition(host: str, port: int, db: str, name: str, ds: str, **parameters: str) -> None:
    """Set parameters on a partition (an INSERT does the same to its statistics)."""
    with client(host, port) as c:
        part = c.get_partition(db, name, [ds])
        part.parameters.update(parameters)
        c.alter_partition(db, name, part)


def write(directory: Path, *names: str, size: int = 10) -> None:
    for name in names:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)


def walk(directory: Path, *, recursive: bool) -> Files:
    """The visible files under ``directory``, straight from the filesystem (Hive's rule:
    names starting with ``_`` or ``.`` are hidden, and so is everything under them)."""
    found: Files = set()
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))] if recursive else []
        for f in files:
            if f.startswith(("_", ".")):
                continue
            full = Path(root) / f
            st = full.stat()
            found.add((str(full), st.st_size, int(st.st_mtime * 1000)))
    return found


def local_path(path: str) -> str:
    """``file:/x``, ``file:///x`` -> ``/x`` (the metastore keeps either spelling)."""
    path = path.removeprefix("file:")
    while path.startswith("//"):
        path = path[1:]
    return path


def files_of(listing: pb.FileListing) -> Files:
    return {(local_path(f.path), f.size, f.modification_time_ms) for f in listing.files}


class Listings:
    """The listing API of one proxy."""

    def __init__(self, proxy: ProxyProcess, token: str | None = None) -> None:
        self.proxy = proxy
        channel = grpc.insecure_channel(f"127.0.0.1:{proxy.admin_port}")
        self.stub = pb_grpc.ListingStub(channel)  # type: ignore[no-untyped-call]
        self.metadata = [("authorization", f"Bearer {token}")] if token else []

    def partition(
        self, db: str, table: str, *values: str, recursive: bool = False
    ) -> pb.FileListing:
        request = pb.ListPartitionFilesRequest(
            database=db, table=table, partition_values=list(values), recursive=recursive
        )
        return self.stub.ListPartitionFiles(request, metadata=self.metadata, timeout=60)

    def table(
        self, db: str, table: str, where: str = "", *, recursive: bool = False
    ) -> list[pb.FileListing]:
        request = pb.ListTableFilesRequest(
            database=db, table=table, partition_filter=where, recursive=recursive
        )
        return list(
            self.stub.ListTableFiles(request, metadata=self.metadata, timeout=60).partitions
        )

    def splits(self, db: str, table: str, **fields: object) -> pb.SplitPlan:
        request = pb.PlanSplitsRequest(database=db, table=table, **fields)  # type: ignore[arg-type]
        return self.stub.PlanSplits(request, metadata=self.metadata, timeout=120)

    def lookups(self, result: str) -> float:
        return self.proxy.metric("hmsproxy_listing_lookups_total", result=result)
