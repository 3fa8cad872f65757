"""The one place a hit answered at once is counted as a look-up.

A hit the awaited path answers is counted where it is looked up (``WholeReads.read``,
``PartitionReads.read``). A hit answered at once, from a socket callback (the first judged,
a call known by its bytes, a reply assembled from partitions, an Again's batch of answers
again), is counted here, after its reply was written, as that look-up counts it:
``hmsproxy_cache_lookups_total``, ``hmsproxy_cache_hits_at_once_total``, the store's count
of versions read in process, and the status page's count of its table. The differential
test (tests/unit/differential.py) holds the two ways to the same counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.loop_metrics import Count
from proxy.metrics import Metrics

if TYPE_CHECKING:
    from proxy.cache.keys import TableRef
    from proxy.cache.reads import Seen
    from proxy.cache.store import Store


@dataclass(frozen=True, slots=True)
class HitCount:
    """How one kind of hit answered at once is counted (made once: an item's, kept with
    it, see :class:`.l1.Item`)."""

    method: str  # the method's metric label
    lookups: Count  # hmsproxy_cache_lookups_total{method, result}
    table: TableRef | None  # counted as looked up on the status page (None: not counted)
    seen_hit: bool  # counted there as a hit


class HitCounts:
    def __init__(self, metrics: Metrics, store: Store, seen: Seen | None) -> None:
        self.metrics = metrics
        self.store = store
        # Where looked-up tables are counted (the status page), for every look-up: the
        # awaited path's reads count theirs here too.
        self.seen = seen
        self.at_once = metrics.hits_at_once.labels()

    def of(self, method: str, result: str, table: TableRef | None, seen_hit: bool) -> HitCount:
        """How a hit of ``method`` (its label) with ``result`` is counted."""
        return HitCount(method, self.metrics.cache_lookups.labels(method, result), table, seen_hit)

    def count(self, hit: HitCount, times: int = 1) -> None:
        """Count ``times`` hits of ``hit``'s kind, answered at once and written."""
        hit.lookups.value += times
        self.at_once.value += times
        self.store.used_local_versions(times)
        seen = self.seen
        if hit.table is not None and seen is not None:
            seen.looked_up(hit.table, hit.seen_hit, times)
