"""When a caller may take a metastore connection: the limits, and the lines of those waiting.

At ``--upstream-max-connections`` (a protection for the HMS: never more connections open) a
caller waits its turn for as long as the call itself may take (``--upstream-read-timeout``
for a client's call, the own calls' bound for the proxy's): talking to the HMS directly,
such a call would have queued on the HMS's thread pool and been slow, not failed, so the
proxy fails a call for its own limit no sooner than for slowness.

Three kinds of caller wait apart, each with its own room:

* **writes** may take every connection; reads all but an eighth (see :func:`read_share`);
* **heavy** reads (many partitions: :mod:`proxy.guard`) are reads that may hold at most
  ``heavy_limit`` connections at once, so that a pile of them never takes the connections
  small calls need, and the metastore builds only so many huge replies at a time;
* every other read.

Within a kind, waiters are served fairly across **tenants** (a user, or a client address:
:class:`Lane`), round-robin: one turn each, each tenant's own calls in arrival order. A
tenant with 200 calls queued delays another's one call by one turn, not 200. Across kinds,
the earliest waiter that has room goes first.

The pool (:mod:`.pool`) decides which connection a caller gets; :class:`Admission` decides
when, counting the connections open and those held by reads and heavy reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from proxy.metrics import Metrics
from proxy.upstream.connection import UpstreamConnection
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.idle import IdleConnections

T = TypeVar("T")
LaneKind = Literal["read", "write", "heavy"]
KINDS: tuple[LaneKind, ...] = ("read", "write", "heavy")


def read_share(limit: int) -> int:
    """How many of ``limit`` connections reads may hold at once: all but an eighth (and
    all but one from two connections on; 56 of the default 64).

    Writes get capacity of their own rather than a place at the head of the queue: a write
    fences its tables, so every read of them goes to the metastore until the write is
    answered; that is when the pool fills up, with reads the metastore is slow on. At the
    head of the queue the write would still wait for one of them to finish, prolonging the
    pile-up it caused and risking its own bound; with a reserve it starts at once."""
    return max(1, limit - max(1, limit // 8))


class Lane:
    """How a caller waits: as its ``tenant`` (fair shares are kept between tenants: a user,
    or a client address), and whether its call is ``heavy``; ``group``: the tenant's class
    in the limits file, for metrics (a bounded label). The tenant is asked of ``who`` only
    when the caller has to wait (naming a client's address costs microseconds, and most
    calls never wait)."""

    __slots__ = ("_tenant", "_who", "group", "heavy")

    def __init__(
        self,
        tenant: str | None = "",
        heavy: bool = False,
        group: str = "default",
        who: Callable[[], str] | None = None,
    ) -> None:
        self._tenant = tenant if who is None else None
        self._who = who
        self.heavy = heavy
        self.group = group

    @property
    def tenant(self) -> str:
        if self._tenant is None:
            self._tenant = self._who() if self._who is not None else ""
            self._who = None
        return self._tenant

    def heavier(self) -> Lane:
        """The same caller, for a heavy call."""
        return Lane(self._tenant, True, self.group, self._who)


ANONYMOUS = Lane()


@dataclass(eq=False)
class _Waiter:
    """A caller waiting its turn for a connection."""

    ticket: int  # arrival order
    kind: LaneKind
    tenant: str
    woken: asyncio.Future[None]


class _Line:
    """The waiters of one kind: round-robin across tenants, each tenant's in arrival
    order. The tenant at the front has the next turn; once served it goes to the back."""

    __slots__ = ("_tenants", "count")

    def __init__(self) -> None:
        self._tenants: dict[str, deque[_Waiter]] = {}  # (insertion order: the rotation)
        self.count = 0

    def add(self, waiter: _Waiter) -> None:
        self._tenants.setdefault(waiter.tenant, deque()).append(waiter)
        self.count += 1

    def head(self) -> _Waiter | None:
        for waiters in self._tenants.values():
            return waiters[0]
        return None

    def remove(self, waiter: _Waiter, *, served: bool) -> None:
        tenants = self._tenants
        waiters = tenants[waiter.tenant]
        waiters.remove(waiter)
        self.count -= 1
        if not waiters:
            del tenants[waiter.tenant]
        elif served:  # its tenant had its turn: to the back of the rotation
            del tenants[waiter.tenant]
            tenants[waiter.tenant] = waiters


class Admission:
    """The connections open (idle or in use, and those being opened), those held by reads
    and by heavy reads, and the callers waiting their turn, by kind."""

    def __init__(
        self, limit: int, idle: IdleConnections, metrics: Metrics, *, heavy_limit: int = 0
    ) -> None:
        self.limit = limit
        self.read_share = read_share(limit)
        # 0: heavy reads are reads like any other.
        self.heavy_limit = min(heavy_limit, self.read_share) if heavy_limit > 0 else 0
        # At the limit an idle connection is still room: taken, or closed to make a slot.
        self._idle = idle
        self._metrics = metrics
        self._open = 0  # idle + in use
        self._reads_held = 0  # connections in use by reads (or being opened for one)
        self.heavy_held = 0  # of which by heavy reads
        self._lines: dict[LaneKind, _Line] = {kind: _Line() for kind in KINDS}
        self._waiting = 0
        self._tickets = itertools.count()

    @property
    def open(self) -> int:
        """Connections open, idle or in use, and slots counted for ones being opened."""
        return self._open

    @property
    def at_limit(self) -> bool:
        return self._open >= self.limit

    def kind_of(self, write: bool, lane: Lane) -> LaneKind:
        if write:
            return "write"
        return "heavy" if lane.heavy and self.heavy_limit else "read"

    def read_at_once(self) -> bool:
        """Whether a (small) read may take a connection without a turn: reads hold fewer
        than their share, and no one waits who could take one (heavy calls at their own
        limit do not hold small ones up)."""
        if self._reads_held >= self.read_share:
            return False
        return not self._waiting or self._first_in_line() is None

    async def wait_turn(
        self,
        kind: LaneKind,
        deadline: float,
        patience: float,
        take: Callable[[], T],
        lane: Lane = ANONYMOUS,
    ) -> T:
        """Wait for this caller's turn (until ``deadline``, ``patience`` seconds after it
        asked), then return what ``take`` gives: it runs while the turn is the caller's, and
        counts what it takes (:meth:`hold`, :meth:`opened`). A newcomer queues behind every
        waiter that could take what it would. Raises UpstreamUnavailable past ``deadline``."""
        waiter: _Waiter | None = None
        queued_at = 0.0
        served = False
        try:
            while True:
                if waiter is not None:  # wakes from here on are kept for the wait below
                    waiter.woken = asyncio.get_running_loop().create_future()
                if self._may_take(waiter, kind):
                    served = True
                    return take()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._busy(kind, patience)
                if waiter is None:
                    waiter = self._enqueue(kind, lane.tenant)
                    queued_at = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.woken, remaining)
        finally:
            if waiter is not None:
                self._lines[kind].remove(waiter, served=served)
                self._waiting -= 1
                self._update_waiting(kind)
                waited = time.monotonic() - queued_at
                self._metrics.upstream_wait.labels(kind, lane.group).observe(waited)
                self.wake_next()  # its turn, if it had come, passes on

    def hold(self, kind: LaneKind) -> None:
        """The caller whose turn it is takes a connection: a read's counts against the
        reads' share, a heavy read's against the heavy ones' too (until :meth:`unhold`, or
        :meth:`free_slot`)."""
        if kind != "write":
            self._reads_held += 1
            if kind == "heavy":
                self.heavy_held += 1

    def opened(self) -> None:
        """A slot is counted for a new connection (until :meth:`gone` or :meth:`free_slot`)."""
        self._open += 1

    def unhold(self, conn: UpstreamConnection) -> None:
        """``conn`` is no longer in use by a read: one more read may take a connection."""
        if conn.held_by_read:
            conn.held_by_read = False
            self._reads_held -= 1
        if conn.held_by_heavy:
            conn.held_by_heavy = False
            self.heavy_held -= 1

    def gone(self, conn: UpstreamConnection) -> None:
        """``conn`` was closed: it stops counting, and the next in line may take its place."""
        self.unhold(conn)
        self._open -= 1
        self.wake_next()

    def free_slot(self, kind: LaneKind) -> None:
        """A slot counted for a new connection that was not opened after all."""
        self._open -= 1
        if kind != "write":
            self._reads_held -= 1
            if kind == "heavy":
                self.heavy_held -= 1
        self.wake_next()

    def wake_next(self) -> None:
        """Room may have come: wake the waiter whose turn it is (once it has taken its
        connection, it wakes the next)."""
        if not self._waiting:
            return  # no one waits (the usual, on every release): nothing to look for
        first = self._first_in_line()
        if first is not None and not first.woken.done():
            first.woken.set_result(None)

    def _enqueue(self, kind: LaneKind, tenant: str) -> _Waiter:
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._tickets), kind, tenant, future)
        self._lines[kind].add(waiter)
        self._waiting += 1
        self._update_waiting(kind)
        return waiter

    def _update_waiting(self, kind: LaneKind) -> None:
        self._metrics.upstream_waiting.labels(kind).set(self._lines[kind].count)

    def _room(self, kind: LaneKind) -> bool:
        """Whether a caller of this kind could take a connection now (an idle one, a slot
        left, or a slot made by closing an idle connection of another identity)."""
        if self._open >= self.limit and not self._idle.count:
            return False
        if kind == "write":
            return True
        if self._reads_held >= self.read_share:
            return False
        return kind == "read" or self.heavy_held < self.heavy_limit

    def _first_in_line(self) -> _Waiter | None:
        """The earliest of the waiters whose turn it is in their line, among the lines with
        room."""
        first: _Waiter | None = None
        for kind, line in self._lines.items():
            if line.count and self._room(kind):
                head = line.head()
                if head is not None and (first is None or head.ticket < first.ticket):
                    first = head
        return first

    def _may_take(self, waiter: _Waiter | None, kind: LaneKind) -> bool:
        """Whether it is the turn of ``waiter`` (or of a newcomer: ``None``)."""
        return self._room(kind) and self._first_in_line() is waiter

    def _busy(self, kind: LaneKind, patience: float) -> UpstreamUnavailable:
        if not self._room("write"):  # every connection in use
            return UpstreamUnavailable(
                f"all {self.limit} metastore connections busy for {patience:g} s"
            )
        if kind == "heavy" and self._reads_held < self.read_share:
            return UpstreamUnavailable(
                f"all {self.heavy_limit} metastore connections heavy calls may hold "
                f"(--heavy-max-concurrent) busy for {patience:g} s"
            )
        return UpstreamUnavailable(
            f"all {self.read_share} metastore connections reads may hold (of {self.limit}) "
            f"busy for {patience:g} s"
        )
