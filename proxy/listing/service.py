"""The listing API (``idl/listing.proto``): partition file listings and split plans.

Metadata comes through the proxy's own call path (so it is cached like an engine's), files
from storage through fsspec. For every partition asked for:

1. its cached listing and its versions are looked up together (one round trip per request);
2. partitions not found cached get their metadata **after** that look-up, so a listing is
   never made from metadata older than the versions it will be stored under;
3. each is listed from storage; the sealed rule (``seal``) decides from its parameters and,
   if a marker file is required, from the names in the directory;
4. sealed ones are stored, unless their partition changed while they were listed.

A transactional table's partitions are never sealed (``seal.transactional``, from the table
object every request fetches first anyway): nothing is looked up or stored for them, since a
listing cached before the table was made transactional would not be invalidated by that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc

from proxy.admin._gen import listing_pb2 as pb
from proxy.admin._gen import listing_pb2_grpc as pb_grpc
from proxy.cache.engine import CacheEngine
from proxy.cache.keys import TableRef, partition_name
from proxy.config import Options
from proxy.listing import splits
from proxy.listing.cache import ListingCache, Looked, Values
from proxy.listing.seal import SealRule, parse_marker, transactional
from proxy.listing.storage import Directory, Storage, StorageError
from proxy.metrics import Metrics
from proxy.own_calls import MetastoreFailure

log = logging.getLogger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Fetch = Callable[[list[Values]], Awaitable[dict[Values, Any]]]
BY_NAMES_BATCH = 500
T = TypeVar("T")


class RequestError(Exception):
    """Refuse the request with this status and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def seal_rule(options: Options) -> SealRule:
    return SealRule(
        seal_after=options.seal_after,
        marker=parse_marker(options.seal_marker) if options.seal_marker else None,
        marker_file=options.seal_marker_file,
    )


class Caller(Protocol):
    """Metastore calls through the proxy's own path (see :mod:`proxy.own_calls`): the
    decoded result, or MetastoreFailure for a declared exception."""

    async def call(self, method: str, **args: Any) -> Any: ...


