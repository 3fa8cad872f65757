"""Lock fences at run time: opened before a ``lock`` is forwarded, ended by what follows it.

The rules and the stored form are in :mod:`proxy.cache.locks`; this is the part that talks
to the store. The costs: the ``lock`` call waits for one store round trip (the fence and the
invalidation, one pipeline) before it is forwarded; everything else (recording the lock id,
marking it granted, ending the fence at ``unlock``, extending it at ``check_lock`` and
``heartbeat``) happens after the client has its reply, off its clock, so those calls cost
nothing. That is safe because a fence that ends late only sends a few more reads to the
metastore, and the record of a lock id is written while the ``lock`` reply is on its way:
before the client can even ask for the read the fence protects, let alone ``unlock``.

If the store cannot take a fence (Redis down or slow), the lock goes ahead all the same
(fail open) and its invalidation stays pending in this proxy, which then serves no hits
until it is applied. Other proxies that still reach Redis cannot be fenced by this one;
against that split the metastore's own check (``proxy.iceberg``) refuses a stale commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy import idl
from proxy.cache import locks
from proxy.cache.keys import Bump, Naming
from proxy.cache.locks import LockPlan, LockRecord
from proxy.cache.store import CacheUnavailable, Store
from proxy.memo import BoundedMemo, Footprint, footprint_of
from proxy.metrics import Metrics
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# Locks and fences this proxy keeps track of in memory, at most, in entries and in bytes (a
# client can take any number of locks, each naming any number of tables; the fences in the
# store expire by themselves, whatever is forgotten here).
MAX_TRACKED = 10_000
TRACKED_BYTES = 8 << 20
SWEEP_SECONDS = 5.0


@dataclass(slots=True)
class Ticket:
    """A fence this proxy opened, until it is seen closed or expired (its deadline is the
    store's: another proxy may extend it)."""

    record: LockRecord
    lockid: int | None = None


class LockFences:
    def __init__(
        self,
        store: Store,
        naming: Naming,
        metrics: Metrics,
        seconds: float,
        unapplied: Callable[[tuple[Bump, ...]], None],
    ) -> None:
        self.store = store
        self.naming = naming
        self.metrics = metrics
        self.seconds = seconds
        self._unapplied = unapplied  # an invalidation the store did not take: keep it pending
        self._opened: BoundedMemo[str, Ticket] = BoundedMemo(MAX_TRACKED, TRACKED_BYTES)
        self._known: BoundedMemo[int, LockRecord] = BoundedMemo(MAX_TRACKED, TRACKED_BYTES)
        # Fences lifted here lately: bookkeeping that comes after the lift (a grant, an
        # extension, in another task) must not bring them back.
        self._lifted: BoundedMemo[str, bool] = BoundedMemo(MAX_TRACKED, 1 << 20)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.seconds > 0

    def footprint(self) -> Footprint:
        return footprint_of(self._opened, self._known, self._lifted)

    # -- before the lock -------------------------------------------------------------------

    async def before_lock(self, body: bytes) -> Ticket | None:
        """Fence and invalidate what a ``lock`` request names; ``None`` if it names nothing
        (or cannot be read: the metastore will refuse it)."""
        if not self.enabled:
            return None
        try:
            plan = locks.plan(idl.decode_args("lock", body), self.naming)
        except ProtocolError:
            return None
        if plan is None:
            return None
        ticket = Ticket(LockRecord(os.urandom(8).hex(), plan.fences, plan.txnid))
        try:
            # Refused while Redis serves reads: retried until no proxy trusts what it
            # reads there (store.insist), before the lock goes ahead unfenced.
            await self.store.insist(
                lambda: self.store.mark(self._items(ticket.record), self._deadline(), plan.bumps)
            )
        except CacheUnavailable as exc:
            log.warning(
                "cache: could not fence the tables of a lock (%s); this proxy serves no hits "
                "until redis takes their invalidation",
                exc or "timeout",
            )
            self._unapplied(plan.bumps)
        self._track(ticket)
        self.metrics.lock_fences.labels("opened").inc()
        return ticket

    # -- after the reply -------------------------------------------------------------------

    def after(self, method: str, body: bytes, ticket: Ticket | None, reply: Message) -> None:
        """What the metastore answered ``method``: settle fences, off the caller's clock."""
        if not self.enabled:
            return
        task = asyncio.get_running_loop().create_task(self._after(method, body, ticket, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after(self, method: str, body: bytes, ticket: Ticket | None, reply: Message) -> None:
        try:
            if method == "lock":
                if ticket is not None:
                    await self._locked(ticket, reply)
                return
            try:
                request = idl.decode_args(method, body)
            except ProtocolError:
                return
            lock_ids, txn_ids = locks.lock_ids_of(method, request)
            if method == "check_lock":
                answer = locks.read_lock_reply(method, reply.header.type, reply.body)
                for lockid in lock_ids:
                    await self._checked(lockid, answer, reply)
            elif method in ("unlock", "heartbeat"):
                if reply.header.type != MessageType.REPLY:
                    return  # the metastore failed: the lock's state is unknown, keep it
                if method == "unlock" and _declared(reply, "unlock", "o2"):
                    return  # TxnOpenException: a transaction's lock, still held
                alive = method == "heartbeat" and not _declared(reply, method)
                for txnid in txn_ids:  # a transaction's heartbeat keeps all its locks
                    lock_ids += await self._transaction_locks(txnid)
                for lockid in dict.fromkeys(lock_ids):
                    if alive:
                        await self._extend(lockid, granted=False)
                    else:  # unlocked, or the lock is gone (NoSuchLock, TxnAborted)
                        await self._end(lockid)
            elif reply.header.type == MessageType.REPLY:  # commit/abort: the txn's locks go
                for txnid in txn_ids:
                    await self._end_transaction(txnid)
        except CacheUnavailable as exc:
            log.debug(
                "cache: lock bookkeeping after %s failed (%s); the fences end at their deadline",
                method,
                exc or "timeout",
            )
        except Exception:
            log.exception("cache: lock bookkeeping after %s failed", method)

    async def _locked(self, ticket: Ticket, reply: Message) -> None:
        answer = locks.read_lock_reply("lock", reply.header.type, reply.body)
        if answer.lockid is None:
            # A declared exception (NoSuchTxn, TxnAborted) means no lock. A metastore error
            # (a TApplicationException) does not tell: the lock may have been taken before it
            # failed (Java Iceberg then finds it with show_locks and goes on), so the fence
            # holds until its deadline, as when no answer came.
            if reply.header.type == MessageType.REPLY and _declared(reply, "lock"):
                await self._lift(ticket.record)
            return
        if answer.state not in (locks.ACQUIRED, locks.WAITING):
            await self._lift(ticket.record)  # refused: no lock, nothing to protect
            return
        ticket.lockid = answer.lockid
        self._remember(answer.lockid, ticket.record)
        await self.store.put(
            locks.lock_key(self.naming, answer.lockid), ticket.record.encode(), self._life()
        )
        if ticket.record.txnid is not None:
            await self._add_to_transaction(ticket.record.txnid, answer.lockid)
        if answer.state == locks.ACQUIRED:
            await self._grant(ticket.record)

    async def _checked(self, lockid: int, answer: locks.LockAnswer, reply: Message) -> None:
        if answer.state == locks.ACQUIRED:
            await self._extend(lockid, granted=True)
        elif answer.state == locks.WAITING:
            await self._extend(lockid, granted=False)
        elif reply.header.type == MessageType.REPLY:  # ABORT, NOT_ACQUIRED, NoSuchLock...
            await self._end(lockid)

    # -- the store side --------------------------------------------------------------------

    async def _record(self, lockid: int) -> LockRecord | None:
        known = self._known.get(lockid)
        if known is not None:
            return known
        raw = await self.store.get(locks.lock_key(self.naming, lockid))
        return LockRecord.decode(raw) if raw else None

    async def _grant(self, record: LockRecord) -> None:
        if record.fence_id in self._lifted:
            return
        await self.store.mark(locks.granted_items(record.fence_id, record.fences), self._deadline())

    async def _extend(self, lockid: int, *, granted: bool) -> None:
        record = await self._record(lockid)
        if record is None or record.fence_id in self._lifted:
            return
        items = self._items(record)
        if granted:
            items += locks.granted_items(record.fence_id, record.fences)
        await self.store.mark(items, self._deadline())

    async def _end(self, lockid: int) -> None:
        record = await self._record(lockid)
        self._known.pop(lockid)
        if record is not None:
            await self._lift(record)
        await self.store.delete(locks.lock_key(self.naming, lockid))

    async def _lift(self, record: LockRecord) -> None:
        self._lifted.put(record.fence_id, True, len(record.fence_id))
        removed = await self.store.unmark(
            self._items(record) + locks.granted_items(record.fence_id, record.fences)
        )
        if removed:  # not already ended (by an alter of the table, or another proxy)
            self.metrics.lock_fences.labels("closed").inc()
        self._opened.pop(record.fence_id)
        self._gauge()

    # A transaction's locks are fields of one hash (as fence fields are: one HSET each, so two
    # proxies adding locks of one transaction at once lose neither).

    async def _add_to_transaction(self, txnid: int, lockid: int) -> None:
        key = locks.txn_key(self.naming, txnid)
        await self.store.mark([(key, str(lockid))], self._deadline() + 60)

    async def _transaction_locks(self, txnid: int) -> list[int]:
        key = locks.txn_key(self.naming, txnid)
        found = (await self.store.marks([key])).get(key, {})
        return [int(name) for name in found if name.isdigit()]

    async def _end_transaction(self, txnid: int) -> None:
        ids = await self._transaction_locks(txnid)
        for lockid in ids:
            await self._end(lockid)
        if ids:
            key = locks.txn_key(self.naming, txnid)
            await self.store.unmark([(key, str(lockid)) for lockid in ids])

    # -- bookkeeping in this process -------------------------------------------------------

    def _items(self, record: LockRecord) -> list[tuple[str, str]]:
        return locks.fence_items(record.fence_id, record.fences)

    def _deadline(self) -> float:
        return time.time() + self.seconds

    def _life(self) -> float:
        return self.seconds + 60

    def _track(self, ticket: Ticket) -> None:
        self._opened.put(ticket.record.fence_id, ticket, ticket.record.size())
        self._gauge()

    def _remember(self, lockid: int, record: LockRecord) -> None:
        self._known.put(lockid, record, record.size())

    def _gauge(self) -> None:
        self.metrics.lock_fences_active.set(len(self._opened))

    # -- expiry ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.enabled and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        for task in [self._sweeper, *self._tasks]:
            if task is not None:
                task.cancel()
        for task in [self._sweeper, *self._tasks]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._sweeper = None

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep()
            except CacheUnavailable:
                continue
            except Exception:
                log.exception("cache: checking lock fences failed")

    async def sweep(self) -> None:
        """Forget fences closed anywhere; count and remove those past their deadline."""
        if not len(self._opened):
            return
        tickets = self._opened.values()
        keys = sorted({f.key for t in tickets for f in t.record.fences})
        found = await self.store.marks(keys)
        now = time.time()
        # Whatever has passed its deadline on these hashes goes, whoever left it there (a
        # proxy that died, bookkeeping that came late): look-ups read every field.
        expired = [
            (k, name) for k, fields in found.items() for name, d in fields.items() if d <= now
        ]
        for ticket in tickets:
            items = self._items(ticket.record)
            deadlines = [found.get(key, {}).get(name) for key, name in items]
            live = [d for d in deadlines if d is not None]
            if not live:  # closed, here or by another proxy
                self._opened.pop(ticket.record.fence_id)
            elif max(live) <= now:
                expired += items + locks.granted_items(ticket.record.fence_id, ticket.record.fences)
                self._opened.pop(ticket.record.fence_id)
                if ticket.lockid is not None:
                    self._known.pop(ticket.lockid)
                self.metrics.lock_fences.labels("expired").inc()
                log.info(
                    "cache: a lock fence reached its deadline (%g s) without an unlock",
                    self.seconds,
                )
        if expired:
            await self.store.unmark(sorted(set(expired)))
        self._gauge()


def _declared(reply: Message, method: str, name: str | None = None) -> bool:
    """Whether ``reply`` carries a declared exception (``name``: that one)."""
    if reply.header.type != MessageType.REPLY:
        return False
    try:
        result = idl.decode_result(method, reply.body)
    except ProtocolError:
        return False
    fields = [s[1] for s in type(result).thrift_spec.values() if s[1] != "success"]
    names = [name] if name is not None else fields
    return any(getattr(result, n, None) is not None for n in names)


__all__ = ["LockFences", "LockPlan", "Ticket"]
