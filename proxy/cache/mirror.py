"""The versions this proxy read from Redis, kept in process while Redis says they stand (pure).

With a shared store, a hit used to cost one Redis round trip: the current versions of every
scope a reply depends on were read on each call. The mirror keeps the version fields it read,
and Redis's client-side caching in broadcast mode (``CLIENT TRACKING ON BCAST PREFIX``, see
:mod:`proxy.cache.tracking`) names every key under the deployment's prefix that changes,
expires, is evicted or flushed; the mirror forgets those keys. A hit whose versions are all
here is served without touching the network.

Rules, each one a guard against a stale hit:

1. **Served only while trusted.** Every stream (one per Redis node) is subscribed, and a beat
   (a key this proxy sets through its ordinary connection) came back through each stream
   within ``max_lag`` seconds of being sent. Redis sends a connection's invalidations in the
   order the changes happened, so when a beat sent at ``t`` comes back, every change made
   before ``t`` has been applied here: a write through another proxy is seen within the
   stream's delivery, and never later than ``max_lag``. A stream that drops or lags stops
   in-process hits at once; they resume when it is subscribed again and a beat is back.
2. **Learned only what cannot be older than the stream says.** A look-up takes a ticket
   before it is sent; what it read is learned only if the stream was subscribed before the
   ticket and no invalidation of that key arrived since (the invalidation and the reply come
   on different connections, in either order). A resubscription forgets everything and
   refuses every ticket taken before it.
3. **This proxy's own changes** (a write's fence and bump, a lock's marks, a fill's touch)
   forget their keys when Redis has taken them, before the writer is answered: a client of
   this proxy reads its own write at once, whatever the stream's delay.
4. A hash with a fence (a write or a lock under way) is never learned: those look-ups go to
   Redis, whose answer depends on the fence's deadline.

Memory is bounded in bytes: least recently learned hashes go first (a client choosing names
decides how many there are).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.cache.store import Standing

Fields = dict[str, bytes | None]

# What one learned hash costs beyond its fields (dict, key, bookkeeping), and each field.
HASH_OVERHEAD = 300
FIELD_OVERHEAD = 100
# Invalidated keys remembered for tickets in flight; past this, older tickets are refused.
MAX_DROPPED = 50_000
# Beats not seen back after this many max_lags are given up (a lost write, a flush).
BEAT_PATIENCE = 10


@dataclass(slots=True)
class _Stream:
    subscribed: bool = False
    confirmed_at: float | None = None  # send time (monotonic) of the newest beat seen back


class VersionMirror:
    def __init__(
        self,
        streams: int,
        *,
        max_bytes: int,
        max_lag: float,
        fence_suffix: str,
        version_suffix: str = ":v",
    ) -> None:
        self.max_bytes = max_bytes
        self.max_lag = max_lag
        self._fence_suffix = fence_suffix
        self._version_suffix = version_suffix
        self._streams = [_Stream() for _ in range(streams)]
        self._hashes: OrderedDict[str, Fields] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0
        self._seq = 0  # counts invalidations and resynchronisations
        # Its scopes move whenever a field get() could answer changes or goes, and it is
        # trusted until the oldest stream's newest beat is max_lag old (rule 1; see
        # Store.in_process).
        self.standing = Standing(-math.inf)
        self._floor = 1  # tickets below this learn nothing (taken before a resubscription)
        self._dropped: dict[str, int] = {}  # key -> seq of its latest invalidation
        self._beats: dict[str, tuple[int, float]] = {}  # beat key -> (stream, sent at)
        self.resyncs = 0
        self.lags: list[float] = []  # beats' delivery times, for the metrics to take

    # -- the streams -----------------------------------------------------------------------

    def reset(self, streams: int) -> None:
        """The set of streams changed (a new connection, a new cluster topology)."""
        self._streams = [_Stream() for _ in range(streams)]
        self._beats.clear()  # by stream index: an old beat must not vouch for a new stream
        self._resync()

    def subscribed(self, stream: int) -> None:
        """``stream`` is tracking: invalidations from now on will arrive."""
        self._streams[stream] = _Stream(subscribed=True)
        self._resync()

    def lost(self, stream: int) -> None:
        """``stream`` dropped: what it would have said since is unknown."""
        if stream < len(self._streams):
            self._streams[stream] = _Stream()
        self._resync()

    def _trust(self) -> None:
        """Rule 1, as :attr:`standing` tells it: called on every change to a stream."""
        confirmed = [s.confirmed_at if s.subscribed else None for s in self._streams]
        if not confirmed or None in confirmed:
            self.standing.track(-math.inf)
        else:
            self.standing.track(min(t for t in confirmed if t is not None) + self.max_lag)

    def _resync(self) -> None:
        self.resyncs += 1
        self._trust()
        self._forget_all()

    def expect(self, key: str, stream: int, sent_at: float) -> None:
        """A beat: ``key`` was set at ``sent_at`` and should come back through ``stream``."""
        self._beats[key] = (stream, sent_at)
        if len(self._beats) > 64:  # unanswered beats (a failed SET): keep the newest only
            oldest = min(self._beats, key=lambda k: self._beats[k][1])
            del self._beats[oldest]

    def trusted(self, now: float) -> bool:
        """Whether hits may be served from here as far as the streams go (rule 1; the
        standing's ``until`` bounds it by write trust too); ``now`` is monotonic."""
        return now <= self.standing.tracked

    def lag(self, now: float) -> float | None:
        """Seconds since the oldest stream's newest confirmed beat was sent (``None``: a
        stream has none)."""
        times = [s.confirmed_at for s in self._streams]
        if not times or any(t is None for t in times):
            return None
        return now - min(t for t in times if t is not None)

    # -- invalidations ---------------------------------------------------------------------

    def invalidated(self, keys: Sequence[bytes | str] | None, now: float) -> None:
        """What a stream said: these keys changed (``None``: the database was flushed)."""
        if keys is None:
            self._forget_all()
            return
        self._seq += 1
        seq = self._seq
        fence, version = self._fence_suffix, self._version_suffix
        for raw in keys:
            key = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            if key.endswith(fence):  # a fence hash: the versions it guards
                key = key[: -len(fence)]
            if key.endswith(version):
                self._drop(key, seq)
                continue
            beat = self._beats.pop(key, None)
            if beat is not None:
                self._confirm(beat, now)
            # Anything else (a cached entry filled or expired) changes no version: ignored,
            # and not remembered, so fills do not crowd out what tickets need.
        if len(self._dropped) > MAX_DROPPED:
            self._dropped.clear()
            self._floor = self._seq + 1

    def _confirm(self, beat: tuple[int, float], now: float) -> None:
        stream, sent_at = beat
        if stream >= len(self._streams) or not self._streams[stream].subscribed:
            return
        s = self._streams[stream]
        if s.confirmed_at is None or sent_at > s.confirmed_at:
            s.confirmed_at = sent_at
            self._trust()
        if len(self.lags) < 1000:
            self.lags.append(now - sent_at)
        horizon = now - self.max_lag * BEAT_PATIENCE
        for key in [k for k, (_, t) in self._beats.items() if t < horizon]:
            del self._beats[key]

    def forget(self, keys: Sequence[str]) -> None:
        """This proxy changed ``keys`` in Redis (rule 3)."""
        self._seq += 1
        for key in keys:
            if key.endswith(self._fence_suffix):
                key = key[: -len(self._fence_suffix)]
            self._drop(key, self._seq)

    def forget_everything(self) -> None:
        """This proxy flushed the store, or cannot tell what it changed."""
        self._forget_all()

    def _drop(self, key: str, seq: int) -> None:
        self.standing.scopes.moved(key)
        self._dropped[key] = seq
        if self._hashes.pop(key, None) is not None:
            self.bytes -= self._sizes.pop(key)

    def _forget_all(self) -> None:
        self.standing.scopes.moved_all()
        self._seq += 1
        self._floor = self._seq + 1
        self._hashes.clear()
        self._sizes.clear()
        self._dropped.clear()
        self.bytes = 0

    # -- look-ups --------------------------------------------------------------------------

    def get(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, Fields] | None:
        """The fields asked for, if every one is here (the caller checked :meth:`trusted`).
        The dictionaries returned are the mirror's own: read them, do not change them."""
        out: dict[str, Fields] = {}
        hashes = self._hashes
        for key, names in wanted.items():
            fields = hashes.get(key)
            if fields is None:
                return None
            for name in names:
                if name not in fields:
                    return None
            out[key] = fields
        return out

    def ticket(self) -> int:
        """Taken before a look-up is sent; 0 when nothing it reads may be learned."""
        if not self._streams or not all(s.subscribed for s in self._streams):
            return 0
        return self._seq + 1  # never below the floor: the floor is set to seq + 1

    def learn(self, ticket: int, key: str, fields: Mapping[str, bytes | None]) -> None:
        """What a look-up with ``ticket`` read of ``key`` (no fence on it: rule 4)."""
        if ticket < self._floor or self._dropped.get(key, 0) >= ticket:
            return
        known = self._hashes.get(key)
        if known is None:
            known = {}
            self._hashes[key] = known
            self._sizes[key] = HASH_OVERHEAD + len(key)
            self.bytes += HASH_OVERHEAD + len(key)
        else:
            self._hashes.move_to_end(key)
        added = 0
        for name, value in fields.items():
            if name not in known:
                added += FIELD_OVERHEAD + len(name) + (len(value) if value else 0)
            elif known[name] != value:
                self.standing.scopes.moved(key)  # (newer than a hit may have been judged by)
            known[name] = value
        self._sizes[key] += added
        self.bytes += added
        while self.bytes > self.max_bytes and self._hashes:
            old, _ = self._hashes.popitem(last=False)
            self.bytes -= self._sizes.pop(old)
            self.standing.scopes.moved(old)

    def __len__(self) -> int:
        return len(self._hashes)
