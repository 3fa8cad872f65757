"""A hit answered at once, answered again, on its connection or any other, with no look-up.

Engines ask the same thing again and again on one connection (Spark's ``get_table`` while
it plans a query, a pooled connection's look-ups of one table), or on a new connection each
time (Trino). A call answered at once (see :meth:`.dispatch.CallHandler.serve_hit_now`) is
kept as an :class:`Again`, by its connection and for every connection (:class:`Answers`):
the next request is compared with it in place, its bytes but for the seqid,
and answered while the hit that answered it holds (:func:`proxy.cache.l1.stands`, and no
invalidation pending), with the reply's parts its in-process copy prepared once.

Why it pays: otherwise a call is found by its copied bytes in a memo, then its plan, then
its entry, through a dozen Python calls. Warm, that is a few microseconds; but on a machine
whose other processes keep evicting the proxy's memory from the CPU's caches between calls
(a metastore, an engine), each step costs several times that, and a hit cost 2-3 times a
do-nothing server's round trip. Measured in its history (``git log -p docs/benchmarks.md``).

The session drops its :class:`Again` as soon as a call takes another way: that call may
change what this connection would be answered (``set_ugi``, a pinned connection).

An answer is counted later, with the others of its :class:`Again` (:meth:`Again.settle`):
every :data:`SETTLE_EVERY` answers, when it is no longer kept (:class:`Answers`) and a
session drops it (another call, the connection's end, the proxy stopping), when
:class:`Answers` lets it go, and before the metrics, the status page or the admin
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

from proxy.cache.engine import CacheEngine
from proxy.cache.entry import Payload
from proxy.cache.l1 import Item, stands
from proxy.handler.session import ClientGone, SessionState
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

# Calls kept to be answered again on any connection (see Answers), and what one costs beyond
# the bytes of its request (kept twice: its key, and the parts it compares), the object, its
# list of times, its place in the dict.
KEPT_ANSWERS = 1024
KEPT_ANSWER_BYTES = 4 << 20
ANSWER_OVERHEAD = 1536  # (measured: ~1,050 bytes, tests/unit/test_memo.py)


def prepared(reply: Payload) -> tuple[bytes, Payload, str]:
    """A cached reply's parts as every hit on it writes them: its header up to the seqid,
    the rest after the seqid (a view, not a copy), and its outcome label."""
    _, at, mtype = reseq(reply, 0)
    outcome = result_outcome(mtype, bytes(reply[at : at + 3]))
    return bytes(reply[: at - 4]), memoryview(reply)[at:], outcome


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
        "at_once",
        "before",
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
        "seen",
        "spent",
        "standing",
        "tally",
        "touch",
        "used_local",
    )

    def __init__(
        self,
        request: bytes,
        at: int,
        transport: Transport,
        item: Item,
        cache: CacheEngine,
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
        # What decides, beside the item: the store's generation, pending invalidations.
        self.standing = cache.store.standing
        self.invalidations = cache.invalidations
        self.sampler = cache.freshness  # (it wants a hit: the ordinary way records it)
        # What is counted.
        method = counted.method
        self.requests = metrics.requests.labels(method, parts[2])
        self.duration = metrics.request_duration.labels(method, "cache")
        self.gone = metrics.requests.labels(method, "client_gone")
        self.at_once = metrics.hits_at_once.labels()
        self.used_local = cache.store.used_local_versions
        seen = cache.whole.seen
        self.seen = seen.looked_up if seen is not None and counted.table is not None else None
        self.touch = cache.l1.touch
        self.kept = False  # by Answers, which counts its answers (see keep)
        self.asked = False  # answered since Answers kept it, or last passed it over
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
        now = time.monotonic()  # (perf_counter's clock too, on Linux: one call for both)
        if (
            item is None  # L1 let it go, and nothing holds it
            or not stands(item, self.standing, now)  # (a retired one's stamp never stands)
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
        counted = self.counted
        self.requests.value += tally
        counted.lookups.value += tally
        self.at_once.value += tally
        self.used_local(tally)
        if self.seen is not None:
            self.seen(counted.table, counted.seen_hit, tally)  # type: ignore[arg-type]  # (not None)
        observe = self.duration.observe
        for spent in self.spent[:tally]:
            observe(spent)


class Answers:
    """The :class:`Again` of each call answered at once lately, by the call's bytes but for
    its seqid (and, when the cache is per user, whose entries it read), for any connection
    to answer it again with. Trino opens a connection per call: a connection's own Again
    would never be asked again, and each first call took the way through the memo of
    requests, the plan and the entry (~10 us of Python a call in a busy process, against
    ~3 this way: git log -p docs/benchmarks.md). At most :data:`KEPT_ANSWERS` calls and
    :data:`KEPT_ANSWER_BYTES`: the oldest kept goes first, its answers counted, unless it was
    answered since it was kept or last passed over (a second chance, at the back: calls
    asked once do not push out those asked all the time). A connection with its own
    metastore connection (pinned) reads none: its calls are never answered at once."""

    def __init__(self, per_user: bool) -> None:
        self.per_user = per_user
        self._kept: dict[tuple[bytes | None, bytes], Again] = {}
        self.bytes = 0

    def _key(self, session: SessionState, repeat: bytes) -> tuple[bytes | None, bytes]:
        return (session.cache_identity if self.per_user else None, repeat)

    def get(self, session: SessionState, repeat: bytes) -> Again | None:
        """The Again kept for ``repeat`` (see framing.call_without_seqid) as ``session`` would
        read it; ``None``: none kept, or not for this session."""
        if session.pinned is not None:
            return None
        return self._kept.get(self._key(session, repeat))

    def first(self, repeat: bytes) -> Again | None:
        """:meth:`get` for a connection that has said nothing before (no identity, no
        connection of its own to the metastore)."""
        return self._kept.get((None, repeat))

    def keep(self, session: SessionState, repeat: bytes, again: Again) -> None:
        """Keep ``again`` for ``repeat``, in place of the one kept before (counted first)."""
        key = self._key(session, repeat)
        kept = self._kept
        before = kept.pop(key, None)
        if before is not None:
            self._drop(before)
        cost = 2 * again.length + ANSWER_OVERHEAD
        while kept and (len(kept) >= KEPT_ANSWERS or self.bytes + cost > KEPT_ANSWER_BYTES):
            self._let_one_go()
        kept[key] = again
        again.kept = True
        self.bytes += cost

    def _let_one_go(self) -> None:
        """The oldest kept not answered since it was kept or last passed over goes; those
        passed over go to the back (if every one was answered, the oldest goes)."""
        kept = self._kept
        for _ in range(len(kept)):
            key = next(iter(kept))
            again = kept[key]
            if not again.asked:
                break
            again.asked = False
            del kept[key]
            kept[key] = again
        self._drop(kept.pop(next(iter(kept))))

    def _drop(self, again: Again) -> None:
        again.kept = False
        again.settle()
        self.bytes -= 2 * again.length + ANSWER_OVERHEAD

    def settle(self) -> None:
        """Count every answer not counted yet (see :meth:`Again.settle`)."""
        for again in self._kept.values():
            again.settle()

    def footprint(self) -> tuple[int, int]:
        """(calls kept, their bytes) for /metrics (hmsproxy_memo_bytes)."""
        return len(self._kept), self.bytes
