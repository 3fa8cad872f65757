"""The cache's decisions at run time: hit or miss, what to fill, what a write invalidates.

Rules the engine keeps, whatever the store:

1. **A hit is an entry whose fingerprint equals the fingerprint of the current versions**
   of every scope its plan depends on. Versions are read from the store on every look-up,
   so a write through any proxy sharing the store is seen by the next read everywhere.
2. **A fill uses the versions read before its upstream call started.** If a write's bump
   lands while the call is in flight, the entry is born dead. No stale fill, no locks.
3. **A write invalidates after the HMS answered and before the writer gets the answer.**
   If the store cannot take the invalidation, this proxy keeps it pending and serves no hit
   until it has been applied (the writer never reads its own write stale through it).
4. **Concurrent misses of one key and one fingerprint share one upstream call.** A request
   that arrives after a write saw different versions and starts a call of its own.

With Redis there is also an in-process front (L1) of decoded replies, bounded in bytes: an
L1 entry is served on the same fingerprint rule (versions still come from Redis), and only
until the time its Redis entry had left to live.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from proxy import iceberg, idl
from proxy.cache import entry as codec
from proxy.cache import locks
from proxy.cache.fences import LockFences
from proxy.cache.keys import EPOCH, TableRef, partition_field
from proxy.cache.plan import FLUSH, Bump, PartitionPlan, Planner, ReadPlan, VersionRef, WritePlan
from proxy.cache.store import FENCED, CacheUnavailable, Store, Versions
from proxy.catalog import MethodSpec
from proxy.memo import BoundedMemo
from proxy.metrics import Metrics
from proxy.status import Activity
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)


class Result(Enum):
    HIT = "hit"
    NEGATIVE_HIT = "negative_hit"
    MISS = "miss"
    BYPASS = "bypass"


@dataclass(slots=True)
class Lookup:
    result: Result
    reply: bytes = b""  # the cached reply message, on a hit
    values: list[bytes | None] = field(default_factory=list)  # versions read, plan order


@dataclass(slots=True)
class PartitionLookup:
    result: Result
    known: dict[tuple[str, ...], bytes | None] = field(default_factory=dict)  # None: absent
    versions: dict[str, bytes | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WriteIntent:
    """A write in progress: its fence id, and the granted lock fences it ends."""

    id: str
    ends: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class _L1Entry:
    fingerprint: bytes
    entry: codec.Entry
    expires_at: float
    size: int


class _L1:
    """Decoded replies of this process, LRU, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, _L1Entry] = OrderedDict()
        self.bytes = 0

    def get(self, key: str) -> _L1Entry | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item.expires_at <= time.monotonic():
            self.pop(key)
            return None
        self._items.move_to_end(key)
        return item

    def put(self, key: str, fp: bytes, entry: codec.Entry, ttl: float) -> None:
        size = len(key) + len(entry.payload) + 250  # with the entry's objects
        if size > self.max_bytes // 4 or ttl <= 0:
            return
        self.pop(key)
        self._items[key] = _L1Entry(fp, entry, time.monotonic() + ttl, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.size

    def pop(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.size

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)


# Invalidations kept while the store is away, at most; beyond, one flush stands for them all.
MAX_PENDING = 1_000
# Memory for plans and for compression dictionaries, whatever clients send (see proxy.memo).
PLAN_ENTRIES = 20_000
PLAN_BYTES = 32 << 20
DICTIONARY_BYTES = 16 << 20


def _request_digest(method: str, body: bytes, identity: bytes | None) -> bytes:
    h = hashlib.blake2b(method.encode(), digest_size=16)
    h.update(b"\x00")
    h.update(body)
    if identity is not None:
        h.update(b"\x00")
        h.update(identity)
    return h.digest()


def fenced(refs: Sequence[VersionRef], versions: Versions) -> bool:
    """Whether a write fences any hash ``refs`` read, or a lock fences a field they read."""
    for key, fields in versions.items():
        if FENCED in fields:
            return True
        locked = fields.get(locks.LOCKED)
        if locked:
            covered = set(locked.decode().split(","))
            if any(r.key == key and r.field in covered for r in refs):
                return True
    return False


def _group(refs: Sequence[VersionRef]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ref in refs:
        fields = out.setdefault(ref.key, [])
        if ref.field not in fields:
            fields.append(ref.field)
    return out


def _exception_name(method: str, body: bytes) -> str | None:
    """The declared exception a result carries (``NoSuchObjectException``), if any."""
    if len(body) < 3 or body[0] == 0 or body[1:3] == b"\x00\x00":
        return None
    fid = int.from_bytes(body[1:3], "big", signed=True)
    spec = idl.result_class(method).thrift_spec.get(fid)
    return spec[2].__name__ if spec and len(spec) == 4 and hasattr(spec[2], "__name__") else "?"


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
        self.write_fence = write_fence
        self.stale_window = stale_window
        self.activity = activity
        # Whether Iceberg table objects may be served from the cache now (--cache-iceberg-
        # tables; in auto, while the notification log is followed).
        self.serve_iceberg = serve_iceberg
        self.locks = LockFences(store, self.naming, metrics, lock_fence, self._defer)
        self.writes = 0  # invalidations for writes through this proxy (the follower watches)
        self._l1 = _L1(l1_bytes) if store.compress else None
        # Plans by a digest of the request (not its bytes: a client decides how big those are).
        self._plans: BoundedMemo[bytes, ReadPlan | None] = BoundedMemo(PLAN_ENTRIES, PLAN_BYTES)
        self._flights: dict[tuple[str, bytes], asyncio.Future[bytes | None]] = {}
        # Invalidations Redis did not take yet, with the fence each lifts (if any).
        self._pending: list[tuple[WritePlan, WriteIntent | None]] = []
        # Compression dictionaries: id -> bytes, and each table's own: tag -> (id, bytes).
        self._dicts: BoundedMemo[bytes, bytes] = BoundedMemo(10_000, DICTIONARY_BYTES)
        self._table_dicts: BoundedMemo[str, tuple[bytes, bytes]] = BoundedMemo(
            10_000, DICTIONARY_BYTES
        )
        # The HMS returns get_partitions_by_names ordered by partition name; if it is ever
        # seen doing otherwise, replies are no longer assembled from single partitions.
        self.assemble_partitions = True

    # -- plans -----------------------------------------------------------------------------

    def plan_read(
        self, spec: MethodSpec, message: Message, identity: bytes | None
    ) -> ReadPlan | None:
        """The plan for a read (memoised: engines repeat the same calls byte for byte)."""
        who = identity if self.planner.per_user else None
        memo = _request_digest(spec.name, message.body, who)
        found, plan = self._plans.lookup(memo)
        if found:
            return plan
        try:
            args = idl.decode_args(spec.name, message.body)
        except ProtocolError:
            return None  # not remembered: garbage is rarely repeated, and costs a scan only
        plan = self.planner.read(spec, args, message.body, identity)
        self._plans.put(memo, plan, plan.approx_size() if plan is not None else 0)
        return plan

    def plan_write(self, spec: MethodSpec, message: Message) -> WritePlan:
        try:
            args = idl.decode_args(spec.name, message.body)
        except ProtocolError:
            args = None
        return self.planner.write(spec, args)

    # -- whole-reply reads -----------------------------------------------------------------

    async def lookup(self, plan: ReadPlan) -> Lookup:
        if self._pending and not await self._apply_pending():
            return Lookup(Result.BYPASS)
        front = self._l1.get(plan.key) if self._l1 is not None else None
        groups = _group(plan.refs)
        try:
            versions, found = await self.store.lookup(groups, [] if front else [plan.key])
        except CacheUnavailable:
            return Lookup(Result.BYPASS)
        values = [versions[r.key][r.field] for r in plan.refs]
        if fenced(plan.refs, versions):
            return Lookup(Result.BYPASS)  # a write or a lock is under way: neither serve nor fill
        if any(versions[k].get(EPOCH) is None for k in groups):
            return Lookup(Result.MISS, values=values)
        fp = codec.fingerprint(values)
        if front is not None:
            if front.fingerprint == fp:
                return self._hit(front.entry)
            return Lookup(Result.MISS, values=values)
        value = found.get(plan.key)
        if value is None:
            return Lookup(Result.MISS, values=values)
        try:
            entry = codec.decode(value, await self._dictionary_for(value, plan.tag))
        except codec.EntryError:
            return Lookup(Result.MISS, values=values)
        if entry.fingerprint != fp or entry.ttl <= 0:
            return Lookup(Result.MISS, values=values)
        if self._l1 is not None:
            self._l1.put(plan.key, fp, entry, entry.ttl)
        return self._hit(entry)

    async def stale(self, plan: ReadPlan) -> bytes | None:
        """``--stale-if-error``: an entry past its TTL (within the window) whose versions are
        still current, for when the metastore cannot be reached. Never one a write invalidated
        or is fencing: stale in time only."""
        try:
            versions, found = await self.store.lookup(_group(plan.refs), [plan.key])
        except CacheUnavailable:
            return None
        if fenced(plan.refs, versions):
            return None
        value = found.get(plan.key)
        if value is None:
            return None
        try:
            entry = codec.decode(value, await self._dictionary_for(value, plan.tag))
        except codec.EntryError:
            return None
        current = codec.fingerprint([versions[r.key][r.field] for r in plan.refs])
        if entry.fingerprint != current or entry.ttl < -self.stale_window:
            return None
        return entry.payload

    def _hit(self, entry: codec.Entry) -> Lookup:
        if entry.iceberg and not self.serve_iceberg():
            return Lookup(Result.BYPASS)
        return Lookup(Result.NEGATIVE_HIT if entry.negative else Result.HIT, entry.payload)

    async def fill_fingerprint(self, plan: ReadPlan, miss: Lookup) -> bytes | None:
        """The fingerprint a fill for ``miss`` must carry; makes missing epochs first."""
        values = list(miss.values)
        missing = [i for i, r in enumerate(plan.refs) if r.field == EPOCH and values[i] is None]
        if missing:
            try:
                epochs = await self.store.ensure_epochs(sorted({plan.refs[i].key for i in missing}))
            except CacheUnavailable:
                return None
            for i in missing:
                values[i] = epochs.get(plan.refs[i].key)
            if any(values[i] is None for i in missing):
                return None
        return codec.fingerprint(values)

    def cacheable(self, plan: ReadPlan, reply: Message) -> tuple[int, float] | None:
        """(flags, ttl) to store ``reply`` with, or ``None`` if it must not be stored."""
        if reply.header.type != MessageType.REPLY or len(reply.data) > self.max_entry_bytes:
            return None
        failure = _exception_name(plan.method, reply.body)
        if failure is None:
            if iceberg.reply_has_iceberg_table(plan.method, reply.body):
                return (codec.ICEBERG, plan.ttl) if self.serve_iceberg() else None
            return 0, plan.ttl
        if failure == "NoSuchObjectException" and plan.negative_ttl:
            return codec.NEGATIVE, plan.negative_ttl
        return None

    async def fill(self, plan: ReadPlan, fp: bytes, reply: Message) -> bool:
        how = self.cacheable(plan, reply)
        if how is None:
            return False
        flags, ttl = how
        stored = codec.encode(fp, flags, reply.data, ttl, compress=self.store.compress)
        keep = ttl + self.stale_window  # kept past its TTL only to be served while the HMS is down
        try:
            await self.store.save([(plan.key, stored, keep)], sorted({r.key for r in plan.refs}))
        except CacheUnavailable:
            return False
        self.metrics.cache_stored_bytes.inc(len(stored))
        if self._l1 is not None:
            self._l1.put(plan.key, fp, codec.Entry(fp, flags, reply.data, time.time() + ttl), ttl)
        return True

    # -- single flight ---------------------------------------------------------------------

    def join(self, key: str, fp: bytes) -> asyncio.Future[bytes | None] | None:
        """The flight already fetching ``key`` under ``fp``, to wait for; or ``None``."""
        return self._flights.get((key, fp))

    def lead(self, key: str, fp: bytes) -> asyncio.Future[bytes | None]:
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._flights[(key, fp)] = future
        return future

    def land(self, key: str, fp: bytes, reply: bytes | None) -> None:
        future = self._flights.pop((key, fp), None)
        if future is not None and not future.done():
            future.set_result(reply)

    # -- get_partitions_by_names -----------------------------------------------------------

    async def lookup_partitions(self, plan: ReadPlan) -> PartitionLookup:
        pp = plan.partitions
        assert pp is not None
        if not self.assemble_partitions:
            return PartitionLookup(Result.BYPASS)
        if self._pending and not await self._apply_pending():
            return PartitionLookup(Result.BYPASS)
        key = self.naming.versions(pp.tag)
        fields = [EPOCH, "pgen", "partset", *pp.fields]
        entry_keys = pp.entry_keys
        l1 = self._l1
        fronts = {k: e for k in entry_keys if l1 is not None and (e := l1.get(k)) is not None}
        try:
            versions, found = await self.store.lookup(
                {key: fields}, [k for k in entry_keys if k not in fronts]
            )
        except CacheUnavailable:
            return PartitionLookup(Result.BYPASS)
        current = versions[key]
        if fenced([VersionRef(key, f) for f in fields], versions):
            return PartitionLookup(Result.BYPASS)
        out = PartitionLookup(Result.MISS, versions=current)
        if current.get(EPOCH) is None:
            return out
        needed = {codec.dictionary_id(v) for v in found.values() if v is not None} - {None}
        await self._load_dictionaries(
            pp.tag, [d for d in needed if d is not None and d not in self._dicts]
        )
        epoch, pgen, partset = current[EPOCH], current.get("pgen"), current.get("partset")
        for values, ekey, version_field in zip(pp.values, entry_keys, pp.fields, strict=True):
            front = fronts.get(ekey)
            if front is not None:
                entry = front.entry
            else:
                value = found.get(ekey)
                if value is None:
                    continue
                try:
                    entry = codec.decode(value, self._dicts.get(codec.dictionary_id(value) or b""))
                except codec.EntryError:
                    continue
            pf = current.get(version_field)
            if entry.ttl <= 0:
                continue
            if entry.absent:
                if entry.fingerprint == codec.fingerprint([epoch, partset, pf]):
                    out.known[values] = None
            elif entry.fingerprint == codec.fingerprint([epoch, pgen, pf]):
                out.known[values] = entry.payload
            else:
                continue
            if front is None and l1 is not None:
                l1.put(ekey, entry.fingerprint, entry, entry.ttl)
        if len(out.known) == len(pp.values):
            out.result = Result.HIT
        return out

    async def partition_versions(
        self, pp: PartitionPlan, seen: dict[str, bytes | None]
    ) -> dict[str, bytes | None] | None:
        """Versions to fill partitions under: those read before the upstream call, with an
        epoch made if the table had none."""
        if seen.get(EPOCH) is not None:
            return seen
        key = self.naming.versions(pp.tag)
        try:
            epochs = await self.store.ensure_epochs([key])
        except CacheUnavailable:
            return None
        return {**seen, EPOCH: epochs.get(key)}

    async def fill_partitions(
        self,
        plan: ReadPlan,
        versions: dict[str, bytes | None],
        asked: Sequence[tuple[str, ...]],
        got: dict[tuple[str, ...], bytes],
    ) -> None:
        """Store what the HMS returned for ``asked``, and remember the rest as absent."""
        pp = plan.partitions
        assert pp is not None
        dictionary = self._table_dictionary(pp.tag, next(iter(got.values()), None))
        # The in-process copies carry their expiry like decoded ones: look-ups check it.
        expires = time.time() + plan.ttl
        items = []
        for values in asked:
            pf = versions.get(partition_field(values))
            ekey = self.naming.partition_entry(pp.tag, pp.variant, values)
            if values in got:
                fp = codec.fingerprint([versions[EPOCH], versions.get("pgen"), pf])
                entry = codec.Entry(fp, 0, got[values], expires)
                value = codec.encode(
                    fp,
                    0,
                    got[values],
                    plan.ttl,
                    compress=self.store.compress,
                    dictionary=dictionary,
                )
            else:
                fp = codec.fingerprint([versions[EPOCH], versions.get("partset"), pf])
                entry = codec.Entry(fp, codec.ABSENT, b"", expires)
                value = codec.encode(fp, codec.ABSENT, b"", plan.ttl, compress=False)
            items.append((ekey, value, plan.ttl))
            if self._l1 is not None:
                self._l1.put(ekey, fp, entry, plan.ttl)
        touch = [self.naming.versions(pp.tag)]
        if dictionary is not None and self.store.compress:
            dkey = self.naming.dictionary(pp.tag, dictionary[0].hex())
            items.append((dkey, dictionary[1], self.planner.ttls.longest * 2 + 60))
        try:
            await self.store.save(items, touch)
        except CacheUnavailable:
            return
        self.metrics.cache_stored_bytes.inc(sum(len(value) for _, value, _ in items))

    def _table_dictionary(self, tag: str, sample: bytes | None) -> tuple[bytes, bytes] | None:
        if not self.store.compress:
            return None
        known = self._table_dicts.get(tag)
        if known is None and sample is not None:
            known = codec.new_dictionary(sample)
            self._table_dicts.put(tag, known, len(known[1]))
            self._remember_dict(*known)
        return known

    def _remember_dict(self, dict_id: bytes, data: bytes) -> None:
        self._dicts.put(dict_id, data, len(data))

    async def _load_dictionaries(self, tag: str, ids: Sequence[bytes]) -> None:
        for dict_id in ids:
            try:
                data = await self.store.get(self.naming.dictionary(tag, dict_id.hex()))
            except CacheUnavailable:
                return
            if data is not None:
                self._remember_dict(dict_id, data)

    async def _dictionary_for(self, value: bytes, tag: str) -> bytes | None:
        dict_id = codec.dictionary_id(value)
        if dict_id is None:
            return None
        if dict_id not in self._dicts:
            await self._load_dictionaries(tag, [dict_id])
        return self._dicts.get(dict_id)

    # -- writes ----------------------------------------------------------------------------

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
                database.db if database.catalog == "hive" else f"@{database.catalog}#{database.db}"
            )
            try:
                tables = await list_tables(name)
            except Exception:
                log.warning(
                    "cache: cannot list tables of %s before dropping it; flushing", database.db
                )
                return WritePlan(flush_all=True)
            for table in tables:
                tag = TableRef(database.catalog, database.db, table.lower()).tag
                bumps.append(Bump(self.naming.versions(tag), EPOCH, "table"))
        return WritePlan(tuple(bumps), plan.databases_dropped, plan.flush_all, plan.tables)

    async def begin_write(self, plan: WritePlan) -> WriteIntent | None:
        """Before a write is forwarded: fence what it changes, and invalidate it already.

        The fence (a deadline on each version hash it changes) stops every proxy from filling
        or serving those scopes until the write is done; the early bump kills what was filled
        before. So if this proxy dies before :meth:`end_write`, nobody serves pre-write data:
        not before the deadline (fenced), not after it (bumped). An alter or drop of a table
        also ends the fences of granted locks on it (see :mod:`proxy.cache.locks`): the ones
        found now are lifted by :meth:`end_write`.
        """
        if plan.empty or plan.flush_all or self.write_fence <= 0:
            return None
        intent = os.urandom(8).hex()
        keys = sorted({b.key for b in plan.bumps} | set(plan.ends_locks))
        self._forget_locally(plan)
        # A fence that failed is not known to be in place, nor known not to be (a timeout does
        # not tell): the intent is kept all the same, so that end_write lifts it if it is,
        # rather than leaving the table fenced, its reads all sent to the metastore, until
        # the fence's deadline.
        granted: dict[str, list[str]] = {}
        with contextlib.suppress(CacheUnavailable):
            granted = await self.store.fence(keys, intent, self.write_fence, plan.bumps)
        ends = tuple((key, name) for key in plan.ends_locks for name in granted.get(key, ()))
        return WriteIntent(intent, ends)

    async def end_write(self, plan: WritePlan, intent: WriteIntent | None) -> bool:
        """After the write: invalidate again (for fills made before the fence was seen),
        then lift the fence."""
        if intent is None or plan.flush_all:
            return await self.invalidate(plan, "write")
        if self._pending:
            self._pending.append((plan, intent))
            return await self._apply_pending()
        try:
            await self._apply(plan, intent)
        except CacheUnavailable:
            log.warning("cache: could not apply an invalidation; no cache hits until it is")
            self._pending.append((plan, intent))
            return False
        self._count(plan, "write")
        self._count_lock_ends(intent)
        return True

    def _count_lock_ends(self, intent: WriteIntent | None) -> None:
        ended = {n.split(":")[1] for _, n in intent.ends} if intent is not None else set()
        if ended:
            self.metrics.lock_fences.labels("closed").inc(len(ended))

    async def invalidate(self, plan: WritePlan, reason: str) -> bool:
        """Apply ``plan`` now, or keep it pending (and bypass the cache) until possible."""
        if plan.empty:
            return True
        self._forget_locally(plan)
        if self._pending:
            self._keep_pending(plan, None)
            return await self._apply_pending()
        try:
            await self._apply(plan)
        except CacheUnavailable:
            log.warning("cache: could not apply an invalidation; no cache hits until it is")
            self._keep_pending(plan, None)
            return False
        self._count(plan, reason)
        return True

    def _defer(self, bumps: tuple[Bump, ...]) -> None:
        """An invalidation the store did not take: pending, so this proxy serves no hits."""
        self._keep_pending(WritePlan(bumps), None)

    def _keep_pending(self, plan: WritePlan, intent: WriteIntent | None) -> None:
        if any(p == plan and i == intent for p, i in self._pending):  # once is enough
            return
        if len(self._pending) >= MAX_PENDING:
            # A long outage with writes going on: rather than keep every one, forget
            # everything once the store is back (the write fences lapse by their deadlines).
            log.warning(
                "cache: %d invalidations pending; the cache is flushed once the store "
                "answers again",
                len(self._pending),
            )
            self._pending = [(FLUSH, None)]
            return
        self._pending.append((plan, intent))

    def _forget_locally(self, plan: WritePlan) -> None:
        if plan.flush_all and self._l1 is not None:
            self._l1.clear()
        for table in plan.tables:
            self._table_dicts.pop(table.tag)

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
        while self._pending:
            try:
                await self._apply(*self._pending[0])
            except CacheUnavailable:
                return False
            plan, intent = self._pending.pop(0)
            self._count(plan, "write")
            self._count_lock_ends(intent)
        log.info("cache: pending invalidations applied; serving hits again")
        return True

    def _count(self, plan: WritePlan, reason: str) -> None:
        if reason == "write":
            self.writes += 1
        if plan.flush_all:
            for scope in ("catalog", "database", "table", "partitions"):
                self.metrics.invalidations.labels(scope, reason).inc()
        for b in plan.bumps:
            self.metrics.invalidations.labels(b.scope, reason).inc()
        if self.activity is not None and (plan.bumps or plan.flush_all):
            self.activity.invalidated(
                reason, (b.scope for b in plan.bumps), plan.tables, plan.flush_all
            )

    def footprint(self) -> tuple[int, int, str]:
        """(entries, bytes, kind) held in this process: the embedded cache, or Redis's front."""
        from proxy.cache.store import MemoryStore

        if isinstance(self.store, MemoryStore):
            return self.store.entry_count, self.store.stored_bytes, "embedded"
        assert self._l1 is not None
        kind = "redis-cluster" if getattr(self.store, "cluster", False) else "redis"
        return len(self._l1), self._l1.bytes, kind

    async def flush(self) -> int:
        if self._l1 is not None:
            self._l1.clear()
        self._table_dicts.clear()
        return await self.store.flush(self.naming.pattern)
