"""A memo bounded in bytes as well as entries: for everything a client's bytes can fill.

A count bound alone is no bound: 20,000 entries of 100 KB each are 2 GB, and a client decides
how big what it sends is. Every memo or cache keyed or filled by what clients send (plans of
requests, encoded Redis commands, ``set_ugi`` replies, compression dictionaries, the status
page's tables) is one of these, with a byte budget that does not depend on what is sent:
an item bigger than a fraction of the budget is not kept at all (it would crowd out the
rest, and what is that big is rare enough to recompute).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What a small item costs beyond the bytes it is made of (dict slot, tuple, object headers).
ITEM_OVERHEAD = 160

# (entries, bytes) a memo holds now, by its own count: what /metrics reports for each memo
# (hmsproxy_memo_bytes), so that a soak can tell the memos' growth from a leak.
Footprint = Callable[[], tuple[int, int]]


class BoundedMemo(Generic[K, V]):
    """Least recently used first out, at most ``max_entries`` items and ``max_bytes`` bytes
    (each item's size as given to :meth:`put`, plus :data:`ITEM_OVERHEAD`)."""

    def __init__(self, max_entries: int, max_bytes: int, largest: int | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.largest = largest if largest is not None else max_bytes // 16
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        return key in self._items

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def lookup(self, key: K) -> tuple[bool, V | None]:
        """(found, value): for memos whose values may be ``None``."""
        item = self._items.get(key)
        if item is None:
            return False, None
        self._items.move_to_end(key)
        return True, item[0]

    def put(self, key: K, value: V, size: int) -> bool:
        """Keep ``value`` (``size`` bytes); ``False`` if it is too big to keep."""
        cost = size + ITEM_OVERHEAD
        self.pop(key)
        if size > self.largest:
            return False
        self._items[key] = (value, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes or len(self._items) > self.max_entries:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old
        return True

    def pop(self, key: K) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.bytes -= item[1]
        return item[0]

    def values(self) -> list[V]:
        return [value for value, _ in self._items.values()]

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


def footprint_of(*memos: BoundedMemo[Any, Any]) -> Footprint:
    """The memos' entries and bytes together (read from any thread: two ints)."""
    return lambda: (sum(len(m) for m in memos), sum(m.bytes for m in memos))
