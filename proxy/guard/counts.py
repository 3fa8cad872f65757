"""About how many partitions a call for partition objects returns, known before it goes.

The metastore says itself, cheaply: ``get_num_partitions_by_filter`` is one ``COUNT`` query
(an empty filter counts the whole table), what the HMS runs before such a call when its own
``hive.metastore.limit.partition.request`` is set. Counts are remembered for a short while
(``ttl``), and one question per table (or filter) is asked at a time however many calls
wait for it. Only calls that miss the cache come here, and only while a limit needs a
count: a table known to be smaller than every threshold is never asked about again until
its count expires.

A count is a judgement of cost, never of content: a stale one sends a call through the
wrong lane or refuses it by yesterday's size, it never changes a reply. Counts the
metastore will not give (an error, a timeout) are unknown: the call is neither refused nor
taken for heavy by them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proxy.guard.calls import PartitionRead, Shape
from proxy.memo import BoundedMemo

log = logging.getLogger(__name__)

# (db, table, filter) -> the metastore's count; None: it would not say.
Ask = Callable[[str, str, str], Awaitable[int | None]]

COUNTS_KEPT = 20_000
COUNT_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Estimate:
    """``partitions``: at most this many (``None``: not known); ``exact``: this many, as far
    as the metastore said (a stale count aside), not just a bound."""

    partitions: int | None
    exact: bool

    def above(self, limit: int) -> bool:
        return self.partitions is not None and self.partitions > limit


UNKNOWN = Estimate(None, False)


class PartitionCounts:
    """Tables' (and filters') partition counts, asked of the metastore and kept ``ttl``
    seconds."""

    def __init__(self, ask: Ask, ttl: float = 30.0) -> None:
        self._ask = ask
        self.ttl = ttl
        self._known: BoundedMemo[tuple[str, str, str], tuple[int | None, float]] = BoundedMemo(
            COUNTS_KEPT, COUNT_BYTES
        )
        self._asking: dict[tuple[str, str, str], asyncio.Future[int | None]] = {}
        self.asked = 0  # questions put to the metastore (for tests and the log)

    async def estimate(self, read: PartitionRead, *, below: int) -> Estimate:
        """How many partitions ``read`` returns. ``below``: the lowest threshold a decision
        depends on; a filter is counted by the metastore only when its table has more."""
        shape = read.shape
        if shape is Shape.NAMES:
            return Estimate(_capped(read.names, read.cap), True)
        total = await self.count(read.db, read.table, "")
        if total is None:
            return UNKNOWN
        bound = _capped(total, read.cap)
        if shape is Shape.WHOLE:
            return Estimate(bound, True)
        if shape is Shape.FILTER and bound > below:
            selected = await self.count(read.db, read.table, read.filter)
            if selected is not None:
                return Estimate(_capped(selected, read.cap), True)
        return Estimate(bound, False)

    async def count(self, db: str, table: str, filter_text: str) -> int | None:
        key = (db.lower(), table.lower(), filter_text)
        found = self._known.get(key)
        now = time.monotonic()
        if found is not None and found[1] > now:
            return found[0]
        asking = self._asking.get(key)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        result: int | None = None
        try:
            self.asked += 1
            result = await self._ask(db, table, filter_text)
        except Exception:  # (the ask says why it failed; the count is just unknown)
            log.debug("no partition count for %s.%s", db, table, exc_info=True)
        finally:
            del self._asking[key]
            future.set_result(result)
        # Unknown is remembered too (a table that is not there, a filter the metastore
        # cannot count): asked again after the ttl, not on every call.
        size = len(db) + len(table) + len(filter_text) + 64
        self._known.put(key, (result, time.monotonic() + self.ttl), size)
        return result


def _capped(count: int, cap: int) -> int:
    return count if cap < 0 else min(count, cap)
