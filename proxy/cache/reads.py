"""Read-through for whole replies: look up, serve, or fetch once and fill.

:meth:`WholeReads.read` is the one call the request path makes for a cacheable read. It owns
the protocol end to end, given a :class:`ReadCall` (the client's call and a way to the
metastore):

1. **Look up** the versions of every scope the plan reads and the entry (one store round
   trip; the in-process front, if any, saves fetching the entry). :mod:`.decide` says what
   that means: hit, miss, or bypass (fenced).
2. **Fill** uses the versions read before the upstream call started: if a write's bump lands
   while the call is in flight, the entry is born dead. No stale fill, no locks.
3. **Single flight**: concurrent misses of one key under one fingerprint share one upstream
   call. A request that arrives after a write saw different versions and flies alone. So do
   concurrent reads of one key while a write or a lock fences it (nothing is filled then),
   taking turns: a table being written costs the metastore one read at a time, not one per
   waiting client, and a reader only ever shares a call sent after it arrived.
4. **Stale-if-error**: while the metastore cannot be reached, an entry past its TTL whose
   versions are still current may answer (``--stale-if-error``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.cache import entry as codec
from proxy.cache.decide import BYPASS, Result, Verdict, judge, judge_stale, storable
from proxy.cache.dictionaries import Dictionaries
from proxy.cache.entry import Payload
from proxy.cache.hit_counts import HitCounts
from proxy.cache.keys import EPOCH, TableRef
from proxy.cache.l1 import L1, PREPARED_BYTES, Item, stands
from proxy.cache.plan import ReadPlan
from proxy.cache.store import CacheUnavailable, Found, Store
from proxy.metrics import Metrics, method_label
from proxy.wire.framing import Message

Keep = Callable[[Message], Awaitable[None]]
# Flights of fenced reads are keyed apart from fills' (their fingerprints could coincide).
FENCED_FLIGHT = b"fenced:"
Fallback = Callable[[], Awaitable[bool]]


class ReadCall(Protocol):
    """One client's read, as the cache needs it: its request, a way to answer it, and a way
    to the metastore. Each answering method returns the call's outcome label."""

    message: Message

    async def serve(self, cached: Payload) -> str:
        """Send a reply the cache holds, with the caller's seqid."""

    async def send(self, reply: bytes) -> str:
        """Send a reply message that already carries the caller's seqid."""

    async def forward(self, keep: Keep | None, fallback: Fallback | None) -> str:
        """Relay the call from the metastore; ``keep`` gets the whole reply, ``fallback``
        may answer instead when the metastore cannot be reached."""

    async def fetch(self, request: bytes | None) -> Message | str:
        """Send ``request`` (``None``: the client's own) and hold the whole reply; a string
        is the outcome of a failure the client has already been told of."""


@dataclass(frozen=True, slots=True)
class Served:
    outcome: str  # the call's outcome label (ok, user_error, upstream_error, ...)
    source: str  # "cache" or "upstream"


class Pending(Protocol):
    """Invalidations the store did not take yet (see :mod:`.writes`)."""

    pending: list[Any]

    async def settled(self) -> bool:
        """Apply them if the store takes them now; whether none is left."""


class Seen(Protocol):
    """Where looked-up tables are counted (the status page)."""

    def looked_up(self, table: TableRef, hit: bool, times: int = 1) -> None: ...


# What a fenced read's joiners are given when the reader whose call they shared went before
# it was answered (an empty reply: no reply is empty).
_LEADER_GONE = b""


@dataclass(slots=True)
class _Turns:
    """Fenced reads of one key under one set of versions: the call at the metastore, and
    the next one, which readers arriving meanwhile wait for."""

    sending: asyncio.Future[bytes | None] | None = None
    waiting: asyncio.Future[bytes | None] | None = None