class ListingService(pb_grpc.ListingServicer):
    def __init__(
        self,
        options: Options,
        metastore: Caller,
        engine: CacheEngine | None,
        metrics: Metrics,
        storage: Storage | None = None,
    ) -> None:
        self.options = options
        self.metastore = metastore
        self.metrics = metrics
        self.rule = seal_rule(options)
        self.storage = storage or Storage(options)
        self.cache = (
            ListingCache(engine.store, engine.naming, options.ttl_listings, repr(self.rule))
            if engine is not None
            else None
        )
        self._limit = asyncio.Semaphore(max(1, options.listing_concurrency))

    def close(self) -> None:
        self.storage.close()

    # -- rpcs ------------------------------------------------------------------------------

    async def ListPartitionFiles(  # noqa: N802 - gRPC's name
        self, request: pb.ListPartitionFilesRequest, context: Context
    ) -> pb.FileListing:
        async def answer() -> pb.FileListing:
            db, name = _names(request.database, request.table)
            table = await self._table(db, name)
            values = tuple(request.partition_values)
            keys = table.partitionKeys or []
            if not keys:
                if values:
                    raise RequestError(
                        grpc.StatusCode.INVALID_ARGUMENT, f"{db}.{name} is not partitioned"
                    )
                return await self._list_open(table.sd.location, request.recursive)
            if len(values) != len(keys):
                raise RequestError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{db}.{name} is partitioned by {len(keys)} column(s); "
                    f"{len(values)} value(s) given",
                )

            async def fetch(wanted: list[Values]) -> dict[Values, Any]:
                part = await self.metastore.call(
                    "get_partition", db_name=db, tbl_name=name, part_vals=list(wanted[0])
                )
                return {wanted[0]: part}

            listings = await self._partitions(
                TableRef.of(db, name),
                [values],
                request.recursive,
                fetch,
                live=transactional(table.parameters),
            )
            return listings[0]

        return await _guarded(answer(), context)

    async def ListTableFiles(  # noqa: N802
        self, request: pb.ListTableFilesRequest, context: Context
    ) -> pb.TableListing:
        async def answer() -> pb.TableListing:
            db, name = _names(request.database, request.table)
            listings = await self.table_listings(
                db, name, request.partition_filter, request.recursive
            )
            return pb.TableListing(partitions=listings)

        return await _guarded(answer(), context)

    async def PlanSplits(  # noqa: N802
        self, request: pb.PlanSplitsRequest, context: Context
    ) -> pb.SplitPlan:
        async def answer() -> pb.SplitPlan:
            db, name = _names(request.database, request.table)
            engine = (request.engine or "trino").lower()
            if engine not in ("trino", "spark"):
                raise RequestError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"engine must be trino or spark, not {engine}"
                )
            listings = await self.table_listings(db, name, request.partition_filter, False)
            result = splits.plan(
                [[f.size for f in listing.files] for listing in listings],
                engine,
                trino=_trino_rules(request),
                spark=_spark_rules(request),
                small_file_threshold=request.small_file_threshold or 32 * splits.MB,
                target_file_size=request.target_file_size or 128 * splits.MB,
            )
            return pb.SplitPlan(
                engine=result.engine,
                splits=result.splits,
                partitions=result.partitions,
                files=result.files,
                bytes=result.bytes,
                histogram=[
                    pb.SizeBucket(label=b.label, files=b.files, bytes=b.bytes)
                    for b in result.histogram
                ],
                small_files=result.small_files,
                small_file_threshold=result.small_file_threshold,
                compacted_files=result.compacted_files,
                compacted_splits=result.compacted_splits,
            )

        return await _guarded(answer(), context)

    # -- the work --------------------------------------------------------------------------

    async def table_listings(
        self, db: str, name: str, partition_filter: str, recursive: bool
    ) -> list[pb.FileListing]:
        table = await self._table(db, name)
        keys = [k.name for k in table.partitionKeys or []]
        if not keys:
            if partition_filter:
                raise RequestError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{db}.{name} is not partitioned"
                )
            return [await self._list_open(table.sd.location, recursive)]
        if partition_filter:
            found = await self.metastore.call(
                "get_partitions_by_filter",
                db_name=db,
                tbl_name=name,
                filter=partition_filter,
                max_parts=-1,
            )
        else:
            found = await self.metastore.call(
                "get_partitions", db_name=db, tbl_name=name, max_parts=-1
            )
        wanted = list(dict.fromkeys(tuple(p.values) for p in found))

        async def fetch(missing: list[Values]) -> dict[Values, Any]:
            got: dict[Values, Any] = {}
            for start in range(0, len(missing), BY_NAMES_BATCH):
                chunk = [
                    partition_name(keys, list(v)) for v in missing[start : start + BY_NAMES_BATCH]
                ]
                for part in await self.metastore.call(
                    "get_partitions_by_names", db_name=db, tbl_name=name, names=chunk
                ):
                    got[tuple(part.values)] = part
            return got

        return await self._partitions(
            TableRef.of(db, name), wanted, recursive, fetch, live=transactional(table.parameters)
        )

    async def _table(self, db: str, name: str) -> Any:
        table = await self.metastore.call("get_table", dbname=db, tbl_name=name)
        if table.sd is None or not table.sd.location:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION, f"{db}.{name} has no location (a view?)"
            )
        return table

    async def _partitions(
        self,
        table: TableRef,
        wanted: Sequence[Values],
        recursive: bool,
        fetch: Fetch,
        *,
        live: bool,
    ) -> list[pb.FileListing]:
        """``live``: the table is transactional, so none of its partitions is sealed."""
        started = time.perf_counter()
        cache = None if live else self.cache
        looked = (
            await cache.lookup(table, wanted, recursive) if cache is not None else Looked({}, None)
        )
        if cache is not None:
            self.metrics.listing_duration.labels("cache").observe(time.perf_counter() - started)
        out: dict[Values, pb.FileListing] = {}
        for values, payload in looked.cached.items():
            listing = pb.FileListing.FromString(payload)
            listing.from_cache = True
            out[values] = listing
            self.metrics.listing_lookups.labels("hit").inc()
            self.metrics.listing_files.labels("cache").inc(len(listing.files))
        missing = [v for v in wanted if v not in looked.cached]
        # Metadata read after the versions were: see the module's docstring.
        parts = await fetch(missing) if missing else {}
        to_store: dict[Values, bytes] = {}
        now = time.time()

        async def one(values: Values, part: Any) -> None:
            location = part.sd.location if part.sd is not None else None
            if not location:
                raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, "partition has no location")
            directory = await self._list(location, recursive)
            sealed = not live and self.rule.sealed(part.parameters, now, set(directory.names))
            listing = _listing(location, values, directory, sealed)
            self.metrics.listing_lookups.labels("miss" if sealed else "open").inc()
            if sealed and looked.versions is not None:
                to_store[values] = listing.SerializeToString()
            out[values] = listing

        await asyncio.gather(*(one(v, parts[v]) for v in missing if v in parts))
        if cache is not None and looked.versions is not None and to_store:
            _, stale = await cache.fill(
                table,
                looked.versions,
                to_store,
                recursive,
                self.options.cache_max_entry_bytes,
            )
            self.metrics.listing_stale_fills.inc(stale)
        return [out[v] for v in wanted if v in out]

    async def _list(self, location: str, recursive: bool) -> Directory:
        async with self._limit:
            started = time.perf_counter()
            try:
                directory = await self.storage.list(location, recursive)
            except StorageError as exc:
                raise RequestError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
            self.metrics.listing_duration.labels("storage").observe(time.perf_counter() - started)
            self.metrics.listing_files.labels("storage").inc(len(directory.files))
            return directory

    async def _list_open(self, location: str, recursive: bool) -> pb.FileListing:
        """An unpartitioned table's directory: nothing marks the end of its writes."""
        directory = await self._list(location, recursive)
        self.metrics.listing_lookups.labels("open").inc()
        return _listing(location, (), directory, False)


