"""The shared store: Redis or Redis Cluster, fail-open.

The connection, its breaker and its invalidation streams are :mod:`.redis_link`'s; here is
what the cache asks of the store, as Redis does it:

* **One round trip per hit, or none.** A look-up is HMGET of the versions, the fences and
  MGET of the entries, in one round trip over the lean connections; with the versions in
  process (``--redis-tracking``: a :class:`proxy.cache.mirror.VersionMirror` kept while
  Redis's invalidation streams say they stand) a hit whose entry is in process too costs
  none. Every change this store makes forgets its keys there once Redis has taken it.
* **Fences before bumps**, in one pipeline: a fill under versions a write already bumped
  is sure to see the fence it set first.
* **Eviction-safe invalidation.** A bump that Redis refuses (out of memory under
  ``noeviction``) falls back to deleting the version hash, which Redis allows even when full
  and which invalidates at least as much.
* **Read only while writes are taken** (:mod:`.write_trust`): a Redis that refuses this
  proxy's writes but serves reads would serve what other proxies could not invalidate.
* Anything that fails raises :class:`CacheUnavailable`: the call is answered from the HMS.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from proxy.cache import locks, resp
from proxy.cache.keys import COORDINATION, EPOCH, Bump
from proxy.cache.redis_commands import (
    FENCE_SUFFIX,
    IF_LEADER,
    LEASE,
    RELEASE,
    Op,
    as_ops,
    bump_commands,
    fence_fields,
    fence_key,
    op,
)
from proxy.cache.redis_link import RedisLink, redis_failure
from proxy.cache.store import (
    CacheUnavailable,
    Found,
    Versions,
    new_epoch,
    note_fences,
)
from proxy.cache.write_trust import insist
from proxy.metrics import Metrics
from proxy.retry import Breaker

T = TypeVar("T")

# A version hash touched (its life extended) by this proxy this recently is not touched again
# by a fill: every touch is a change Redis tells every proxy's mirror about. Its life is at
# least the version TTL less this, which outlasts the longest entry TTL (see app.py).
TOUCH_EVERY = 60.0
TOUCHED_KEYS = 50_000


class RedisStore(RedisLink):
    compress = True

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        version_ttl: float,
        metrics: Metrics,
        mode: str = "auto",
        breaker: Breaker | None = None,
        fence_ttl: float = 300.0,
        tracking_prefix: str | None = None,
        tracking_max_lag: float = 1.0,
        write_trust: float = 2.0,
        key_prefix: str = "",
        mirror_bytes: int = 32 << 20,
        clients: int = 0,
    ) -> None:
        super().__init__(
            url,
            timeout=timeout,
            metrics=metrics,
            mode=mode,
            breaker=breaker,
            tracking_prefix=tracking_prefix,
            tracking_max_lag=tracking_max_lag,
            write_trust=write_trust,
            key_prefix=key_prefix,
            mirror_bytes=mirror_bytes,
            clients=clients,
        )
        self.version_ttl = int(version_ttl)
        # Every fence hash lives at least this long: as long as the longest fence it can
        # hold (write or lock), so that setting one never cuts another's life short.
        self.fence_ttl = fence_ttl
        self._touched: dict[str, float] = {}
        self._local = metrics.version_reads.labels("local")
        self._remote = metrics.version_reads.labels("redis")

    # -- the Store interface ---------------------------------------------------------------

    def local(self, versions: Mapping[str, Sequence[str]]) -> Versions | None:
        """The versions asked for, from the mirror, if it may answer for all of them."""
        mirror = self.mirror
        now = time.monotonic()
        if mirror is None or now > self.standing.until:  # (streams and write trust)
            return None
        return mirror.get(versions)

    def used_local_versions(self, times: int = 1) -> None:
        self._local.inc(times)

    def in_process(self) -> bool:
        return self.standing.at(time.monotonic())

    async def lookup(
        self, versions: Mapping[str, Sequence[str]], entries: Sequence[str], *, fresh: bool = False
    ) -> tuple[Versions, Found]:
        mirror = self.mirror
        if mirror is not None and not entries and not fresh:
            known = self.local(versions)
            if known is not None:
                self._local.inc()
                return known, {}
        if not self.breaker.ready():
            raise CacheUnavailable("redis backing off after errors")
        if not self.write_trust.trusted(time.monotonic()):
            raise CacheUnavailable("redis is not taking this proxy's writes")
        ticket = mirror.ticket() if mirror is not None else 0
        if ticket and self.cluster and not self._all_tracked(versions):
            ticket = 0  # a node without a stream of ours: what it says cannot be kept
        self._remote.inc()
        order = list(versions.items())
        commands: list[resp.Command] = [("HMGET", key, *names) for key, names in order]
        # The fences, read after the versions: a fill under versions a write or a lock
        # already bumped is then sure to see the fence it set first.
        commands += [("HGETALL", fence_key(key)) for key, _ in order]
        if entries:  # the entries of one plan share its hash tag: one MGET works on a cluster
            commands.append(("MGET", *entries))
        results = await self._lean("get", commands)
        got: Versions = {}
        now = time.time()
        for i, (key, names) in enumerate(order):
            got[key] = dict(zip(names, results[i], strict=True))
            fences = results[len(order) + i]
            if fences:
                note_fences(got[key], fence_fields(fences), now)
            elif ticket:
                assert mirror is not None
                mirror.learn(ticket, key, got[key])
        found: Found = dict(zip(entries, results[2 * len(order)] if entries else [], strict=True))
        return got, found

    async def ensure_epochs(self, keys: Sequence[str]) -> dict[str, bytes]:
        ops: list[Op] = []
        for key in keys:
            ops.append(op("hsetnx", key, EPOCH, new_epoch()))
            ops.append(op("expire", key, self.version_ttl))
            ops.append(op("hget", key, EPOCH))
        results = await self._run_changing("version", ops, keys)
        now = time.monotonic()
        for key in keys:
            self._touched[key] = now
        return {key: results[i * 3 + 2] for i, key in enumerate(keys)}

    async def _run_changing(self, operation: str, ops: list[Op], keys: Sequence[str]) -> list[Any]:
        """:meth:`_run` of operations that change ``keys``: the mirror forgets them once
        Redis has answered, or failed to (it may have taken them)."""
        try:
            return await self._run(operation, ops)
        finally:
            self._changed(keys)

    def _changed(self, keys: Sequence[str]) -> None:
        """This store changed ``keys`` (or may have: called whether or not Redis answered)."""
        if self.mirror is not None:
            self.mirror.forget(keys)

    def _to_touch(self, keys: Sequence[str]) -> list[str]:
        now = time.monotonic()
        due = [k for k in keys if now - self._touched.get(k, -TOUCH_EVERY) >= TOUCH_EVERY]
        if len(self._touched) + len(due) > TOUCHED_KEYS:
            self._touched.clear()
        for key in due:
            self._touched[key] = now
        return due

    async def save(self, entries: Sequence[tuple[str, bytes, float]], touch: Sequence[str]) -> None:
        ops: list[Op] = []
        for key, value, ttl in entries:
            ops.append(op("set", key, value, px=max(1, int(ttl * 1000))))
        touched = self._to_touch(touch)
        for key in touched:
            ops.append(op("expire", key, self.version_ttl))
        await self._run_changing("set", ops, touched)

    def _bump_commands(self, bumps: Sequence[Bump]) -> list[resp.Command]:
        return bump_commands(bumps, self.version_ttl)

    def _bump_ops(self, bumps: Sequence[Bump]) -> list[Op]:
        return as_ops(self._bump_commands(bumps))

    def _fence_life_ms(self, seconds: float) -> int:
        return int(max(self.fence_ttl, seconds) * 1000) + 1000

    async def bump(self, bumps: Sequence[Bump]) -> None:
        keys = sorted({b.key for b in bumps})
        try:
            await self._run("version", self._bump_ops(bumps))
        except CacheUnavailable:
            # Out of memory refuses HINCRBY but allows DEL: drop the hashes instead.
            self.breaker.try_now()  # one immediate attempt: invalidation matters
            await self._run_changing("delete", [op("delete", k) for k in keys], keys)
        else:
            self._changed(keys)

    async def lease(self, key: str, token: str, ttl: float) -> bool:
        ms = max(1, int(ttl * 1000))
        result = await self._run("version", [op("eval", LEASE, 1, key, token, ms)])
        return bool(result[0])

    async def set_if_leader(self, key: str, value: bytes, lease_key: str, token: str) -> bool:
        result = await self._run("set", [op("eval", IF_LEADER, 2, key, lease_key, value, token)])
        return bool(result[0])

    async def release(self, key: str, token: str) -> None:
        await self._run("delete", [op("eval", RELEASE, 1, key, token)])

    async def fence(
        self, keys: Sequence[str], intent: str, seconds: float, bumps: Sequence[Bump]
    ) -> dict[str, list[str]]:
        """Fences first, then the bumps (see lookup for why the order matters), in one
        pipeline: Redis runs one connection's commands in order, and on a cluster a version
        hash and its fences share a slot. Also reads the fences already there, for the
        fences of granted locks that this write (an alter or a drop) ends."""
        deadline = str(time.time() + seconds)
        ops: list[Op] = []
        for key in keys:
            ops.append(op("hset", fence_key(key), intent, deadline))
            ops.append(op("pexpire", fence_key(key), self._fence_life_ms(seconds)))
            ops.append(op("hgetall", fence_key(key)))
        changed = [*keys, *(b.key for b in bumps)]
        results = await self._run_changing("version", ops + self._bump_ops(bumps), changed)
        out: dict[str, list[str]] = {}
        for i, key in enumerate(keys):
            found = results[i * 3 + 2] or {}
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in found]
            granted = locks.granted_fence_fields(names)
            if granted:
                out[key] = granted
        return out

    async def unfence(
        self,
        keys: Sequence[str],
        intent: str,
        bumps: Sequence[Bump],
        also: Sequence[tuple[str, str]] = (),
    ) -> None:
        await self.bump(bumps)
        ops = [op("hdel", fence_key(key), intent) for key in keys]
        ops += [op("hdel", fence_key(key), name) for key, name in also]
        await self._run_changing("version", ops, [*keys, *(key for key, _ in also)])

    async def mark(
        self, items: Sequence[tuple[str, str]], deadline: float, bumps: Sequence[Bump] = ()
    ) -> None:
        """Lock fences first, then the bumps (as :meth:`fence`), in one round trip over the
        lean connections: a ``lock`` waits for it."""
        if not self.breaker.ready():
            raise CacheUnavailable("redis backing off after errors")
        life = self._fence_life_ms(deadline - time.time())
        commands: list[resp.Command] = []
        for key, name in items:
            commands.append(("HSET", fence_key(key), name, repr(deadline)))
            commands.append(("PEXPIRE", fence_key(key), life))
        # A lock's fence (it comes with bumps): every proxy's copy of these versions should
        # be dropped before the lock is forwarded, so this proxy listens for the fence's
        # invalidation before it is set and waits to hear it (a few milliseconds). Not heard
        # in time, the lock goes on: a proxy whose stream is that late stops trusting its
        # copy within --redis-tracking-max-lag, and Iceberg tables' hits always read their
        # versions from Redis (see proxy.cache.reads).
        hearing = None
        if bumps and self.streams is not None:
            hearing = self.streams.listen(sorted({fence_key(k) for k, _ in items}))
        try:
            await self._lean("version", commands + self._bump_commands(bumps))
        except BaseException:
            if hearing is not None:
                hearing.close()
            raise
        finally:
            self._changed([*(key for key, _ in items), *(b.key for b in bumps)])
        if hearing is not None and self.mirror is not None:
            await hearing.heard(self.mirror.max_lag)

    async def unmark(self, items: Sequence[tuple[str, str]]) -> int:
        if not items:
            return 0
        ops = [op("hdel", fence_key(k), n) for k, n in items]
        results = await self._run_changing("version", ops, [k for k, _ in items])
        return sum(int(r) for r in results)

    async def marks(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        results = await self._run("get", [op("hgetall", fence_key(k)) for k in keys])
        out: dict[str, dict[str, float]] = {}
        for key, found in zip(keys, results, strict=True):
            fields = fence_fields([x for pair in (found or {}).items() for x in pair])
            if fields:
                out[key] = fields
        return out

    async def insist(self, attempt: Callable[[], Awaitable[T]]) -> T:
        return await insist(self.write_trust, attempt, self.breaker.try_now)

    async def put(self, key: str, value: bytes, ttl: float) -> None:
        await self._run("set", [op("set", key, value, px=max(1, int(ttl * 1000)))])

    async def delete(self, key: str) -> None:
        await self._run("delete", [op("delete", key)])

    async def get(self, key: str) -> bytes | None:
        value: bytes | None = (await self._run("get", [op("get", key)]))[0]
        return value

    async def flush(self, pattern: str = "") -> int:
        client = self._ready_client()
        removed = 0
        if self.mirror is not None:
            self.mirror.forget_everything()
        try:
            async with asyncio.timeout(max(self.timeout, 30.0)):
                batch: list[bytes] = []
                async for key in client.scan_iter(match=pattern, count=1000):
                    # Coordination (the follower's place, lock records) and fences survive:
                    # a fence protects a write or a lock in progress, not cached data.
                    if COORDINATION.encode() in key or key.endswith(b":v" + FENCE_SUFFIX.encode()):
                        continue
                    batch.append(key)
                    if len(batch) >= 500:
                        removed += await self._unlink(client, batch)
                        batch = []
                if batch:
                    removed += await self._unlink(client, batch)
        except Exception as exc:
            if not redis_failure(exc):
                raise
            self._failed("delete", exc)
            raise CacheUnavailable(str(exc)) from exc
        finally:
            if self.mirror is not None:
                self.mirror.forget_everything()
        return removed

    async def _unlink(self, client: Any, keys: list[bytes]) -> int:
        if self.cluster:  # keys of one UNLINK must share a slot: one command each
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.unlink(key)
            return sum(int(r) for r in await pipe.execute())
        return int(await client.unlink(*keys))
