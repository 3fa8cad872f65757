"""The admin API (``idl/admin.proto``): invalidate, flush, statistics, warm-up.

Warm-up sends its calls through the same handler engines use, with a client of its own that
keeps the replies, so what it prefetches is exactly what a Trino query would have cached.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from proxy import idl
from proxy.admin._gen import admin_pb2 as pb
from proxy.admin._gen import admin_pb2_grpc as pb_grpc
from proxy.cache.engine import CacheEngine
from proxy.cache.keys import DatabaseRef, TableRef, partition_name
from proxy.catalog import EVERYTHING_OF_A_TABLE, Scope
from proxy.handler import CallHandler
from proxy.metrics import Metrics
from proxy.own_calls import MetastoreFailure, OwnCalls

log = logging.getLogger(__name__)


class AdminService(pb_grpc.AdminServicer):
    def __init__(
        self,
        handler: CallHandler,
        engine: CacheEngine | None,
        metrics: Metrics,
        follower: Any = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.follower = follower
        self.calls = OwnCalls(handler)
        self.call = self.calls.call

    async def _engine(self, context: grpc.aio.ServicerContext[Any, Any]) -> CacheEngine:
        if self.engine is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "the cache is off (--cache off)"
            )
        assert self.engine is not None
        return self.engine

    # -- rpcs ------------------------------------------------------------------------------

    async def Invalidate(  # noqa: N802 - gRPC's name
        self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.InvalidateReply:
        engine = await self._engine(context)
        if not request.database:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "database is required")
        inv = engine.planner.invalidation()
        database = DatabaseRef.of(request.database)
        if not request.table:
            inv.database(database)
            inv.all_tables_of(database)
            inv.catalog_wide(Scope.DATABASE | Scope.TABLE)
        else:
            table = TableRef.of(request.database, request.table)
            parts = [tuple(p.values) for p in request.partitions]
            if parts:
                inv.table(table, Scope.PARTITIONS | Scope.STATISTICS, parts)
            else:
                inv.table(table, EVERYTHING_OF_A_TABLE, None)
                inv.database(database)
        plan = inv.build()
        try:
            plan = await engine.expand(plan, self._tables_of)
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot list tables: {exc}")
        applied = await engine.invalidate(plan, "admin")
        log.info(
            "admin: invalidated %s.%s (%d scopes)",
            request.database,
            request.table or "*",
            len(plan.bumps),
        )
        if not applied:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the cache store is unavailable; kept pending"
            )
        missing = await self._missing(request.database, request.table)
        if missing:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"{missing} does not exist at the metastore (its cached 'not found' answers, "
                "if any, were dropped)",
            )
        return pb.InvalidateReply(scopes=len(plan.bumps))

    async def _missing(self, db: str, table: str) -> str | None:
        """``db`` or ``db.table`` if the metastore does not have it (unknown: ``None``)."""
        try:
            if table:
                await self.call("get_table", dbname=db, tbl_name=table)
            else:
                await self.call("get_database", name=db)
        except MetastoreFailure as exc:
            if not exc.not_found:
                return None
            return f"{db}.{table}" if table else db
        except RuntimeError:
            return None
        return None

    async def _tables_of(self, db: str) -> list[str]:
        return list(await self.call("get_all_tables", db_name=db))

    async def FlushAll(  # noqa: N802
        self, request: pb.FlushAllRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FlushAllReply:
        engine = await self._engine(context)
        removed = await engine.flush()
        log.info("admin: flushed the cache (%d keys)", removed)
        for scope in ("catalog", "database", "table", "partitions"):
            self.metrics.invalidations.labels(scope, "admin").inc()
        return pb.FlushAllReply(keys_removed=removed)

    async def Stats(  # noqa: N802
        self, request: pb.StatsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.StatsReply:
        counts: dict[str, dict[str, float]] = {}
        partitions: dict[str, float] = {}
        self.metrics.settle()
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == "hmsproxy_cache_lookups_total":
                    method = sample.labels["method"]
                    counts.setdefault(method, {})[sample.labels["result"]] = sample.value
                elif sample.name == "hmsproxy_cache_partitions_total":
                    partitions[sample.labels["result"]] = sample.value
        methods = []
        served = looked = 0.0
        for method, c in sorted(counts.items()):
            hits = c.get("hit", 0) + c.get("negative_hit", 0)
            total = hits + c.get("miss", 0) + c.get("bypass", 0)
            if not total:
                continue
            served += hits
            looked += total
            methods.append(
                pb.MethodStats(
                    method=method,
                    hits=int(c.get("hit", 0)),
                    negative_hits=int(c.get("negative_hit", 0)),
                    misses=int(c.get("miss", 0)),
                    bypasses=int(c.get("bypass", 0)),
                    hit_ratio=hits / total,
                )
            )
        reply = pb.StatsReply(
            methods=methods,
            hit_ratio=served / looked if looked else 0.0,
            partitions_hit=int(partitions.get("hit", 0)),
            partitions_missed=int(partitions.get("miss", 0)),
        )
        if self.engine is not None:
            entries, size, kind = self.engine.footprint()
            reply.entries, reply.bytes, reply.store = entries, size, kind
            reply.store_available = await self.engine.store.ping()
        if self.follower is not None:
            reply.notification_leader = self.follower.state.leader
            reply.last_event_id = self.follower.state.last_applied or 0
        return reply

    async def Warm(  # noqa: N802
        self, request: pb.WarmRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.WarmProgress]:
        await self._engine(context)
        db, name = request.database, request.table
        batch = request.batch_size or 100
        try:
            table = await self.call("get_table", dbname=db, tbl_name=name)
            with contextlib.suppress(LookupError, RuntimeError):  # as Trino asks for it
                m = idl.module()
                capabilities = m.ClientCapabilities([m.ClientCapability.INSERT_ONLY_TABLES])
                await self.call("get_table_req", req=m.GetTableRequest(db, name, capabilities))
            yield pb.WarmProgress(stage="table")
            keys = [k.name for k in table.partitionKeys or []]
            if request.partition_filter:
                found = await self.call(
                    "get_partitions_by_filter",
                    db_name=db,
                    tbl_name=name,
                    filter=request.partition_filter,
                    max_parts=-1,
                )
                names = [partition_name(keys, p.values) for p in found]
            else:
                names = list(
                    await self.call("get_partition_names", db_name=db, tbl_name=name, max_parts=-1)
                )
            yield pb.WarmProgress(stage="names", partitions_total=len(names))
            for start in range(0, len(names), batch):
                chunk = names[start : start + batch]
                await self.call("get_partitions_by_names", db_name=db, tbl_name=name, names=chunk)
                yield pb.WarmProgress(
                    stage="partitions",
                    partitions_total=len(names),
                    partitions_done=min(len(names), start + len(chunk)),
                )
        except MetastoreFailure as exc:  # as the listing API says it (a bad filter, ...)
            await context.abort(exc.status, str(exc))
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        yield pb.WarmProgress(stage="done", partitions_total=len(names), partitions_done=len(names))