def _listing(location: str, values: Values, directory: Directory, sealed: bool) -> pb.FileListing:
    return pb.FileListing(
        location=location,
        partition_values=list(values),
        files=[
            pb.FileInfo(path=f.path, size=f.size, modification_time_ms=f.mtime_ms)
            for f in directory.files
        ],
        from_cache=False,
        sealed=sealed,
    )


def _names(database: str, table: str) -> tuple[str, str]:
    if not database or not table:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "database and table are required")
    return database, table


def _trino_rules(request: pb.PlanSplitsRequest) -> splits.TrinoRules:
    default = splits.TrinoRules()
    return splits.TrinoRules(
        max_initial_splits=request.max_initial_splits or default.max_initial_splits,
        max_initial_split_size=request.max_initial_split_size or default.max_initial_split_size,
        max_split_size=request.max_split_size or default.max_split_size,
    )


def _spark_rules(request: pb.PlanSplitsRequest) -> splits.SparkRules:
    default = splits.SparkRules()
    return splits.SparkRules(
        max_partition_bytes=request.max_partition_bytes or default.max_partition_bytes,
        open_cost_in_bytes=request.open_cost_in_bytes or default.open_cost_in_bytes,
        parallelism=request.spark_parallelism or default.parallelism,
    )


async def _guarded(work: Awaitable[T], context: Context) -> T:
    """Metastore and storage failures as gRPC statuses."""
    try:
        return await work
    except RequestError as exc:
        await context.abort(exc.code, str(exc))
    except MetastoreFailure as exc:
        await context.abort(exc.status, str(exc))
    except RuntimeError as exc:  # the metastore could not be reached
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    raise AssertionError("unreachable: abort raises")
