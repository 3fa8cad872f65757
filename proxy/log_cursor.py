"""Where the notification follower stands in the log, when ids are shared and arrive late.

The log is not a clean sequence. HMS 2.3 gives several events the same id when writes
commit at once (HIVE-16886: the sequence is read and written without a lock), and events
of concurrent transactions can become visible after events with higher ids. A follower
that asks only for "events after the last id I applied" skips both. So the cursor keeps:

* ``last``: every id up to it is settled: each event seen with it applied, and no id in
  between missing. It moves only over ids it has seen; a missing id holds it back.
* ``floor``: where each poll starts reading, ``window`` seconds (at most ``MAX_IDS`` ids)
  behind ``last``. Events in the window are read again on every poll and recognised by their
  content, so an event that shares an id with one applied, or shows up late below ``last``,
  is applied when it appears, and nothing is applied twice in one leadership.
* holes: an id above ``last`` that is missing while higher ones are visible. It is waited
  for up to ``window`` seconds (a transaction still committing); after that, or at once if
  what follows it is older than the newest event by more than the window (purged by the
  metastore's cleaner, not in flight; both times by the metastore's clock), it is a gap
  the follower cannot replay: the cache is flushed.

Sans-I/O: the follower feeds it events and the clock, and asks what to read and apply.
A new leader does not know what its predecessor applied: it starts ``MAX_IDS`` behind and
applies that stretch again (invalidations only, harmless). After a flush, what the log
showed before it is marked applied (the flush covered it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.cache.events import Event

MAX_IDS = 1000  # the most ids re-read behind ``last``: one page of get_next_notification


def fingerprint(event: Event) -> tuple[object, ...]:
    """Two events are the same event when all they say is the same (the id alone is not)."""
    return (
        event.event_id,
        event.event_type,
        event.db,
        event.table,
        event.event_time,
        hash(event.message),
    )


@dataclass(frozen=True)
class Gap:
    first: int
    last: int


class LogCursor:
    def __init__(self, last: int, now: float, window: float) -> None:
        self.last = last
        self.window = window
        self.floor = max(0, last - MAX_IDS)
        self._applied: dict[tuple[object, ...], int] = {}
        self._ids: set[int] = set()  # ids above ``floor`` with an event applied
        # Where the cursor stood over the last ``window`` seconds; a new one stands back as far as
        # it reads, for a window, since it cannot know what came late to its predecessor.
        self._marks: deque[tuple[float, int]] = deque([(now, self.floor)])
        self._hole: tuple[int, float] | None = None  # the lowest missing id, since when
        self._newest = 0  # the newest event time seen (the metastore's clock, seconds)

    def read_from(self) -> int:
        """Ask the metastore for the events after this id."""
        return self.floor

    def unapplied(self, events: Iterable[Event]) -> list[Event]:
        """The events not applied yet, in id order."""
        fresh = [e for e in events if e.event_id > self.floor and not self.has_applied(e)]
        return sorted(fresh, key=lambda e: e.event_id)

    def has_applied(self, event: Event) -> bool:
        return fingerprint(event) in self._applied

    def applied(self, event: Event) -> None:
        self._applied[fingerprint(event)] = event.event_id
        self._ids.add(event.event_id)

    def advance(
        self, head: int, page: list[Event], now: float, *, held: int | None, complete: bool
    ) -> Gap | None:
        """Move ``last`` over the ids now settled, after a page of events was read and
        applied; ``held``: an id whose event could not be applied (``last`` stays below it,
        and so does the floor); ``complete``: the page reached the end of the log. A gap
        that can no longer be waited for is returned."""
        limit = head if held is None else min(head, held - 1)
        while self.last < limit and self.last + 1 in self._ids:
            self.last += 1
        if page:
            self._newest = max(self._newest, max(e.event_time for e in page))
        gap = self._judge_hole(head, page, now, held, complete)
        self._marks.append((now, self.last))
        while len(self._marks) > 1 and self._marks[1][0] <= now - self.window:
            self._marks.popleft()
        self.floor = max(self._marks[0][1], self.last - MAX_IDS, 0)
        if held is not None:
            self.floor = min(self.floor, held - 1)  # read again until it is applied
        self._forget_below(self.floor)
        return gap

    def _judge_hole(
        self, head: int, page: list[Event], now: float, held: int | None, complete: bool
    ) -> Gap | None:
        missing = self.last + 1
        if held is not None or missing > head:
            self._hole = None
            return None
        after = [e for e in page if e.event_id > missing]
        if not after:
            if not complete:
                return None  # the next page tells
            # The sequence says ``head`` but nothing above ``last`` is visible: in Hive the
            # sequence and the event commit together, so these were purged (or never logged).
            return Gap(missing, head)
        if self._hole is None or self._hole[0] != missing:
            self._hole = (missing, now)
        first_after = min(after, key=lambda e: e.event_id)
        # Older than the window by the metastore's own clock (the newest event it logged):
        # purged by its cleaner, not a transaction still committing.
        old = first_after.event_time < self._newest - self.window
        if old or now - self._hole[1] >= self.window:
            return Gap(missing, first_after.event_id - 1)
        return None

    def _forget_below(self, floor: int) -> None:
        if not self._applied or min(self._ids) > floor:
            return
        self._applied = {fp: i for fp, i in self._applied.items() if i > floor}
        self._ids = {i for i in self._ids if i > floor}

    def waiting_for(self) -> int | None:
        """The missing id the cursor is waiting for, if any."""
        return self._hole[0] if self._hole else None
