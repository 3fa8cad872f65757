"""The cache as the request path sees it: plan a call, read through, invalidate a write.

The pieces, one thing each:

* :mod:`.planner` says what a call reads or changes (pure); the request path keeps the plans
  it made with the calls it knows (proxy.handler.known_calls);
* :mod:`.decide` says whether what was found may be served (pure);
* :mod:`.reads` and :mod:`.partition_reads` run the read-through (look-up, single flight,
  fill, stale-if-error) for whole replies and for ``get_partitions_by_names``;
* :mod:`.writes` fences and invalidates around writes and keeps what the store did not take;
* :mod:`.fences` fences tables while HMS locks on them are held (Iceberg's commit check);
* :mod:`.l1` and :mod:`.dictionaries` are the in-process copies.

Rules the engine keeps, whatever the store:

1. **A hit is an entry whose fingerprint equals the fingerprint of the current versions**
   of every scope its plan depends on. Versions are read from the store on every look-up,
   so a write through any proxy sharing the store is seen by the next read everywhere.
2. **A fill uses the versions read before its upstream call started.**
3. **A write invalidates after the HMS answered and before the writer gets the answer.**
4. **Concurrent misses of one key and one fingerprint share one upstream call.**
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from proxy import idl
from proxy.cache import assembled
from proxy.cache.decide import Result, Verdict, fingerprints_footprint
from proxy.cache.dictionaries import Dictionaries
from proxy.cache.fences import LockFences
from proxy.cache.hit_counts import HitCount, HitCounts
from proxy.cache.l1 import L1, Item
from proxy.cache.partition_reads import AssembledHit, PartitionReads
from proxy.cache.plan import ReadPlan, WritePlan
from proxy.cache.planner import Planner
from proxy.cache.reads import Pending, ReadCall, Seen, Served, WholeReads
from proxy.cache.sampling import Sampler
from proxy.cache.store import MemoryStore, Standing, Store
from proxy.cache.writes import MAX_PENDING, Changes, Invalidations, WriteIntent
from proxy.catalog import MethodSpec
from proxy.memo import Footprint, footprint_of
from proxy.metrics import Metrics, method_label
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

__all__ = ["MAX_PENDING", "CacheEngine", "Result", "Verdict", "WriteIntent"]


@dataclass(frozen=True, slots=True)
class ServedAgain:
    """What serving a hit judged before needs, outside the engine (proxy.handler.again):
    whether the store is trusted (``standing``; the item's scope says the rest), whether
    an invalidation is ``pending``, whether the freshness check wants a hit (``sampler``),
    where the hits are counted (``count``) and how the entry keeps its LRU place
    (``touch``). The engine's own parts, handed out as one value."""

    standing: Standing
    pending: Pending
    sampler: Sampler
    count: Callable[[HitCount, int], None]
    touch: Callable[[str], None]


class Activity(Seen, Changes, Protocol):
    """What the status page is told: look-ups and invalidations."""


class CacheEngine:
    def __init__(
        self,
        store: Store,
        planner: Planner,
        metrics: Metrics,
        *,
        l1_bytes: int,
        max_entry_bytes: int,
        write_fence: float = 60.0,
        lock_fence: float = 300.0,
        stale_window: float = 0.0,
        activity: Activity | None = None,
        serve_iceberg: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.planner = planner
        self.naming = planner.naming
        self.metrics = metrics
        self.max_entry_bytes = max_entry_bytes
        # Whether Iceberg table objects may be served from the cache now (--cache-iceberg-
        # tables; in auto, while the notification log is followed).
        self.serve_iceberg = serve_iceberg
        # Decoded replies kept in process: in front of a shared store, its whole budget; in
        # front of the embedded store (whose entries are in process, but encoded: a decode
        # and a copy on every hit), an eighth of it, for the hottest entries.
        self.l1 = L1(l1_bytes if store.compress else l1_bytes // 8, store.standing.scopes)
        self.dictionaries = Dictionaries(store, self.naming)
        self.invalidations = Invalidations(
            store,
            self.naming,
            metrics,
            self.dictionaries,
            self.l1,
            write_fence=write_fence,
            changes=activity,
        )
        # Hits answered at once are counted in one place (see .hit_counts).
        self.hits = HitCounts(metrics, store, activity)
        self.whole = WholeReads(
            store,
            metrics,
            self.dictionaries,
            self.l1,
            pending=self.invalidations,
            # Asked through the engine: app.py sets the policy after the engine is built.
            serve_iceberg=lambda: self.serve_iceberg(),
            max_entry_bytes=max_entry_bytes,
            stale_window=stale_window,
            hits=self.hits,
        )
        self.partitions = PartitionReads(
            store,
            self.naming,
            metrics,
            self.dictionaries,
            self.l1,
            pending=self.invalidations,
            dictionary_ttl=planner.ttls.longest * 2 + 60,
            whole=self.whole,
        )
        self.locks = LockFences(store, self.naming, metrics, lock_fence, self.invalidations.defer)
        # Hits for the freshness check (proxy.freshness), when it wants one: the hits that
        # need no await decline while it does (see proxy.cache.sampling).
        self.freshness = Sampler()
        touch = self.l1.touch if self.l1 is not None else _untouched
        self.served_again = ServedAgain(
            store.standing, self.invalidations, self.freshness, self.hits.count, touch
        )
        # The write side, as the request path, the follower and the admin service call it.
        self.expand = self.invalidations.expand
        self.begin_write = self.invalidations.begin
        self.end_write = self.invalidations.end
        self.invalidate = self.invalidations.invalidate
        # The read side's steps, for tests and tools that look without serving.
        self.lookup = self.whole.lookup
        self.fill = self.whole.fill
        self.fill_fingerprint = self.whole.fill_fingerprint
        self.lookup_partitions = self.partitions.lookup

    @property
    def writes(self) -> int:
        """Invalidations for writes through this proxy (the follower watches)."""
        return self.invalidations.writes

    # -- plans -----------------------------------------------------------------------------

    def plan_read(
        self, spec: MethodSpec, message: Message, identity: bytes | None
    ) -> ReadPlan | None:
        """:meth:`plan`, ``None`` for arguments that do not decode."""
        try:
            return self.plan(spec, message, identity)
        except ProtocolError:
            return None

    def plan(self, spec: MethodSpec, message: Message, identity: bytes | None) -> ReadPlan | None:
        """The plan for a read (``None``: not one to cache); raises ProtocolError for
        arguments that do not decode. Made each time: the request path keeps what it made
        with the call (proxy.handler.known_calls)."""
        args = idl.decode_args(spec.name, message.body)
        plan = self.planner.read(spec, args, message.body, identity)
        if plan is not None and plan.partitions is not None:
            self.partitions.variants.learn(
                spec.name, message.body, self.planner.who(identity), plan.partitions
            )
        return plan

    def plan_write(self, spec: MethodSpec, message: Message) -> WritePlan:
        """What a write invalidates. Arguments are decoded only where they name something (a
        write with no targets may have no declaration in the IDL)."""
        if not spec.targets:
            return self.planner.write(spec, None)
        try:
            args = idl.decode_args(spec.name, message.body)
        except ProtocolError:
            args = None
        return self.planner.write(spec, args)

    # -- the read-through ------------------------------------------------------------------

    async def read(self, spec: MethodSpec, call: ReadCall, plan: ReadPlan | None) -> Served:
        """Answer a cacheable read: from the cache when it may, otherwise from the metastore
        (filling the cache). ``plan``: its plan (:meth:`plan_read`); ``None`` for one not to
        cache, and for every call of a client with a metastore connection of its own (a
        pinned connection has a configuration of its own, so its replies are neither served
        from nor kept)."""
        if plan is None:
            self.metrics.cache_lookups.labels(method_label(spec.name), "bypass").inc()
            return Served(await call.forward(None, None), "upstream")
        if plan.partitions is not None and self.partitions.assemble:
            return await self.partitions.read(plan, call)
        # Assembly off (the metastore was seen out of name order): cached whole instead.
        return await self.whole.read(plan, call)

    def hit_now(self, plan: ReadPlan, largest: int) -> Item | None:
        """The hit (its reply at most ``largest`` bytes) to serve for ``plan`` on a shared
        connection, if it is one that needs no await (see :meth:`WholeReads.hit_now`), to
        count with :meth:`count_now` once written; ``None``: take :meth:`read`, which
        decides again (nothing was counted)."""
        if plan.partitions is not None and self.partitions.assemble:
            return self.partitions.hit_now(plan, largest)
        return self.whole.hit_now(plan, largest)

    def assembled_now(
        self, spec: MethodSpec, message: Message, identity: bytes | None, largest: int
    ) -> AssembledHit | None:
        """The reply (at most ``largest`` bytes, with the caller's seqid) to a
        ``get_partitions_by_names`` never planned, if every partition it names is in process
        and judged current (see :mod:`.assembled`), to count with :meth:`count_assembled`
        once written; ``None``: take :meth:`hit_now`."""
        if not spec.per_partition or not self.partitions.assemble:
            return None
        return self.partitions.assembled_now(
            spec.name, message.body, self.planner.who(identity), message.header.seqid, largest
        )

    def count_assembled(self, hit: AssembledHit) -> None:
        self.partitions.count_assembled(hit)

    def count_now(self, item: Item) -> None:
        """Count a hit :meth:`hit_now` gave, once written."""
        assert item.counted is not None  # (made when it was judged a hit)
        self.hits.count(item.counted)

    # -- the whole cache -------------------------------------------------------------------

    def memos(self) -> dict[str, Footprint]:
        """What the engine keeps in process, by name, for /metrics (hmsproxy_memo_bytes)."""
        return {
            "cache": lambda: self.footprint()[:2],
            "partition_variants": self._variants_footprint(),
            "dictionaries": self.dictionaries.footprint(),
            "lock_fences": self.locks.footprint(),
            "fingerprints": fingerprints_footprint,
        }

    def _variants_footprint(self) -> Footprint:
        memos = footprint_of(
            self.partitions.assembled_once,
            self.partitions.variants.memo,
        )
        variants = self.partitions.variants

        def footprint() -> tuple[int, int]:
            entries, size = memos()
            names = variants.found_names  # (with the variants' items, see assembled)
            return entries + names, size + names * assembled.FOUND_NAME_BYTES

        return footprint

    def footprint(self) -> tuple[int, int, str]:
        """(entries, bytes, kind) held in this process: the embedded cache, or Redis's front."""
        if isinstance(self.store, MemoryStore):
            return self.store.entry_count, self.store.stored_bytes, "embedded"
        kind = "redis-cluster" if getattr(self.store, "cluster", False) else "redis"
        return len(self.l1), self.l1.held_bytes(), kind

    async def flush(self) -> int:
        if self.l1 is not None:
            self.l1.clear()
        self.dictionaries.clear()
        return await self.store.flush(self.naming.pattern)


def _untouched(key: str) -> None:
    """(No in-process copy: nothing keeps an LRU place.)"""
