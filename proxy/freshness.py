"""The freshness check: a few hits re-read from the metastore, and compared with what was served.

The cache's coherence rests on invalidations: a write through a proxy bumps versions, the
notification follower bumps them for writes that bypass it. A write that no invalidation
covers (a name spelled in a way the cache keys apart, an event the follower skipped, a
Redis that took reads but refused writes) leaves hits stale until the TTL, and nothing in
the proxy's own metrics shows it. So, with ``--freshness-check-rate N``, a background task
takes at most N hits a second (:mod:`proxy.cache.sampling` says how they are taken: at the
one place the ordinary way answers reads) and for each one:

1. **Still standing?** The versions the reply depends on are read from the store (never a
   copy in process). A whole entry's reply must still be the entry a look-up finds current
   under them; a reply assembled from partitions must have been judged under these very
   versions. Otherwise a write came in between: ``changed``, nothing more is judged.
2. **Asked again.** The client's call is sent to the metastore as it came (on the
   connections kept for writes and the proxy's own calls, as the client's user): the same
   reply, its seqid aside, is a ``match``. So is one that decodes to the same objects
   (the metastore writes a map's entries in an order that can vary between replies).
3. **Explained?** A different reply is stale only if no write could explain it: while the
   notification log is followed, the follower's position must first reach the log's head
   as read after step 2 (and two polls pass: an event with an id it has passed can show up
   a poll later, HIVE-16886), so every event committed before the metastore answered has
   been applied; then the versions are read again, and must not have moved nor be fenced
   (a write through a proxy fences them before it is forwarded and bumps them after).
   Otherwise ``changed`` (or ``undecided``, if the follower did not catch up in time or
   the store did not answer).
4. **Logged?** A stale reply is a ``mismatch`` only if the log could have shown the write
   that made it so: the log was followed (``follower.following``) and the method's reply
   holds nothing the metastore writes no event for. Otherwise it is ``unlogged``, the
   staleness the README documents as expected within the TTL ("Coherence guarantees"):

   * the log is not followed (no follower, ``--notifications off``, or a follower not
     following just then): a write that bypasses the proxy is stale until the TTL by
     design;
   * column statistics (:func:`unlogged`: ``get_table_column_statistics``,
     ``get_aggr_stats_for``...): HMS 2.3 and 3.1 log no event for statistics updated
     straight at the metastore, and may answer ``get_aggr_stats_for`` from their own,
     approximate, aggregate-stats cache;
   * privileges (the ``*_with_auth`` replies, and whatever else the cache serves that
     carries grants or roles): no event covers a grant.

A **mismatch** is counted (``hmsproxy_freshness_checks_total{result="mismatch"}``, and by
method), logged as a warning with its key (method, table, entry key: never a user or a
reply), and alerted on (``HmsProxyStaleReplies``). An **unlogged** one is counted
(``result="unlogged"``), logged at info, and not alerted on. Either way, what it concerns is
answered from the metastore for ``--freshness-quarantine`` seconds by every proxy sharing
the store (a stale reply all the same, and asking the metastore for a while is harmless):
its version hashes get a fence field that every look-up reads as a write in progress (see
:mod:`proxy.cache.locks`), and are invalidated through the ordinary invalidation path
(reason ``freshness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from proxy import idl
from proxy.cache.decide import fenced_fields
from proxy.cache.engine import CacheEngine
from proxy.cache.entry import Payload
from proxy.cache.keys import EPOCH, Bump
from proxy.cache.plan import WritePlan
from proxy.cache.sampling import Sample, read_fields
from proxy.cache.store import CacheUnavailable, Versions
from proxy.catalog import MethodSpec, Scope
from proxy.config import Options
from proxy.handler.forward import Forwarder
from proxy.handler.session import ClientGone, SessionState
from proxy.metrics import Metrics, method_label
from proxy.upstream import UpstreamError, UpstreamPool
from proxy.wire.binary import MessageType, parse_header
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Transport

log = logging.getLogger(__name__)

MATCH, MISMATCH, UNLOGGED = "match", "mismatch", "unlogged"
CHANGED, UNDECIDED, FAILED = "changed", "undecided", "failed"

# Why a stale reply is ``unlogged`` (see unlogged() for the others).
NOT_FOLLOWED = "the notification log is not followed"

# The fence field of a quarantine: any name but a lock's (L:, G:) reads as a write in
# progress, in every version of the proxy (see proxy.cache.locks.read_fences).
QUARANTINE_FIELD = "freshness"

# Replies that differ in their bytes are decoded to be compared (a map's entries can come in
# another order), on the event loop: up to this size (a few ms). Larger ones are undecided.
DECODED_AT_MOST = 4 << 20

# Fields of the catalog's and of a database's version hashes (see proxy.cache.keys); any
# other hash is a table's.
_CATALOG_FIELDS = frozenset({"catalog", "tables", "functions", "privileges"})


class Follower(Protocol):
    """What the check asks of the notification follower (proxy.follower)."""

    last_key: str  # where the store keeps its position (the last event id applied)

    @property
    def following(self) -> bool: ...


class _Held:
    """A client channel for the check's own call: failures are told to it, and dropped."""

    transport = Transport.BUFFERED

    async def send(self, data: bytes) -> None:
        pass

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        pass


