"""When a caller may take a metastore connection: the limits, and the line of those waiting.

At ``--upstream-max-connections`` (a protection for the HMS: never more connections open) a
caller waits its turn, first come, first served, for as long as the call itself may take
(``--upstream-read-timeout`` for a client's call, the own calls' bound for the proxy's):
talking to the HMS directly, such a call would have queued on the HMS's thread pool and been
slow, not failed, so the proxy fails a call for its own limit no sooner than for slowness.
Reads may hold all but an eighth of the connections; the rest is the writes' (see
:func:`read_share`).

The pool (:mod:`.pool`) decides which connection a caller gets; :class:`Admission` decides
when, counting the connections open and those held by reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from proxy.metrics import Metrics
from proxy.upstream.connection import UpstreamConnection
from proxy.upstream.errors import UpstreamUnavailable
from proxy.upstream.idle import IdleConnections

T = TypeVar("T")


def read_share(limit: int) -> int:
    """How many of ``limit`` connections reads may hold at once: all but an eighth (and
    all but one from two connections on; 56 of the default 64).

    Writes get capacity of their own rather than a place at the head of the queue: a write
    fences its tables, so every read of them goes to the metastore until the write is
    answered; that is when the pool fills up, with reads the metastore is slow on. At the
    head of the queue the write would still wait for one of them to finish, prolonging the
    pile-up it caused and risking its own bound; with a reserve it starts at once."""
    return max(1, limit - max(1, limit // 8))


@dataclass(eq=False)
class _Waiter:
    """A caller waiting its turn for a connection."""

    ticket: int  # arrival order
    write: bool
    woken: asyncio.Future[None]


class Admission:
    """The connections open (idle or in use, and those being opened), those held by reads,
    and the callers waiting their turn, reads and writes apart."""

    def __init__(self, limit: int, idle: IdleConnections, metrics: Metrics) -> None:
        self.limit = limit
        self.read_share = read_share(limit)
        # At the limit an idle connection is still room: taken, or closed to make a slot.
        self._idle = idle
        self._metrics = metrics
        self._open = 0  # idle + in use
        self._reads_held = 0  # connections in use by reads (or being opened for one)
        # Callers waiting their turn, reads and writes apart, each in arrival order.
        self._queues: dict[bool, deque[_Waiter]] = {False: deque(), True: deque()}
        self._tickets = itertools.count()

    @property
    def open(self) -> int:
        """Connections open, idle or in use, and slots counted for ones being opened."""
        return self._open

    @property
    def at_limit(self) -> bool:
        return self._open >= self.limit

    def read_at_once(self) -> bool:
        """Whether a read may take a connection without a turn: no one waits, and reads
        hold fewer than their share."""
        queues = self._queues
        return not (queues[False] or queues[True]) and self._reads_held < self.read_share

    async def wait_turn(
        self, write: bool, deadline: float, patience: float, take: Callable[[], T]
    ) -> T:
        """Wait for this caller's turn (until ``deadline``, ``patience`` seconds after it
        asked), then return what ``take`` gives: it runs while the turn is the caller's, and
        counts what it takes (:meth:`hold`, :meth:`opened`). A newcomer queues behind every
        waiter that could take what it would. Raises UpstreamUnavailable past ``deadline``."""
        waiter: _Waiter | None = None
        queued_at = 0.0
        try:
            while True:
                if waiter is not None:  # wakes from here on are kept for the wait below
                    waiter.woken = asyncio.get_running_loop().create_future()
                if self._may_take(waiter, write):
                    return take()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._busy(write, patience)
                if waiter is None:
                    waiter = self._enqueue(write)
                    queued_at = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.woken, remaining)
        finally:
            if waiter is not None:
                self._queues[waiter.write].remove(waiter)
                self._update_waiting(write)
                self._metrics.upstream_wait.observe(time.monotonic() - queued_at)
                self.wake_next()  # its turn, if it had come, passes on

    def hold(self, *, write: bool) -> None:
        """The caller whose turn it is takes a connection: a read's counts against the
        reads' share (until :meth:`unhold`, or :meth:`free_slot`)."""
        if not write:
            self._reads_held += 1

    def opened(self) -> None:
        """A slot is counted for a new connection (until :meth:`gone` or :meth:`free_slot`)."""
        self._open += 1

    def unhold(self, conn: UpstreamConnection) -> None:
        """``conn`` is no longer in use by a read: one more read may take a connection."""
        if conn.held_by_read:
            conn.held_by_read = False
            self._reads_held -= 1

    def gone(self, conn: UpstreamConnection) -> None:
        """``conn`` was closed: it stops counting, and the next in line may take its place."""
        self.unhold(conn)
        self._open -= 1
        self.wake_next()

    def free_slot(self, *, write: bool) -> None:
        """A slot counted for a new connection that was not opened after all."""
        self._open -= 1
        if not write:
            self._reads_held -= 1
        self.wake_next()

    def wake_next(self) -> None:
        """Room may have come: wake the waiter whose turn it is (once it has taken its
        connection, it wakes the next)."""
        queues = self._queues
        if not (queues[False] or queues[True]):
            return  # no one waits (the usual, on every release): nothing to look for
        first = self._first_in_line()
        if first is not None and not first.woken.done():
            first.woken.set_result(None)

    def _enqueue(self, write: bool) -> _Waiter:
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._tickets), write, future)
        self._queues[write].append(waiter)
        self._update_waiting(write)
        return waiter

    def _update_waiting(self, write: bool) -> None:
        kind = "write" if write else "read"
        self._metrics.upstream_waiting.labels(kind).set(len(self._queues[write]))

    def _room(self, write: bool) -> bool:
        """Whether a caller of this kind could take a connection now (an idle one, a slot
        left, or a slot made by closing an idle connection of another identity)."""
        full = self._open >= self.limit and not self._idle.count
        return not full and (write or self._reads_held < self.read_share)

    def _first_in_line(self) -> _Waiter | None:
        """The earliest waiter that could take a connection now."""
        heads = [q[0] for write, q in self._queues.items() if q and self._room(write)]
        return min(heads, key=lambda w: w.ticket, default=None)

    def _may_take(self, waiter: _Waiter | None, write: bool) -> bool:
        """Whether it is the turn of ``waiter`` (or of a newcomer: ``None``)."""
        return self._room(write) and self._first_in_line() is waiter

    def _busy(self, write: bool, patience: float) -> UpstreamUnavailable:
        if not self._room(write=True):  # every connection in use
            return UpstreamUnavailable(
                f"all {self.limit} metastore connections busy for {patience:g} s"
            )
        return UpstreamUnavailable(
            f"all {self.read_share} metastore connections reads may hold (of {self.limit}) "
            f"busy for {patience:g} s"
        )
