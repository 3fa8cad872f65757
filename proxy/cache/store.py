"""Where versions and entries live: the interface, and the embedded in-process store.

What the engine, the lock fences and the follower ask of a store; each call is one round trip
to Redis (see ``redis_store``):

* ``lookup``: the current values of some version fields, and some entries (``local``: the
  versions alone, when the store keeps a coherent copy in process);
* ``ensure_epochs``: give version hashes that have none an epoch token (before a fill);
* ``save``: write entries with their TTL, and extend the life of the version hashes they
  depend on (a hash must outlive every entry filled under it);
* ``bump``: apply a write's invalidation;
* ``get``: one value by key (a compression dictionary, saved with the entries; a lock
  record); ``put``/``delete``: small side values with a TTL (what a lock id fenced);
* ``flush``: forget everything;
* ``lease``/``set_if_leader``/``release``: one notification follower among the proxies
  sharing a store;
* ``fence``/``unfence``: mark tables as being written (crash safety, see ``proxy.cache.writes``);
* ``mark``/``unmark``/``marks``: fence fields of HMS locks (``proxy.cache.locks``);
* ``connect``/``ping``/``close``: the connection's life, and the readiness check.

Stores raise :class:`CacheUnavailable` when they cannot answer; the engine then answers from
the metastore (fail open).
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from proxy.cache import locks
from proxy.cache.keys import EPOCH, Bump
from proxy.cache.scopes import Scopes

T = TypeVar("T")


class CacheUnavailable(Exception):
    """The store could not do what was asked (down, slow, out of memory, misconfigured)."""


Versions = dict[str, dict[str, bytes | None]]
# A pseudo-field a look-up sets on a version hash that a write in progress has fenced.
FENCED = "\x00fenced"
# Stored values by key (None: not there).
Found = dict[str, bytes | None]


def new_epoch() -> bytes:
    return os.urandom(8).hex().encode()


class Standing:
    """Whether a hit judged in process still stands, as far as the store goes (the hit path
    asks on every call, and every way of serving a hit asks this one). ``scopes``: the
    version hashes judgements read, each group moved whenever anything :meth:`Store.local`
    answers for one of its hashes may have changed (a version, an epoch, a fence; a hash
    forgotten; see :mod:`.scopes`); ``until`` (monotonic) is when what the store keeps in
    process stops being trusted: never for the embedded store; for Redis's coherent copy the
    sooner of two horizons, each ``-inf`` while it does not hold: the moment its
    invalidation streams would be late (:meth:`track`, :mod:`.mirror`'s rule 1), and the
    moment Redis's taking this proxy's writes would be too long ago (:meth:`trust`,
    :mod:`.write_trust`)."""

    __slots__ = ("scopes", "tracked", "trusted", "until")

    def __init__(self, until: float) -> None:
        self.scopes = Scopes()
        self.tracked = until  # the invalidation streams' horizon
        self.trusted = math.inf  # the write probes' horizon (a store that cannot refuse: never)
        self.until = until

    def track(self, until: float) -> None:
        self.tracked = until
        self.until = min(until, self.trusted)

    def trust(self, until: float) -> None:
        self.trusted = until
        self.until = min(self.tracked, until)

    def at(self, now: float) -> bool:
        """Whether what is kept in process is trusted at ``now`` (monotonic)."""
        return now <= self.until


class Store(Protocol):
    compress: bool
    standing: Standing  # see in_process()

    async def lookup(
        self, versions: Mapping[str, Sequence[str]], entries: Sequence[str], *, fresh: bool = False
    ) -> tuple[Versions, Found]:
        """``fresh``: the versions as the store has them now, never from a copy in process."""

    def local(self, versions: Mapping[str, Sequence[str]]) -> Versions | None:
        """The versions asked for, if they can be known without a round trip that a
        look-up would make (``None``: ask :meth:`lookup`)."""

    def used_local_versions(self, times: int = 1) -> None:
        """A look-up (``times`` look-ups) went by the versions :meth:`local` gave, without
        asking the store (for the store's counts of where versions were read)."""

    def in_process(self) -> bool:
        """Whether :meth:`local` may answer now. A hit judged from what it answered is
        judged the same while the scope of the judgement stands (fences only ever expire,
        entries are checked for their own expiry): :attr:`standing`'s ``scopes``."""

    async def ensure_epochs(self, keys: Sequence[str]) -> dict[str, bytes]: ...

    async def save(
        self, entries: Sequence[tuple[str, bytes, float]], touch: Sequence[str]
    ) -> None: ...

    async def bump(self, bumps: Sequence[Bump]) -> None: ...

    async def get(self, key: str) -> bytes | None: ...

    async def flush(self, pattern: str) -> int: ...

    async def lease(self, key: str, token: str, ttl: float) -> bool:
        """Take or renew the lease ``key`` for ``token``; ``False`` if another holds it."""

    async def set_if_leader(self, key: str, value: bytes, lease_key: str, token: str) -> bool:
        """Set ``key`` only while ``token`` holds ``lease_key``."""

    async def release(self, key: str, token: str) -> None:
        """Give the lease up, if ``token`` holds it."""

    async def fence(
        self, keys: Sequence[str], intent: str, seconds: float, bumps: Sequence[Bump]
    ) -> dict[str, list[str]]:
        """Mark the version hashes ``keys`` as being written (then apply ``bumps``), in one
        round trip; returns the fence fields of granted locks found on each key."""

    async def unfence(
        self,
        keys: Sequence[str],
        intent: str,
        bumps: Sequence[Bump],
        also: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Apply ``bumps``, then lift the marks of ``intent`` (and the fence fields ``also``)."""

    async def mark(
        self, items: Sequence[tuple[str, str]], deadline: float, bumps: Sequence[Bump] = ()
    ) -> None:
        """Set fence fields (version key, field name) to ``deadline`` (Unix seconds), then
        apply ``bumps``: one round trip. With bumps (a lock's fence, before the lock is
        forwarded), a store whose versions other proxies keep in process also waits until
        they have been told (see ``InvalidationStreams.heard``)."""

    async def unmark(self, items: Sequence[tuple[str, str]]) -> int:
        """Remove fence fields; returns how many were there."""

    async def marks(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        """Every fence field of ``keys``, with its deadline."""

    async def put(self, key: str, value: bytes, ttl: float) -> None:
        """Set a side value for ``ttl`` seconds."""

    async def insist(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt`` (a fence before a write or a lock goes ahead), retried while the store
        answers reads but refuses it, until no other proxy trusts what it reads there
        (:mod:`proxy.cache.write_trust`); raises ``CacheUnavailable`` if it never took it."""

    async def delete(self, key: str) -> None: ...

    async def connect(self, wait: float) -> bool: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class MemoryStore:
    """The embedded cache: versions and entries in this process, bounded in bytes.

    Entries are kept uncompressed (they never leave the process, so there is nothing to
    gain on the wire and a decompression on every hit to lose). Both maps are LRU; evicting
    a version hash is safe because its replacement gets a new epoch.
    """

    compress = False

    def __init__(self, max_bytes: int, max_version_hashes: int = 200_000) -> None:
        self.max_bytes = max_bytes
        self.max_version_hashes = max_version_hashes
        self._versions: OrderedDict[str, dict[str, bytes | None]] = OrderedDict()
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._side: dict[str, bytes] = {}  # small coordination values (last event id)
        self._marks: dict[str, dict[str, float]] = {}  # lock fences, by version key
        self._marked = 0
        self._bytes = 0
        self.standing = Standing(math.inf)  # everything is in process: always trusted

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    @property
    def entry_count(self) -> int:
        return len(self._entries)

    async def lookup(
        self, versions: Mapping[str, Sequence[str]], entries: Sequence[str], *, fresh: bool = False
    ) -> tuple[Versions, Found]:
        now = time.monotonic()
        got = self._current(versions)
        values: Found = {}
        for key in entries:
            item = self._entries.get(key)
            if item is None or item[1] <= now:
                if item is not None:
                    self._drop(key)
                values[key] = None
            else:
                self._entries.move_to_end(key)
                values[key] = item[0]
        return got, values

    def local(self, versions: Mapping[str, Sequence[str]]) -> Versions | None:
        """The versions part of :meth:`lookup` (everything here is in process)."""
        return self._current(versions)

    def used_local_versions(self, times: int = 1) -> None:
        pass  # every look-up here is in process: nothing to tell apart

    def in_process(self) -> bool:
        return self.standing.at(time.monotonic())  # (always trusted: everything is here)

    def _current(self, versions: Mapping[str, Sequence[str]]) -> Versions:
        got: Versions = {}
        for key, names in versions.items():
            fields = self._versions.get(key)
            if fields is not None:
                self._versions.move_to_end(key)
            got[key] = {n: (fields or {}).get(n) for n in names}
            marks = self._marks.get(key)
            if marks:
                note_fences(got[key], marks)
        return got

    async def ensure_epochs(self, keys: Sequence[str]) -> dict[str, bytes]:
        out = {}
        for key in keys:
            fields = self._hash(key)
            epoch = fields.get(EPOCH)
            if epoch is None:
                epoch = fields[EPOCH] = new_epoch()
                self.standing.scopes.moved(key)
            out[key] = epoch
        return out

    def _hash(self, key: str) -> dict[str, bytes | None]:
        fields = self._versions.get(key)
        if fields is None:
            fields = self._versions[key] = {}
            while len(self._versions) > self.max_version_hashes:
                evicted, _ = self._versions.popitem(last=False)
                self.standing.scopes.moved(evicted)
        else:
            self._versions.move_to_end(key)
        return fields

    async def save(self, entries: Sequence[tuple[str, bytes, float]], touch: Sequence[str]) -> None:
        now = time.monotonic()
        for key, value, ttl in entries:
            if len(value) > self.max_bytes // 4:
                continue  # one entry may not crowd out the rest
            self._drop(key)
            self._entries[key] = (value, now + ttl)
            self._bytes += _cost(key, value)
        while self._bytes > self.max_bytes and self._entries:
            key, (value, _) = self._entries.popitem(last=False)
            self._bytes -= _cost(key, value)

    def _drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= _cost(key, old[0])

    async def bump(self, bumps: Sequence[Bump]) -> None:
        moved = self.standing.scopes.moved
        for b in bumps:
            moved(b.key)
            fields = self._hash(b.key)
            if b.field == EPOCH:
                fields[EPOCH] = new_epoch()
            else:
                fields[b.field] = str(int(fields.get(b.field) or 0) + 1).encode()

    async def get(self, key: str) -> bytes | None:
        if key in self._side:
            return self._side[key]
        return (await self.lookup({}, [key]))[1][key]

    async def insist(self, attempt: Callable[[], Awaitable[T]]) -> T:
        return await attempt()  # a store in process refuses nothing

    async def put(self, key: str, value: bytes, ttl: float) -> None:
        await self.save([(key, value, ttl)], [])

    async def delete(self, key: str) -> None:
        self._side.pop(key, None)
        self._drop(key)

    async def flush(self, pattern: str = "") -> int:
        count = len(self._entries) + len(self._versions)
        self._entries.clear()
        self._versions.clear()
        self._bytes = 0
        self.standing.scopes.moved_all()
        return count

    async def lease(self, key: str, token: str, ttl: float) -> bool:
        return True  # one process: always the follower

    async def set_if_leader(self, key: str, value: bytes, lease_key: str, token: str) -> bool:
        self._side[key] = value
        return True

    async def release(self, key: str, token: str) -> None:
        return None

    async def fence(
        self, keys: Sequence[str], intent: str, seconds: float, bumps: Sequence[Bump]
    ) -> dict[str, list[str]]:
        await self.bump(bumps)  # a crash takes this cache with it: no write fence needed
        return {
            key: locks.granted_fence_fields(self._marks[key]) for key in keys if key in self._marks
        }

    async def unfence(
        self,
        keys: Sequence[str],
        intent: str,
        bumps: Sequence[Bump],
        also: Sequence[tuple[str, str]] = (),
    ) -> None:
        await self.bump(bumps)
        await self.unmark(also)

    async def mark(
        self, items: Sequence[tuple[str, str]], deadline: float, bumps: Sequence[Bump] = ()
    ) -> None:
        now = time.time()
        self._marked += 1
        if self._marked % 1024 == 0:  # now and then, what has expired anywhere goes
            for key in list(self._marks):
                self._prune(key, now)
        for key, name in items:
            self._prune(key, now)
            self._marks.setdefault(key, {})[name] = deadline
            self.standing.scopes.moved(key)
        await self.bump(bumps)

    def _prune(self, key: str, now: float) -> None:
        marks = self._marks.get(key)
        if marks is None:
            return
        for old in [n for n, d in marks.items() if d <= now]:
            del marks[old]
        if not marks:
            del self._marks[key]

    async def unmark(self, items: Sequence[tuple[str, str]]) -> int:
        removed = 0
        for key, name in items:
            self.standing.scopes.moved(key)
            marks = self._marks.get(key)
            if marks is not None:
                removed += marks.pop(name, None) is not None
                if not marks:
                    del self._marks[key]
        return removed

    async def marks(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        return {key: dict(self._marks[key]) for key in keys if key in self._marks}

    async def connect(self, wait: float) -> bool:
        return True

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


# What an entry costs beyond its value: its key, and the objects that hold both. Counted, so
# that a cache of many small entries (partitions remembered as absent, say) is bounded too.
ENTRY_OVERHEAD = 200


def _cost(key: str, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD


def note_fences(
    versions: dict[str, bytes | None], marks: Mapping[str, float], now: float | None = None
) -> None:
    """Add the FENCED and LOCKED pseudo-fields a look-up reports for a hash's fence fields
    (both stores)."""
    state = locks.read_fences(marks, time.time() if now is None else now)
    if state.write:
        versions[FENCED] = b"1"
    if state.locked:
        versions[locks.LOCKED] = ",".join(sorted(state.locked)).encode()
