"""What a write does to the cache: fence before, invalidate after, never lose one.

1. **Before a write is forwarded** its scopes are fenced (a deadline on each version hash it
   changes, which stops every proxy from serving or filling them) and already bumped (which
   kills what was filled before). So if this proxy dies mid-write, nobody serves pre-write
   data: not before the deadline (fenced), not after it (bumped).
2. **After the HMS answered and before the writer gets the answer** the scopes are bumped
   again (for fills made before the fence was seen) and the fence is lifted.
3. **An invalidation the store did not take is kept pending**, and this proxy serves no hit
   until it has been applied: the writer never reads its own write stale through it.
   Beyond :data:`MAX_PENDING`, one flush stands for them all. It is retried in the
   background at once, with a short backoff (a look-up retries it too): a store that
   failed under load is usually back within milliseconds, and until then this proxy sends
   every read to the metastore.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from proxy.cache.dictionaries import Dictionaries
from proxy.cache.keys import DEFAULT_CATALOG, EPOCH, Naming, TableRef, hms_identifier
from proxy.cache.l1 import L1
from proxy.cache.plan import FLUSH, Bump, WritePlan
from proxy.cache.store import CacheUnavailable, Store
from proxy.metrics import Metrics
from proxy.retry import Backoff
from proxy.tasks import background

log = logging.getLogger(__name__)

# Invalidations kept while the store is away, at most; beyond, one flush stands for them all.
MAX_PENDING = 1_000


def retry_backoff() -> Backoff:
    """Between attempts at pending invalidations: from 50 ms, at most a second (a store down
    for longer has its own breaker; each attempt past it costs nothing)."""
    return Backoff(base=0.05, cap=1.0)


@dataclass(frozen=True, slots=True)
class WriteIntent:
    """A write in progress: its fence id, and the granted lock fences it ends."""

    id: str
    ends: tuple[tuple[str, str], ...] = ()


class Changes(Protocol):
    """Where invalidations are shown (the status page)."""

    def invalidated(
        self, reason: str, scopes: Iterable[str], tables: Iterable[TableRef], everything: bool
    ) -> None: ...


class Invalidations:
    def __init__(
        self,
        store: Store,
        naming: Naming,
        metrics: Metrics,
        dictionaries: Dictionaries,
        l1: L1 | None,
        *,
        write_fence: float,
        changes: Changes | None,
    ) -> None:
        self.store = store
        self.naming = naming
        self.metrics = metrics
        self.dictionaries = dictionaries
        self.l1 = l1
        self.write_fence = write_fence
        self.changes = changes
        self.writes = 0  # invalidations for writes through this proxy (the follower watches)
        # Invalidations the store did not take yet, with the fence each lifts (if any).
        self.pending: list[tuple[WritePlan, WriteIntent | None]] = []
        self.retry_backoff = retry_backoff
        self._retrying: asyncio.Task[None] | None = None
        self._applying = False  # a look-up or the retry is applying the pending ones

    async def settled(self) -> bool:
        """Whether no invalidation is pending (applying those that are, if it can: one
        applier at a time, or every look-up would send the same commands to a Redis that
        is struggling already)."""
        if not self.pending:
            return True
        if self._applying:
            return False
        self._applying = True
        try:
            return await self._apply_pending()
        finally:
            self._applying = False

    async def expand(
        self, plan: WritePlan, list_tables: Callable[[str], Awaitable[list[str]]]
    ) -> WritePlan:
        """Add every table of the databases a write drops (asked from the HMS, before the
        write: afterwards there is nothing left to ask)."""
        if not plan.databases_dropped:
            return plan
        bumps = list(plan.bumps)
        for database in plan.databases_dropped:
            name = (
                database.db
                if database.catalog == DEFAULT_CATALOG
                else f"@{database.catalog}#{database.db}"
            )
            try:
                tables = await list_tables(name)
            except Exception:
                log.warning(
                    "cache: cannot list tables of %s before dropping it; flushing", database.db
                )
                return FLUSH
            for table in tables:
                tag = TableRef(database.catalog, database.db, hms_identifier(table)).tag
                bumps.append(Bump(self.naming.versions(tag), EPOCH, "table"))
        return WritePlan(tuple(bumps), plan.databases_dropped, plan.flush_all, plan.tables)

    async def begin(self, plan: WritePlan) -> WriteIntent | None:
        """Before a write is forwarded: fence what it changes, and invalidate it already.

        An alter or drop of a table also ends the fences of granted locks on it (see
        :mod:`proxy.cache.locks`): the ones found now are lifted by :meth:`end`.
        """
        if plan.empty or plan.flush_all or self.write_fence <= 0:
            return None
        intent = os.urandom(8).hex()
        keys = sorted({b.key for b in plan.bumps} | set(plan.ends_locks))
        self._forget_locally(plan)
        # A fence that failed is not known to be in place, nor known not to be (a timeout does
        # not tell): the intent is kept all the same, so that end() lifts it if it is, rather
        # than leaving the table fenced, its reads all sent to the metastore, until the
        # fence's deadline.
        # A fence Redis refuses while it serves reads is retried until no proxy trusts what
        # it reads there (store.insist): only then may the write go ahead without it.
        granted: dict[str, list[str]] = {}
        with contextlib.suppress(CacheUnavailable):
            granted = await self.store.insist(
                lambda: self.store.fence(keys, intent, self.write_fence, plan.bumps)
            )
        ends = tuple((key, name) for key in plan.ends_locks for name in granted.get(key, ()))
        return WriteIntent(intent, ends)

    async def end(self, plan: WritePlan, intent: WriteIntent | None) -> bool:
        """After the write: invalidate again (for fills made before the fence was seen),
        then lift the fence."""
        if intent is None or plan.flush_all:
            return await self.invalidate(plan, "write")
        if self.pending:
            self._keep(plan, intent)
            return await self._apply_pending()
        try:
            await self._apply(plan, intent)
        except CacheUnavailable:
            log.warning("cache: could not apply an invalidation; no cache hits until it is")
            self._keep(plan, intent)
            return False
        self._count(plan, "write")
        self._count_lock_ends(intent)
        return True

    async def invalidate(self, plan: WritePlan, reason: str) -> bool:
        """Apply ``plan`` now, or keep it pending (and bypass the cache) until possible."""
        if plan.empty:
            return True
        self._forget_locally(plan)
        if self.pending:
            self.keep_pending(plan, None)
            return await self._apply_pending()
        try:
            await self._apply(plan)
        except CacheUnavailable:
            log.warning("cache: could not apply an invalidation; no cache hits until it is")
            self.keep_pending(plan, None)
            return False
        self._count(plan, reason)
        return True

    def defer(self, bumps: tuple[Bump, ...]) -> None:
        """An invalidation the store did not take: pending, so this proxy serves no hits."""
        self.keep_pending(WritePlan(bumps), None)

    def keep_pending(self, plan: WritePlan, intent: WriteIntent | None) -> None:
        if any(p == plan and i == intent for p, i in self.pending):  # once is enough
            return
        if len(self.pending) >= MAX_PENDING:
            # A long outage with writes going on: rather than keep every one, forget
            # everything once the store is back (the write fences lapse by their deadlines).
            log.warning(
                "cache: %d invalidations pending; the cache is flushed once the store "
                "answers again",
                len(self.pending),
            )
            self.pending = [(FLUSH, None)]
            return
        self._keep(plan, intent)

    def _keep(self, plan: WritePlan, intent: WriteIntent | None) -> None:
        self.pending.append((plan, intent))
        if self._retrying is None or self._retrying.done():
            self._retrying = background(self._retry_pending(), "retrying pending invalidations")

    async def _retry_pending(self) -> None:
        """Apply the pending invalidations, retrying with backoff until none is left."""
        backoff = self.retry_backoff()
        while self.pending:
            await asyncio.sleep(backoff.failed())
            if await self.settled():
                return

    def _forget_locally(self, plan: WritePlan) -> None:
        if plan.flush_all and self.l1 is not None:
            self.l1.clear()
        for table in plan.tables:
            self.dictionaries.forget_table(table.tag)

    async def _apply(self, plan: WritePlan, fence: WriteIntent | None = None) -> None:
        """The plan's invalidation; with ``fence``, that write's fence is lifted after it."""
        if plan.flush_all:
            await self.store.flush(self.naming.pattern)
        elif fence is not None:
            keys = sorted({b.key for b in plan.bumps} | set(plan.ends_locks))
            await self.store.unfence(keys, fence.id, plan.bumps, fence.ends)
        else:
            await self.store.bump(plan.bumps)

    async def _apply_pending(self) -> bool:
        while self.pending:
            oldest = self.pending[0]
            try:
                await self._apply(*oldest)
            except CacheUnavailable:
                return False
            # Others may apply pending invalidations meanwhile (look-ups, the retry): what
            # is removed is the one applied here, not whichever is first by now.
            place = next((i for i, entry in enumerate(self.pending) if entry is oldest), None)
            if place is None:
                continue  # applied and counted by another meanwhile
            del self.pending[place]
            plan, intent = oldest
            self._count(plan, "write")
            self._count_lock_ends(intent)
        log.info("cache: pending invalidations applied; serving hits again")
        return True

    def _count_lock_ends(self, intent: WriteIntent | None) -> None:
        ended = {n.split(":")[1] for _, n in intent.ends} if intent is not None else set()
        if ended:
            self.metrics.lock_fences.labels("closed").inc(len(ended))

    def _count(self, plan: WritePlan, reason: str) -> None:
        if reason == "write":
            self.writes += 1
        if plan.flush_all:
            for scope in ("catalog", "database", "table", "partitions"):
                self.metrics.invalidations.labels(scope, reason).inc()
        for b in plan.bumps:
            self.metrics.invalidations.labels(b.scope, reason).inc()
        if self.changes is not None and (plan.bumps or plan.flush_all):
            self.changes.invalidated(
                reason, (b.scope for b in plan.bumps), plan.tables, plan.flush_all
            )
