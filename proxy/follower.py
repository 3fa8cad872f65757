"""The notification-log follower: writes that bypass the proxy, seen within a poll.

Every ``--notification-poll`` the follower asks the metastore for events after the last one
it applied and invalidates what each one touches (``proxy.cache.events``). Of all proxies
sharing a store exactly one follows: it holds a lease in the store, renewed on every poll;
when it dies the lease expires and another proxy takes over where the last applied event
id (also in the store) says. Events are applied before that id moves, and it never moves
past an event whose invalidation the store did not take (a Redis timeout stops the poll
there; the next poll starts again from it), so a takeover can apply an event twice
(harmless: an invalidation) but never skips one.

Ids are not a clean sequence (HMS 2.3 gives concurrent writes one id; events of concurrent
transactions become visible out of order): each poll re-reads a window behind the position
and applies what it has not applied, recognised by content (``proxy.log_cursor``).

A gap in the log (events purged before they were applied, an id missing for longer than
the window, ids that jump backwards after a metastore reset) cannot be replayed, so the
cache is flushed and following resumes at the current id. The same happens the first time a
follower starts on a store: entries already there may predate writes nobody followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass

from proxy import idl
from proxy.cache.engine import CacheEngine
from proxy.cache.events import KNOWN, SKIPPED, Event, invalidation_for
from proxy.cache.store import CacheUnavailable
from proxy.config import Options
from proxy.log_cursor import LogCursor
from proxy.metrics import Metrics
from proxy.upstream import UpstreamError, UpstreamPool
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError

log = logging.getLogger(__name__)

BATCH = 1000
PAGES_PER_POLL = 10  # a backlog is read this many pages a poll, the position saved after each


class LogUnavailable(Exception):
    """The metastore does not serve the notification log (or answered nonsense)."""


@dataclass
class FollowerState:
    leader: bool = False
    enabled: bool = True
    active: bool = True  # False once writes went by and the log did not move
    last_applied: int | None = None
    head: int | None = None


class NotificationFollower:
    def __init__(
        self, options: Options, engine: CacheEngine, pool: UpstreamPool, metrics: Metrics
    ) -> None:
        self.options = options
        self.engine = engine
        self.pool = pool
        self.metrics = metrics
        self.token = os.urandom(12).hex()
        self.lease_key = engine.naming.coordination("follower")
        self.last_key = engine.naming.coordination("last_event")
        self.verdict_key = engine.naming.coordination("log_followed")
        self.state = FollowerState()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writes_at_head: tuple[int, float] | None = None
        self._writes_seen = 0
        self._said_standing = False  # this proxy logged that the log does not move
        self._last_success = time.time()
        self._cursor: LogCursor | None = None
        metrics.notification_enabled.set(1)
        for kind in [*sorted(KNOWN - SKIPPED), "other"]:
            metrics.notification_events.labels(kind)  # at zero, so rate() works from the start

    async def first_poll(self, wait: float) -> None:
        try:
            async with asyncio.timeout(wait):
                await self.poll()
        except (TimeoutError, UpstreamError, CacheUnavailable, LogUnavailable) as exc:
            log.info("notification follower: first poll deferred (%s)", exc or type(exc).__name__)

    @property
    def following(self) -> bool:
        """Whether writes that bypass the proxy are seen within a poll: the log is followed,
        by this proxy or by the one holding the lease (which says so in the store), it moves
        with writes, and the last poll (or lease check) was a few polls ago at most."""
        recent = time.time() - self._last_success < self._fresh_for()
        return self.state.enabled and self.state.active and recent

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.state.leader:  # hand over now rather than when the lease runs out
            with contextlib.suppress(CacheUnavailable):
                await self.engine.store.release(self.lease_key, self.token)

    async def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self.poll()
            except LogUnavailable as exc:
                if self.options.notifications == "on":
                    log.warning("notification log unavailable (%s); retrying", exc)
                else:
                    log.warning(
                        "the metastore does not serve the notification log (%s): writes that "
                        "bypass the proxy are seen within the TTLs only",
                        exc,
                    )
                    self.state.enabled = False
                    self.metrics.notification_active.set(0)
                    self.metrics.notification_enabled.set(0)
                    self.metrics.notification_leader.set(0)
                    if self.state.leader:
                        self.state.leader = False
                        with contextlib.suppress(CacheUnavailable):
                            await self.engine.store.release(self.lease_key, self.token)
                    return
            except (UpstreamError, CacheUnavailable) as exc:
                log.debug("notification poll failed: %s", exc)
                self._poll_failed()
            except Exception:
                log.exception("notification follower failed; retrying")
                self._poll_failed()
            delay = self.options.notification_poll - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.05, delay)):
                    await self._stopping.wait()

    def _poll_failed(self) -> None:
        """A leader that cannot poll falls behind: its lag grows from its last good poll, so
        the lag (and the alert on it) shows a follower that is stuck, not just a slow one."""
        if self.state.leader:
            self.metrics.notification_lag_seconds.set(time.time() - self._last_success)

    # -- one poll --------------------------------------------------------------------------

    async def poll(self) -> None:
        store = self.engine.store
        leader = await store.lease(self.lease_key, self.token, self.options.follower_lease)
        if leader != self.state.leader:
            log.info("notification follower: %s", "this proxy follows" if leader else "standing by")
        self.state.leader = leader
        self.metrics.notification_leader.set(1 if leader else 0)
        if not leader:
            # The lag is the leader's to report; a standby's last figures would go stale.
            self.metrics.notification_lag_events.set(0)
            self.metrics.notification_lag_seconds.set(0)
            self._cursor = None
            # Whether the log is followed is the leader's to say, too (its word expires).
            self.state.active = await store.get(self.verdict_key) == b"1"
            self._succeeded()
            return
        head = await self._current_id()
        last = await self._last_applied()
        if last is None:
            self.state.head = head
            await self._resync("no follower ran before on this cache", head, quiet=True)
            return
        if head < last:
            # HMS 2.3's sequence is written without a lock (HIVE-16886): a late transaction
            # can write it back below ids already visible. A reset shows nothing above it.
            above = await self._events_after(head)
            if not above:
                self.state.head = head
                await self._resync(f"event ids went back from {last} to {head} (log reset)", head)
                return
            head = max(head, *(e.event_id for e in above))
        self.state.head = head
        cursor = self._cursor_at(last)
        start = cursor.read_from()
        for _ in range(PAGES_PER_POLL):
            page = await self._events_after(start)
            held = await self._apply_page(cursor, page)
            complete = len(page) < BATCH
            gap = cursor.advance(head, page, time.time(), held=held, complete=complete)
            if gap is not None:
                self.metrics.notification_gaps.inc()
                await self._resync(f"events {gap.first}..{gap.last} are gone from the log", head)
                return
            # The position is saved, and the lease renewed, page by page: a long backlog
            # neither loses its progress to a failure nor its lease to a standby.
            if not await self._save(cursor):
                return
            self._lag(head, cursor, page)
            if held is not None:
                raise CacheUnavailable(
                    f"the invalidation of an event with id {held} did not reach the store; "
                    "following resumes there"
                )
            if complete or self._stopping.is_set():
                break
            top = max(e.event_id for e in page)
            # A page cut inside a run of equal ids: read that id again (applied ones are
            # recognised), unless the whole page is that one id.
            start = top - 1 if min(e.event_id for e in page) < top else top
        else:
            return  # a backlog: the next poll goes on from the position saved
        self._check_log_is_written(head)
        await self._publish()
        self._succeeded()

    def _cursor_at(self, last: int) -> LogCursor:
        """This leader's cursor; a new one (re-reading a stretch behind ``last``) when the
        position in the store is past where this proxy left it (another leader moved it).
        One behind it (a save that timed out) is this proxy's own: it knows more."""
        if self._cursor is None or self._cursor.last < last:
            self._cursor = LogCursor(last, time.time(), self.options.notification_window)
        return self._cursor

    async def _apply_page(self, cursor: LogCursor, page: list[Event]) -> int | None:
        """Apply the events of ``page`` not applied yet; the id of the first whose
        invalidation the store refused (``last`` must not pass it), if any."""
        for event in cursor.unapplied(page):
            if not await self._apply(event):
                return event.event_id
            cursor.applied(event)
        return None

    async def _save(self, cursor: LogCursor) -> bool:
        """Store the position and renew the lease; ``False`` if this proxy lost it."""
        store = self.engine.store
        saved = await store.set_if_leader(
            self.last_key, str(cursor.last).encode(), self.lease_key, self.token
        )
        if saved:
            saved = await store.lease(self.lease_key, self.token, self.options.follower_lease)
        if not saved:
            self.state.leader = False
            self._cursor = None
            return False
        self.state.last_applied = cursor.last
        return True

    async def _publish(self) -> None:
        """Tell the standbys whether the log is followed (for --cache-iceberg-tables auto);
        the word lasts a few polls, so a leader that stops polling stops vouching."""
        verdict = b"1" if self.state.active else b"0"
        await self.engine.store.put(self.verdict_key, verdict, self._fresh_for())

    def _fresh_for(self) -> float:
        return max(3 * self.options.notification_poll, self.options.follower_lease)

    def _succeeded(self) -> None:
        self._last_success = time.time()
        self.metrics.notification_last_poll.set(self._last_success)

    async def _apply(self, event: Event) -> bool:
        """Invalidate what ``event`` changed; ``False`` if the store did not take it (this
        proxy then serves no hits until it does, and the event is applied again)."""
        plan = invalidation_for(event, self.engine.planner)
        if plan is not None and not await self.engine.invalidate(plan, "notification"):
            return False
        kind = event.event_type.upper()
        self.metrics.notification_events.labels(kind if kind in KNOWN else "other").inc()
        return True

    async def _resync(self, reason: str, head: int, *, quiet: bool = False) -> None:
        (log.info if quiet else log.warning)(
            "notification log: %s; flushing the cache and following from event %d", reason, head
        )
        cursor = LogCursor(head, time.time(), self.options.notification_window)
        # What the log shows now is covered by the flush; only what shows up after it, in
        # the stretch the cursor reads back, is to be applied.
        covered = await self._events_after(cursor.read_from())
        await self.engine.flush()
        for event in covered:
            cursor.applied(event)
        await self.engine.store.set_if_leader(
            self.last_key, str(head).encode(), self.lease_key, self.token
        )
        self.state.last_applied = head
        self._cursor = cursor
        self._lag(head, self._cursor, [])
        await self._publish()
        self._succeeded()

    def _lag(self, head: int, cursor: LogCursor, events: list[Event]) -> None:
        last = cursor.last
        self.metrics.notification_last_event.set(last)
        self.metrics.notification_lag_events.set(max(0, head - last))
        pending = [e for e in events if e.event_id > last and not cursor.has_applied(e)]
        self.metrics.notification_lag_seconds.set(
            max(0.0, time.time() - pending[0].event_time) if pending else 0.0
        )

    def _check_log_is_written(self, head: int) -> None:
        """Writes went through this proxy but the log did not move: no listener writes it."""
        writes = self.engine.writes
        if self._writes_at_head is None or self._writes_at_head[0] != head:
            self._writes_at_head = (head, time.monotonic())
            self._writes_seen = writes
            if self._said_standing:
                self._said_standing = False
                log.info(
                    "the notification log moves again: writes that bypass the proxy are "
                    "seen within a poll"
                )
            self.state.active = True
            self.metrics.notification_active.set(1)
            return
        if writes > self._writes_seen and time.monotonic() - self._writes_at_head[1] > 30:
            if not self._said_standing:  # said once when it stops, not on every check after
                self._said_standing = True
                log.warning(
                    "writes went through the proxy but the notification log did not move in "
                    "30 s: is DbNotificationListener configured on the metastore? Until it is, "
                    "writes that bypass the proxy are seen within the TTLs only"
                )
            self.state.active = False
            self.metrics.notification_active.set(0)
            self._writes_seen = writes

    # -- metastore calls --------------------------------------------------------------------

    async def _call(self, method: str, **args: object) -> object:
        reply = await self.pool.ask_for_write(None, method, **args)  # not behind client reads
        if reply.header.type != MessageType.REPLY:
            raise LogUnavailable(f"{method} answered with an exception")
        try:
            result = idl.decode_result(method, reply.body)
        except ProtocolError as exc:
            raise LogUnavailable(str(exc)) from exc
        if result.success is None:
            raise LogUnavailable(f"{method} failed: {result}")
        return result.success

    async def _current_id(self) -> int:
        current = await self._call("get_current_notificationEventId")
        return int(current.eventId)  # type: ignore[attr-defined]

    async def _last_applied(self) -> int | None:
        raw = await self.engine.store.get(self.last_key)
        return int(raw) if raw else None

    async def _events_after(self, last: int) -> list[Event]:
        request = idl.module().NotificationEventRequest(lastEvent=last, maxEvents=BATCH)
        response = await self._call("get_next_notification", rqst=request)
        return [
            Event(
                int(e.eventId),
                int(e.eventTime or 0),
                str(e.eventType or ""),
                e.dbName,
                e.tableName,
                e.message or "",
                e.messageFormat,
            )
            for e in (response.events or [])  # type: ignore[attr-defined]
        ]
