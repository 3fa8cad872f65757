"""The in-process front of a shared store: decoded replies, LRU, bounded in bytes.

An L1 entry is only a copy: it is served on the same fingerprint rule as the store's entry
(against the current versions: read from the store, or from its coherent copy in process,
see :mod:`.mirror`), and only until the time the store's entry had left to live.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.cache.entry import Entry, Payload
from proxy.cache.scopes import NOWHERE, Scope, Scopes

if TYPE_CHECKING:
    from proxy.cache.hit_counts import HitCount
    from proxy.cache.store import Standing

_stamp = operator.attrgetter("judged_under")
_expires = operator.attrgetter("expires_at")
_entry_expires = operator.attrgetter("entry.expires_at")
_USED = itertools.repeat("used")
_TRUE = itertools.repeat(True)

# Item.judged_under of an item not judged since it was kept, and of one no longer held
# (never stamped again, see Item.stamp: a stamp that stands says the item is held). No
# scope's mark is either.
UNJUDGED = -1
RETIRED = -2
# What an item's hits keep beside it once one is answered at once (its HitCount, the reply's
# prepared parts: a copy of its header, a view of the rest, the tuple), charged to its size:
# ~580 bytes by tracemalloc (tests/unit/test_memo.py holds the charge to what is measured).
PREPARED_BYTES = 700

# What an entry costs beyond its key and payload (the Entry, the Item, the dict slot).
OVERHEAD_BYTES = 250


@dataclass(slots=True, eq=False, weakref_slot=True)
class Item:
    """An entry held, with its judgement and what its hits prepared. Compared by identity
    (a request's partitions are told apart by their items, see :func:`judged`), and weakly
    referable (nothing that remembers an item keeps one alive that L1 let go)."""

    key: str
    entry: Entry
    # Monotonic: the sooner of the end of its copy here and the entry's expiry. The one
    # clock a hit in process is checked against (see stands).
    expires_at: float
    size: int
    # The one stamp of a judgement in process: the mark its scope (the version hashes it
    # was judged from, see .scopes) had when it was last judged a hit (a whole reply, see
    # WholeReads.judged_now) or current (a partition, see PartitionReads.lookup and
    # .assembled); UNJUDGED: not since it was kept; RETIRED: no longer held.
    judged_under: int = UNJUDGED
    scope: Scope = NOWHERE
    # Used by a hit that did not move it in LRU order (see judged): L1._evict gives
    # it a second chance.
    used: bool = False
    # A whole reply answered at once: how its hits are counted, and the reply's parts as
    # every such hit writes them (the header up to its seqid, the rest after it, the
    # outcome label; see proxy.handler.again.prepared). The parts go when it is retired.
    counted: HitCount | None = None
    answer: tuple[bytes, Payload, str] | None = None

    def stamp(self, mark: int, scope: Scope) -> None:
        """Judged a hit, or current, from ``scope``'s hashes as they were at its ``mark``
        (read before them; if still held: a read that looked the item up before an await
        may judge it after L1 let it go)."""
        if self.judged_under != RETIRED:
            self.judged_under = mark
            self.scope = scope

    def retire(self) -> None:
        """It left L1: nothing judged of it stands again, and its prepared reply goes
        (whoever still remembers it weakly finds it gone, or retired)."""
        self.judged_under = RETIRED
        self.answer = None
        self.scope = NOWHERE  # (its scope goes with the last item judged under it)


def stands(item: Item, standing: Standing, now: float) -> bool:
    """The hit rule in process, for every way that serves a hit judged before without
    judging it again (a call answered again, a repeated request, a whole reply kept): its
    scope has not moved since it was judged (nothing a version look-up answers for the
    hashes it read has changed: :mod:`.scopes`), what the store keeps in process is trusted
    at ``now`` (monotonic, :class:`.store.Standing`), and ``item`` has not expired (a
    retired one's stamp is no mark). :func:`current` is the same rule for a request's
    partitions, and ``_assemble.c`` its C twin; ``Again.answer`` writes it out (a call
    costs that path several microseconds cold), held to it by tests/unit/test_again.py."""
    return item.judged_under == item.scope.mark and now <= standing.until and now < item.expires_at


def current(items: list[Item], mark: int, now: float, wall: float) -> bool:
    """Whether every one of ``items`` (at least one) is held, unexpired (``now`` monotonic,
    ``wall`` Unix time) and judged current at ``mark``, their table's scope's (a mark is
    given to one scope once, so a stamp equal to it says the item was judged under that
    scope as it stands; a stamp that stands says the item is held): :func:`stands` for
    each (the caller checked the store is trusted at ``now``)."""
    # A request's hundred partitions: each test one loop in C (map), not a Python
    # iteration per partition with its attribute look-ups.
    # (``now <`` each, not ``min() <= now``: a NaN is never later than anything.)
    return (
        bool(items)
        and set(map(_stamp, items)) == {mark}
        and all(map(operator.lt, itertools.repeat(now), map(_expires, items)))
        and all(map(operator.lt, itertools.repeat(wall), map(_entry_expires, items)))
    )


def judged(items: list[Item], mark: int, now: float, wall: float) -> bool:
    """Whether ``items`` are :func:`current` and distinct (two names of one partition are
    not); if so, they are used (L1's LRU order)."""
    if not current(items, mark, now, wall) or len(set(items)) != len(items):
        return False
    # Marked used rather than moved to the end: a hundred OrderedDict moves touch as much
    # cold memory as the rest of the test (see L1._evict).
    deque(map(setattr, items, _USED, _TRUE), maxlen=0)
    return True


class L1:
    """``scopes``: those its items are judged under (at most one an item), whose bytes count
    against ``max_bytes`` with the items' own."""

    def __init__(self, max_bytes: int, scopes: Scopes | None = None) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Item] = OrderedDict()
        self.bytes = 0  # the items' own
        self.scopes = scopes if scopes is not None else Scopes()

    def held_bytes(self) -> int:
        """What the items and their scopes keep."""
        return self.bytes + self.scopes.bytes

    def get(self, key: str) -> Entry | None:
        item = self.item(key)
        return item.entry if item is not None else None

    def item(self, key: str) -> Item | None:
        """:meth:`get`, with what is kept beside the entry."""
        item = self._items.get(key)
        if item is None:
            return None
        if item.expires_at <= time.monotonic():
            self.pop(key)
            return None
        self._items.move_to_end(key)
        return item

    def items_of(self, keys: Iterable[str]) -> dict[str, Item]:
        """:meth:`item` of each of ``keys``: those held, by key (one clock read for all)."""
        items, now, out = self._items, time.monotonic(), {}
        for key in keys:
            item = items.get(key)
            if item is None:
                continue
            if item.expires_at <= now:
                self.pop(key)
                continue
            items.move_to_end(key)
            out[key] = item
        return out

    def peek(self, key: str) -> Item | None:
        """The item held for ``key``, expired or not, its place in LRU order unchanged."""
        return self._items.get(key)

    def charge(self, item: Item, size: int) -> None:
        """``item`` keeps ``size`` bytes more (what its hits prepared): counted against the
        budget like the rest, older items going if it is exceeded."""
        item.size += size
        self.bytes += size
        self._evict()

    def fit(self) -> None:
        """Keep within the budget again (after scopes were made for items judged)."""
        if self.bytes + self.scopes.bytes > self.max_bytes:
            self._evict()

    def touch(self, key: str) -> None:
        """A hit on ``key`` answered without :meth:`item`: kept in LRU order."""
        if key in self._items:
            self._items.move_to_end(key)

    def put(
        self,
        key: str,
        entry: Entry,
        ttl: float,
        *,
        judged_under: int = UNJUDGED,
        scope: Scope = NOWHERE,
    ) -> None:
        """Keep ``entry`` for at most ``ttl`` seconds and never past its expiry;
        ``judged_under`` and ``scope``: a partition's, the mark of the scope under which it
        is known current (see Item.judged_under)."""
        size = len(key) + len(entry.payload) + OVERHEAD_BYTES
        ttl = min(ttl, entry.expires_at - time.time())
        if size > self.max_bytes // 4 or not ttl > 0:
            return  # one entry never pushes out most of the others
        self.pop(key)
        item = Item(
            key, entry, time.monotonic() + ttl, size, judged_under=judged_under, scope=scope
        )
        self._items[key] = item
        self.bytes += size
        self._evict()

    def _evict(self) -> None:
        """The least recently used go while the budget is exceeded (never the newest: an
        item is at most a quarter of the budget when kept). An item marked used since it
        was last moved is moved to the end instead, unmarked (a second chance, as the CLOCK
        algorithm gives), and so is the newest: the others are each moved at most once, so
        this ends."""
        items = self._items
        newest = next(reversed(items), None)
        scopes = self.scopes
        while self.bytes + scopes.bytes > self.max_bytes and len(items) > 1:
            key, old = items.popitem(last=False)
            if old.used or key == newest:
                old.used = False
                items[key] = old
                continue
            self.bytes -= old.size
            old.retire()

    def pop(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.size
            old.retire()

    def clear(self) -> None:
        for item in self._items.values():
            item.retire()
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)