class FreshnessCheck:
    def __init__(
        self,
        options: Options,
        engine: CacheEngine,
        forwarder: Forwarder,
        pool: UpstreamPool,
        metrics: Metrics,
        follower: Follower | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rate = options.freshness_check_rate
        self.quarantine = options.freshness_quarantine
        self.poll = options.notification_poll
        self.lease = options.follower_lease
        self.engine = engine
        self.forwarder = forwarder
        self.pool = pool
        self.metrics = metrics
        self.follower = follower
        self.clock = clock  # (a test's, with its sleep: no real time decides a test)
        self.sleep = sleep
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        log.info(
            "freshness check: up to %g cache hits a second re-read from the metastore", self.rate
        )
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def run(self) -> None:
        """One check at a time, each at least 1/rate seconds after the one before began (the
        rate cap: waiting for a hit counts, so a quiet proxy checks its next hit at once)."""
        interval = 1.0 / self.rate
        while True:
            started = self.clock()
            await self.check_next()
            await self.sleep(max(0.0, started + interval - self.clock()))

    async def check_next(self) -> str:
        """Wait for the next hit, check it, count the result."""
        sample = await self.engine.freshness.next()
        try:
            result = await self.check(sample)
        except Exception:
            log.exception("freshness check of %s failed", sample.spec.name)
            result = FAILED
        self.metrics.freshness_checks.labels(result).inc()
        return result

    async def check(self, sample: Sample) -> str:
        fields = read_fields(sample.plan)
        before = await self._standing(sample, fields)
        if isinstance(before, str):
            return before
        reply = await self._ask_again(sample)
        answered_at = self.clock()
        fetched = _parts(reply) if reply is not None else None
        if reply is None or fetched is None or fetched[0] != MessageType.REPLY:
            return FAILED  # (a TApplicationException is the metastore failing, not its data)
        same = same_reply(sample.spec.name, sample.reply, reply)
        if same is None:
            return UNDECIDED
        if same:
            return MATCH
        applied = await self._log_applied(answered_at)
        if applied is False:
            return UNDECIDED
        after = await self._versions(fields)
        if isinstance(after, str):
            return after
        if values(after, fields) != values(before, fields):
            return CHANGED
        why = unlogged(sample.spec) if applied else NOT_FOLLOWED
        await self._stale(sample, why)
        return MISMATCH if why is None else UNLOGGED

    # -- the steps ---------------------------------------------------------------------------

    async def _standing(
        self, sample: Sample, fields: Mapping[str, Sequence[str]]
    ) -> Versions | str:
        """The versions the sampled reply still stands under (step 1), or the result."""
        versions = await self._versions(fields)
        if isinstance(versions, str):
            return versions
        if sample.stamp is not None:
            same = values(sample.stamp, fields) == values(versions, fields)
            return versions if same else CHANGED
        # A whole entry: still the one a look-up finds current, with the bytes served. (A
        # look-up after the versions: had they moved in between, the second reading, after
        # the metastore answered, differs from this one.)
        verdict = await self.engine.whole.lookup(sample.plan, fresh=True)
        if not verdict.hit or _parts(verdict.reply) != _parts(sample.reply):
            return CHANGED
        return versions

    async def _versions(self, fields: Mapping[str, Sequence[str]]) -> Versions | str:
        """The versions as the store has them now; ``changed`` if a write of this proxy is
        still to be applied or a write (or a lock, or a quarantine) fences them."""
        try:
            versions, _ = await self.engine.store.lookup(fields, [], fresh=True)
        except CacheUnavailable:
            return UNDECIDED
        if self.engine.invalidations.pending or fenced_fields(fields, versions):
            return CHANGED
        return versions

    async def _ask_again(self, sample: Sample) -> Payload | None:
        """The metastore's reply to the client's call now (``None``: it failed)."""
        session = SessionState(peer="freshness check", identity=sample.identity)
        try:
            got = await self.forwarder.call(
                session, sample.request, _Held(), hold=True, write=True, retries=1
            )
        except ClientGone as exc:  # the metastore hung up on the call
            log.debug("freshness check: %s", exc)
            return None
        return None if isinstance(got, str) else got.data

    async def _log_applied(self, answered_at: float) -> bool | None:
        """Whether every event the metastore logged before it answered has been applied
        (step 3): ``False`` if that could not be told in time; ``None``, at once, while the
        log is not followed (it then explains nothing, and rules nothing out)."""
        follower = self.follower
        if follower is None or not follower.following:
            return None
        try:
            head = await self._log_head()
        except (UpstreamError, ProtocolError, AttributeError) as exc:
            log.debug("freshness check: no notification log head: %s", exc)
            return False
        settled = answered_at + 2 * self.poll
        deadline = settled + max(self.lease, 3 * self.poll)
        while True:
            try:
                raw = await self.engine.store.get(follower.last_key)
                position = int(raw) if raw else -1
            except (CacheUnavailable, ValueError):
                return False
            now = self.clock()
            if position >= head and now >= settled:
                return True
            if not follower.following:
                return None
            if now >= deadline:
                return False
            await self.sleep(self.poll / 4)

    async def _log_head(self) -> int:
        reply = await self.pool.ask_for_write(None, "get_current_notificationEventId")
        if reply.header.type != MessageType.REPLY:
            raise ProtocolError("get_current_notificationEventId answered an exception")
        current = idl.decode_result("get_current_notificationEventId", reply.body).success
        return int(current.eventId)

    async def _stale(self, sample: Sample, why: str | None) -> None:
        """Log and quarantine a stale reply: a mismatch (``why`` None, also counted by
        method), or one the log could not have shown (``why`` says why: unlogged)."""
        plan = sample.plan
        table = plan.table
        where = f"{table.db}.{table.table}" if table is not None else f"versions {plan.tag!r}"
        then = (
            f"answered from the metastore for {self.quarantine:g} s"
            if self.quarantine > 0
            else "invalidated"
        )
        if why is None:
            self.metrics.freshness_mismatches.labels(method_label(sample.spec.name)).inc()
            log.warning(
                "freshness check: a cached reply of %s for %s (entry %s) differs from the "
                "metastore's, and no write explains it; %s",
                sample.spec.name,
                where,
                plan.key,
                then,
            )
        else:
            log.info(
                "freshness check: a cached reply of %s for %s (entry %s) differs from the "
                "metastore's, with no write through a proxy in between, as a write the "
                "notification log does not show leaves it (%s): expected within the TTL "
                "(unlogged); %s",
                sample.spec.name,
                where,
                plan.key,
                why,
                then,
            )
        fields = read_fields(plan)
        keys = sorted(fields)
        if self.quarantine > 0:
            items = [(key, QUARANTINE_FIELD) for key in keys]
            try:
                await self.engine.store.mark(items, time.time() + self.quarantine)
            except CacheUnavailable:
                log.warning("freshness check: could not fence %s in the store", where)
        bumps = tuple(Bump(key, EPOCH, _scope(fields[key])) for key in keys)
        tables = (table,) if table is not None else ()
        await self.engine.invalidate(WritePlan(bumps, tables=tables), "freshness")


def unlogged(spec: MethodSpec) -> str | None:
    """Why the notification log cannot show every write that changes ``spec``'s replies
    (``None``: it can, while it is followed). HMS 2.3 and 3.1 write no event for column
    statistics updated straight at them (and may answer ``get_aggr_stats_for`` from their
    own approximate aggregate-stats cache), nor for grants: the ``*_with_auth`` replies,
    and any other the cache serves that carries privileges or roles (Scope.PRIVILEGES)."""
    if spec.scope & Scope.STATISTICS:
        return "the metastore logs no event for column statistics"
    if spec.scope & Scope.PRIVILEGES:
        return "the metastore logs no event for grants"
    return None


def values(versions: Versions, fields: Mapping[str, Sequence[str]]) -> list[bytes | None]:
    """The values of ``fields`` in ``versions`` (pseudo-fields such as fences left out: a
    copy in process and the store may report those differently)."""
    return [versions.get(key, {}).get(name) for key, names in fields.items() for name in names]


def _parts(reply: Payload) -> tuple[int, memoryview] | None:
    """A reply's type and body (a view, not a copy): what is compared, the seqid aside."""
    header = parse_header(reply, 0, len(reply))
    return None if header is None else (header.type, memoryview(reply)[header.length :])


def same_reply(method: str, served: Payload, fetched: Payload) -> bool | None:
    """Whether the metastore's reply says what the cache's did: the same bytes but for the
    seqid, or the same objects decoded (a map's entries in another order). ``None``: other
    bytes, too many to decode on the event loop (see DECODED_AT_MOST)."""
    a, b = _parts(served), _parts(fetched)
    if a is None or b is None:
        return False
    if a == b:
        return True
    if a[0] != b[0] or a[0] != MessageType.REPLY:
        return False
    if max(len(a[1]), len(b[1])) > DECODED_AT_MOST:
        return None
    try:
        decoded = [idl.decode_result(method, bytes(body)) for _, body in (a, b)]
        return bool(decoded[0] == decoded[1])
    except (ProtocolError, KeyError):
        return False


def _scope(fields: Sequence[str]) -> str:
    """The scope a version hash's epoch stands for (the invalidation metric's label)."""
    names = set(fields)
    if "db" in names:
        return "database"
    if names & _CATALOG_FIELDS:
        return "catalog"
    return "table"