class WholeReads:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        dictionaries: Dictionaries,
        l1: L1 | None,
        *,
        pending: Pending,
        serve_iceberg: Callable[[], bool],
        max_entry_bytes: int,
        stale_window: float,
        hits: HitCounts,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.hits = hits
        self.dictionaries = dictionaries
        self.l1 = l1
        # Invalidations the store did not take yet: no hits until they are applied.
        self.pending = pending
        self.serve_iceberg = serve_iceberg
        self.max_entry_bytes = max_entry_bytes
        self.stale_window = stale_window
        self._flights: dict[tuple[str, bytes], asyncio.Future[bytes | None]] = {}
        self._turns: dict[tuple[str, bytes], _Turns] = {}  # fenced reads (see _shared)

    async def read(self, plan: ReadPlan, call: ReadCall) -> Served:
        """Answer ``call`` from the cache, or from the metastore while filling the cache."""
        look = await self.lookup(plan)
        self.metrics.cache_lookups.labels(method_label(plan.method), look.result.value).inc()
        seen = self.hits.seen
        if plan.table is not None and seen is not None:
            seen.looked_up(plan.table, look.hit)
        if look.hit:
            return Served(await call.serve(look.reply), "cache")
        if look.fenced:
            return await self._shared(plan, look, call)
        fp = None if look.result is Result.BYPASS else await self.fill_fingerprint(plan, look)
        if fp is None:
            return Served(await call.forward(None, None), "upstream")
        flight = self._flights.get((plan.key, fp))
        if flight is not None:  # the same request under the same versions is on its way
            # Shielded: a waiter cancelled (its client gone, a gRPC deadline) must not
            # cancel the flight the leader and the other waiters share.
            shared = await asyncio.shield(flight)
            if shared is not None:
                return Served(await call.serve(shared), "cache")
            return Served(await call.forward(None, None), "upstream")
        self._flights[(plan.key, fp)] = asyncio.get_running_loop().create_future()
        kept: list[bytes] = []

        async def keep(reply: Message) -> None:
            if await self.fill(plan, fp, reply):
                kept.append(reply.data)

        async def stale() -> bool:
            cached = await self.stale(plan)
            if cached is None:
                return False
            self.metrics.stale_replies.labels(method_label(plan.method)).inc()
            await call.serve(cached)
            return True

        try:
            outcome = await call.forward(keep, stale if self.stale_window > 0 else None)
        finally:
            # Whatever became of the leader (answered, failed, cancelled), its waiters get
            # the reply it kept, or None: each then asks the metastore itself.
            future = self._flights.pop((plan.key, fp))
            if not future.done():
                future.set_result(kept[0] if kept else None)
        return Served(outcome, "upstream")

    async def _shared(self, plan: ReadPlan, fenced: Verdict, call: ReadCall) -> Served:
        """A read of what a write or a lock fences: from the metastore, never filled. Readers
        take turns: one call at the metastore at a time per key and versions, and every
        reader arriving while it is there shares the next call, which is sent after they
        all arrived (so none gets an answer older than a write acknowledged before it came,
        even one the versions do not show yet: a write straight to the metastore)."""
        key = (plan.key, FENCED_FLIGHT + codec.fingerprint(fenced.values))
        turns = self._turns.setdefault(key, _Turns())
        if turns.waiting is not None:  # the next call, not sent yet: this reader joins it
            shared = await asyncio.shield(turns.waiting)
            if shared is _LEADER_GONE:  # no answer to share: these readers take turns anew
                return await self._shared(plan, fenced, call)
            if shared is not None:
                self.metrics.shared_reads.labels(method_label(plan.method)).inc()
                return Served(await call.serve(shared), "upstream")
            return Served(await call.forward(None, None), "upstream")
        mine: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        kept: list[bytes] = []

        async def keep(reply: Message) -> None:
            # Shared only what could have been stored: not a passing error of the metastore.
            if storable(plan, reply, max_bytes=self.max_entry_bytes, serve_iceberg=True):
                kept.append(reply.data)

        gone = True  # until it sends: cancelled (its client gone) while waiting its turn
        try:
            if turns.sending is not None:  # wait for the call at the metastore to end
                turns.waiting = mine
                await asyncio.shield(turns.sending)
                turns.waiting = None
            turns.sending = mine
            gone = False
            outcome = await call.forward(keep, None)
        finally:
            if turns.waiting is mine:
                turns.waiting = None
            if turns.sending is mine:
                turns.sending = None
            if not mine.done():  # its readers get the reply, or ask themselves
                # A reader that went before sending leaves its joiners to take turns again
                # (one call for them all), not to ask one each; each is still answered by a
                # call sent after it arrived. (Once sent, a failure leaves them to ask one
                # each, at once, as before: taking turns after a failure would line them up
                # behind one another.)
                mine.set_result(kept[0] if kept else _LEADER_GONE if gone else None)
            if turns.sending is None and turns.waiting is None:
                self._turns.pop(key, None)
        return Served(outcome, "upstream")

    def hit_now(self, plan: ReadPlan, largest: int) -> Item | None:
        """The hit to serve, if the call is one that needs no await: its entry and its
        versions are in process (the decoded front, and the embedded store's versions or
        the copy Redis keeps coherent), and no invalidation is pending. ``None``: take
        :meth:`read`, as for replies over ``largest`` bytes (the ordinary way writes those
        in slices). Iceberg entries always read Redis. Nothing is counted until its
        ``counted`` is (:meth:`.HitCounts.count`)."""
        return self.judged_now(plan, largest, plan.table, negative_seen_as_hit=True)

    def judged_now(
        self, plan: ReadPlan, largest: int, table: TableRef | None, *, negative_seen_as_hit: bool
    ) -> Item | None:
        """The item whose reply :meth:`hit_now` serves, ``plan``'s entry in the decoded
        front, to count with :meth:`.HitCounts.count` once written (as a look-up, and on the status
        page as a look-up of ``table``: a hit, or a negative one if
        ``negative_seen_as_hit``); ``None``: not one to serve at once. Judged again only
        when the judgement it holds no longer :func:`.l1.stands`."""
        l1 = self.l1
        if l1 is None or self.pending.pending:
            return None
        item = l1.item(plan.key)
        if item is None or item.entry.iceberg:
            return None
        standing = self.store.standing
        if not stands(item, standing, time.monotonic()):
            if not self.store.in_process():
                return None
            scope = standing.scopes.of(plan.grouped)
            mark = scope.mark  # (read before the versions)
            versions = self.store.local(plan.grouped)
            if versions is None:
                return None
            verdict = judge(plan.refs, versions, item.entry, now=time.time(), serve_iceberg=True)
            if not verdict.hit:
                return None
            # Nothing a version look-up could answer for the hashes it read changes while
            # the scope stands: the same judgement until then, but for the item's expiry
            # (checked by L1.item and stands). (The entry's key is a digest of the request,
            # from which the planner, fixed at start, makes the refs.)
            item.stamp(mark, scope)
            l1.fit()  # (the scope may be new: its bytes count)
            # How its hits are counted, as judged now (a plan of partitions answered whole
            # while assembly is off is counted as the whole read it then is).
            seen_hit = negative_seen_as_hit or verdict.result is Result.HIT
            label = method_label(plan.method)
            if item.counted is None:
                l1.charge(item, PREPARED_BYTES)
            item.counted = self.hits.of(label, verdict.result.value, table, seen_hit)
        if len(item.entry.payload) > largest:
            return None
        return item

    async def lookup(self, plan: ReadPlan, *, fresh: bool = False) -> Verdict:
        """``fresh``: judged against the versions as the store has them now, never a copy
        in process (the freshness check's look-up)."""
        if self.pending.pending and not await self.pending.settled():
            return BYPASS
        front = self.l1.get(plan.key) if self.l1 is not None else None
        try:
            # An Iceberg table's object is judged against the versions in Redis, never a copy
            # in process: a lock taken through another proxy (Iceberg's commit check reads
            # the table inside it) is then seen at once, not within the stream's delivery.
            versions, found = await self.store.lookup(
                plan.grouped,
                [] if front is not None else [plan.key],
                fresh=fresh or (front is not None and front.iceberg),
            )
        except CacheUnavailable:
            return BYPASS
        entry = front if front is not None else await self._decoded(found, plan)
        # The Iceberg policy is asked only about Iceberg entries: not on every hit.
        allowed = entry is None or not entry.iceberg or self.serve_iceberg()
        verdict = judge(plan.refs, versions, entry, now=time.time(), serve_iceberg=allowed)
        if verdict.hit and front is None and entry is not None and self.l1 is not None:
            self.l1.put(plan.key, entry, entry.ttl)
        return verdict

    async def stale(self, plan: ReadPlan) -> Payload | None:
        """An expired entry whose versions are still current (see :func:`.judge_stale`)."""
        try:
            versions, found = await self.store.lookup(plan.grouped, [plan.key])
        except CacheUnavailable:
            return None
        entry = await self._decoded(found, plan)
        return judge_stale(plan.refs, versions, entry, now=time.time(), window=self.stale_window)

    async def _decoded(self, found: Found, plan: ReadPlan) -> codec.Entry | None:
        """The plan's entry among what the store found, decoded (``None``: none, or
        unreadable)."""
        value = found.get(plan.key)
        if value is None:
            return None
        try:
            return codec.decode(value, await self.dictionaries.for_value(value, plan.tag))
        except codec.EntryError:
            return None

    async def fill_fingerprint(self, plan: ReadPlan, miss: Verdict) -> bytes | None:
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

    async def fill(self, plan: ReadPlan, fp: bytes, reply: Message) -> bool:
        how = storable(
            plan, reply, max_bytes=self.max_entry_bytes, serve_iceberg=self.serve_iceberg()
        )
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
        if self.l1 is not None:
            self.l1.put(plan.key, codec.Entry(fp, flags, reply.data, time.time() + ttl), ttl)
        return True
