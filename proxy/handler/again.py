"""A hit answered at once, answered again, on its connection or any other, with no look-up.

Engines ask the same thing again and again on one connection (Spark's ``get_table`` while
it plans a query, a pooled connection's look-ups of one table), or on a new connection each
time (Trino). A call answered at once (see :meth:`.dispatch.CallHandler.serve_hit_now`) is
kept as an :class:`Again`, by its connection and for every connection (with the call in
:class:`proxy.handler.known_calls.KnownCalls`): the next request is compared with it in
place, its bytes but for the seqid, and answered while the hit that answered it holds
(:func:`proxy.cache.l1.stands`, and no invalidation pending), with the reply's parts its
in-process copy prepared once.

Why it pays: otherwise a call is found by its copied bytes in a memo, then its plan, then
its entry, through a dozen Python calls. Warm, that is a few microseconds; but on a machine
whose other processes keep evicting the proxy's memory from the CPU's caches between calls
(a metastore, an engine), each step costs several times that, and a hit cost 2-3 times a
do-nothing server's round trip. Measured in its history (``git log -p docs/benchmarks.md``).

The session drops its :class:`Again` as soon as a call takes another way: that call may
change what this connection would be answered (``set_ugi``, a pinned connection).

An answer is counted later, with the others of its :class:`Again` (:meth:`Again.settle`):
every :data:`SETTLE_EVERY` answers, when it is no longer kept with its call and a session
drops it (another call, the connection's end, the proxy stopping), when the table of known
calls lets it go, and before the metrics, the status page or the admin
``Stats`` are read (``Metrics.settle``), so a scrape includes every call answered before
it. The entry's LRU place is kept at the first answer of each such batch: an entry
answered only this way is as recent as that answer, at most 63 answers old. Counted one
by one, the six counts after each write (two counters,
the duration histogram, the store's and the status page's counts, the LRU's order)
touched as many objects the machine had evicted from its caches meanwhile: ~20 us of a
~55 us answer with all of them evicted, in process (``bench.again_steps``,
git log -p docs/benchmarks.md). ``hmsproxy_request_duration_seconds`` of such an answer does not
include its counting.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from array import array

from proxy.cache.engine import ServedAgain
from proxy.cache.entry import Payload
from proxy.cache.l1 import Item
from proxy.handler.session import ClientGone
from proxy.metrics import Metrics
from proxy.upstream import result_outcome
from proxy.wire.binary import reseq
from proxy.wire.framing import Transport

log = logging.getLogger(__name__)

# Replies from this size are written as two pieces (header, and a view of the rest) rather
# than joined: a 120 KB reply's copy cost more than the hit's other steps together, from cold
# memory (git log -p docs/benchmarks.md); a small one's costs less than a second piece.
JOIN_BELOW = 16 * 1024

# Answers counted together (see the module's docstring). Kept under 257: CPython's small
# ints, so counting to it allocates nothing.
SETTLE_EVERY = 64


def prepared(reply: Payload) -> tuple[bytes, Payload, str]:
    """A cached reply's parts as every hit on it writes them: its header up to the seqid,
    the rest after the seqid (a view, not a copy), and its outcome label."""
    _, at, mtype = reseq(reply, 0)
    outcome = result_outcome(mtype, bytes(reply[at : at + 3]))
    return bytes(reply[: at - 4]), memoryview(reply)[at:], outcome


def replaced(before: Again | None, after: Again | None) -> None:
    """A connection answers its calls again with ``after`` from now on, not ``before``:
    ``before``'s answers are counted now, unless it is still kept with its call for every
    connection (then its counts wait for others': settled at every connection's end, they
    cost ~4 us of each of Trino's calls)."""
    if before is not None and before is not after and not before.kept:
        before.settle()


class Again:
    """What answers a connection's last call again (see the module's docstring).

    :meth:`answer` is the hot path of a busy engine's repeated calls: the hit rule is
    :func:`.l1.stands`, as for every hit judged before, on the item it answered from
    (remembered weakly: an Again never keeps a reply L1 let go); its counts are those of
    :meth:`.dispatch.CallHandler.serve_hit_now`, made in place."""

    __slots__ = (
        "after",
        "asked",
        "at",
        "before",
        "count_hits",
        "counted",
        "duration",
        "gone",
        "head",
        "invalidations",
        "item",
        "kept",
        "key",
        "length",
        "requests",
        "sampler",
        "spent",
        "standing",
        "tally",
        "touch",
    )

    def __init__(
        self,
        request: bytes,
        at: int,
        transport: Transport,
        item: Item,
        served: ServedAgain,
        metrics: Metrics,
    ) -> None:
        parts, counted = item.answer, item.counted
        assert parts is not None and counted is not None  # (made when it was answered)
        self.length = len(request)
        self.at = at  # where the request's seqid is
        self.before = request[:at]
        self.after = request[at + 4 :]
        self.item = weakref.ref(item)  # (its reply's parts are read off it: see answer)
        self.key = item.key
        self.counted = counted
        self.head = transport.prefix(len(item.entry.payload)) + parts[0]  # framed, if framed
        # What decides, beside the item and its scope: whether the store is trusted,
        # pending invalidations.
        self.standing = served.standing
        self.invalidations = served.pending
        self.sampler = served.sampler  # (it wants a hit: the ordinary way records it)
        # What is counted.
        method = counted.method
        self.requests = metrics.requests.labels(method, parts[2])
        self.duration = metrics.request_duration.labels(method, "cache")
        self.gone = metrics.requests.labels(method, "client_gone")
        self.count_hits = served.count
        self.touch = served.touch
        self.kept = False  # with its call in KnownCalls, which counts its answers then
        self.asked = False  # answered since KnownCalls kept it, or last passed it over
        # Answers not counted yet, and how long each took (see settle).
        self.tally = 0
        self.spent = array("d", bytes(8 * SETTLE_EVERY))  # (unboxed: no float objects kept)

    def answers_from(self, item: Item) -> bool:
        """Whether this answers from ``item`` (not from one L1 let go since)."""
        return self.item() is item

    def answer(self, data: bytes, transport: asyncio.WriteTransport) -> bool:
        """Answer ``data`` on ``transport`` if it is the same call, but for its seqid, and
        the same hit still answers it; ``False``: nothing was written or counted. Raises
        ClientGone when the client is (its connection is closed)."""
        if (
            len(data) != self.length
            or not data.startswith(self.before)
            or not data.endswith(self.after)
        ):
            return False
        item = self.item()
        standing = self.standing
        now = time.monotonic()  # (perf_counter's clock too, on Linux: one call for both)
        # The hit rule, l1.stands, written out: a Python call costs this path ~5 us of its
        # ~30 us when the CPU's caches were emptied (bench.again_steps, "nothing (a call)");
        # test_again holds the two to the same answers.
        if (
            item is None  # L1 let it go, and nothing holds it
            or item.judged_under != item.scope.mark  # (a retired one's stamp is no mark)
            or now > standing.until
            or now >= item.expires_at
            or self.invalidations.pending  # a write's invalidation not applied yet
            or self.sampler.want  # the freshness check wants a hit (proxy.cache.sampling)
            or transport.get_write_buffer_size()  # (the session's writes keep the order)
            or transport.is_closing()
        ):
            return False
        parts = item.answer
        if parts is None:  # (retired with its stamp: not reached)
            return False
        at = self.at
        rest = parts[1]
        try:
            if len(rest) < JOIN_BELOW:
                transport.write(self.head + data[at : at + 4] + rest)
            else:  # (uvloop's sends both in one system call, and copies neither)
                transport.writelines((self.head + data[at : at + 4], rest))
        except (ConnectionError, RuntimeError) as exc:  # (uvloop's, on a closed transport)
            self.gone.value += 1
            transport.close()
            raise ClientGone(f"client connection lost: {exc}") from exc
        # Counted later, with others (see the module's docstring).
        self.asked = True
        tally = self.tally
        self.spent[tally] = time.monotonic() - now
        if not tally:  # (the entry's LRU place, once for the answers counted together)
            self.touch(self.key)
        self.tally = tally = tally + 1
        if tally == SETTLE_EVERY:
            self.settle()
        return True

    def settle(self) -> None:
        """Count the answers not counted yet, as the ordinary way counts each hit (Count's
        values in place; the entry's LRU place was kept at the first of them). Never raises:
        it runs where a session is dropped and before a scrape, which must go on."""
        tally = self.tally
        if not tally:
            return
        self.tally = 0
        try:
            self._count(tally)
        except Exception:  # (a bug: those counts are lost, nothing else)
            log.exception("counting %d calls answered again", tally)

    def _count(self, tally: int) -> None:
        self.requests.value += tally
        item = self.item()  # (its counts as last judged, if L1 still holds it)
        if item is not None and item.counted is not None:
            self.counted = item.counted
        self.count_hits(self.counted, tally)
        observe = self.duration.observe
        for spent in self.spent[:tally]:
            observe(spent)
