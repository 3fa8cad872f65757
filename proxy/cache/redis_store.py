"""The shared store: Redis or Redis Cluster, fail-open.

* **One round trip per hit.** A hit needs one look-up (HMGET of the versions, MGET of the
  entries), sent over the lean pipelined connection of :mod:`proxy.cache.resp`; concurrent
  look-ups share it. On Redis Cluster each command goes to its slot's node.
* **Fail open.** Every operation has a short deadline (``--redis-timeout``); one that fails is
  answered from the HMS. A connection failure or an error reply opens a breaker
  (:class:`proxy.retry.Breaker`) at once; timeouts open it when they outnumber successes
  within a second (at least :data:`TIMEOUTS_TO_OPEN`): a busy machine that delays a few
  replies must not send every call to the HMS, which would make it busier still. While open,
  for a backoff period (exponential, jittered), every operation fails at once without
  touching the network; then attempts are let through, and a success closes the breaker.
* **Versions in process** (``--redis-tracking``): the versions a look-up read are kept in a
  :class:`proxy.cache.mirror.VersionMirror` while Redis's invalidation streams
  (:mod:`proxy.cache.tracking`) say they stand; a hit whose versions and entry are both in
  process costs no round trip. Every change this store makes forgets its keys there once
  Redis has taken it.
* **Eviction-safe invalidation.** A bump that Redis refuses (out of memory under
  ``noeviction``) falls back to deleting the version hash, which Redis allows even when full
  and which invalidates at least as much.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from proxy.cache import locks, resp
from proxy.cache.keys import COORDINATION, EPOCH, Bump
from proxy.cache.mirror import VersionMirror
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
from proxy.cache.redis_tls import refusal
from proxy.cache.store import (
    CacheUnavailable,
    Found,
    Standing,
    Versions,
    new_epoch,
    note_fences,
)
from proxy.cache.tracking import InvalidationStreams, Place
from proxy.loop import closed_transport
from proxy.metrics import Metrics
from proxy.retry import Backoff, Breaker
from proxy.tasks import background
from proxy.urls import redact_url

log = logging.getLogger(__name__)

# Seconds a background connection attempt may take (TLS and cluster discovery included).
CONNECT_BUDGET = 5.0


TIMEOUTS_TO_OPEN = 3  # timeouts within a second, outnumbering successes, that open the breaker
# A version hash touched (its life extended) by this proxy this recently is not touched again
# by a fill: every touch is a change Redis tells every proxy's mirror about. Its life is at
# least the version TTL less this, which outlasts the longest entry TTL (see app.py).
TOUCH_EVERY = 60.0
TOUCHED_KEYS = 50_000
# redis-py's pool (fills, bumps, fences) is sized for the operations the proxy runs at once:
# at most one per client connection it admits, plus its own (the follower, lock fences'
# follow-ups, retried invalidations). With no client limit, no pool limit either.
OWN_OPERATIONS = 64
NO_LIMIT = 2**31 - 1


def redis_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by redis-py, means Redis could not be reached or answer (the
    store fails open), not a bug: its errors, the socket's, a deadline, and on uvloop a
    write to a connection that was closed meanwhile (seen under load: redis-py's connect
    wrote to a transport uvloop had closed)."""
    return isinstance(exc, (RedisError, OSError, TimeoutError)) or closed_transport(exc)


class RedisStore:
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
        mirror_bytes: int = 32 << 20,
        clients: int = 0,
    ) -> None:
        self.url = url
        self.timeout = timeout
        # --max-client-connections (0: no limit): how many operations may want a connection.
        self.pool_size = clients + OWN_OPERATIONS if clients else NO_LIMIT
        self.version_ttl = int(version_ttl)
        # Every fence hash lives at least this long: as long as the longest fence it can
        # hold (write or lock), so that setting one never cuts another's life short.
        self.fence_ttl = fence_ttl
        self.metrics = metrics
        self.mode = mode
        self.breaker = breaker or Breaker(Backoff(base=0.2, cap=5.0), TIMEOUTS_TO_OPEN)
        self._client: Any = None
        self._connect_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._conn_kwargs: dict[str, Any] = {}
        self._fast: dict[tuple[str, int] | str, resp.RespConnection] = {}
        self.cluster = False
        self._touched: dict[str, float] = {}
        self._closed = False
        # The coherent in-process copy of the versions (None: --redis-tracking off).
        self.mirror: VersionMirror | None = None
        self.streams: InvalidationStreams | None = None
        if tracking_prefix is not None:
            self.mirror = VersionMirror(
                0, max_bytes=mirror_bytes, max_lag=tracking_max_lag, fence_suffix=FENCE_SUFFIX
            )
            self.streams = InvalidationStreams(
                self.mirror,
                tracking_prefix,
                metrics,
                beat=min(0.25, tracking_max_lag / 4),
                timeout=timeout,
            )
        self._retracking: asyncio.Task[None] | None = None
        # Without a coherent copy nothing in process is trusted: every hit reads Redis.
        self.standing = self.mirror.standing if self.mirror is not None else Standing(-math.inf)
        self._local = metrics.version_reads.labels("local")
        self._remote = metrics.version_reads.labels("redis")

    # -- connection and breaker ------------------------------------------------------------
    #
    # No call ever waits for a connection to be made: while there is none, operations fail
    # at once (the call goes to the metastore) and a background task connects. A Redis that
    # accepts connections but does not answer (stopped, overloaded) costs callers nothing
    # but the cache.

    async def connect(self, wait: float) -> bool:
        """Start connecting, and wait up to ``wait`` seconds for it (at start-up)."""
        self._start_connecting()
        task = self._connect_task
        if task is not None:
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(wait):
                    await asyncio.shield(task)
        return self._client is not None

    def _ready_client(self) -> Any:
        if self._client is not None:
            return self._client
        self._start_connecting()
        raise CacheUnavailable("connecting to redis")

    def _start_connecting(self) -> None:
        if self._closed:
            return
        if self._connect_task is None or self._connect_task.done():
            self._connect_task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        limit = max(self.timeout, 1.0)
        # redis-py's default pools fail "Too many connections" past 100 in use (per node on a
        # cluster), which, logged as a connection failure, opened the breaker and dropped
        # the client under load. Sized for the proxy's concurrency (each operation in flight
        # holds one connection, and no more operations are in flight than client calls
        # plus the proxy's own), so it never runs out. Not redis-py's BlockingConnectionPool:
        # on Python 3.11 its asyncio.Condition can lose a wake-up when the woken waiter's
        # deadline cancels it (gh-112202), leaving callers to time out beside a free one.
        pool = aredis.ConnectionPool.from_url(
            self.url,
            max_connections=self.pool_size,
            socket_timeout=limit,
            socket_connect_timeout=limit,
        )
        plain = aredis.Redis.from_pool(pool)
        kwargs = dict(plain.connection_pool.connection_kwargs)
        kwargs["connection_class_name"] = plain.connection_pool.connection_class.__name__
        client: Any = plain
        try:
            async with asyncio.timeout(CONNECT_BUDGET):
                cluster = self.mode == "cluster"
                if self.mode == "auto":
                    info = await plain.info("cluster")
                    cluster = bool(info.get("cluster_enabled"))
                if cluster:
                    await plain.aclose()
                    # Found only now in auto mode: TLS settings redis-py's cluster client
                    # does not take would make it trust what the lean connections do not.
                    refused = refusal(self.url, cluster=True) if self.mode == "auto" else None
                    if refused:
                        raise RedisError(f"the server is a Redis Cluster, and {refused}")
                    client = RedisCluster.from_url(  # (its node pools cannot block: sized only)
                        self.url,
                        max_connections=self.pool_size,
                        socket_timeout=limit,
                        socket_connect_timeout=limit,
                    )
                    await client.initialize()
                    places: list[tuple[str, int] | str] = _slot_owners(client)
                else:
                    places = ["single"]
                self._conn_kwargs = kwargs
                fast: dict[tuple[str, int] | str, resp.RespConnection] = {
                    where: await self._open_fast(where) for where in places
                }
        except Exception as exc:
            if not (redis_failure(exc) or isinstance(exc, resp.RespError)):
                raise
            with contextlib.suppress(Exception):
                await client.aclose()
            self._failed("connect", exc)
            return
        self._client, self._fast, self.cluster = client, fast, cluster
        log.info(
            "cache: connected to %s Redis at %s", "cluster" if cluster else "single", self._safe_url
        )
        self._track(places)

    def _track(self, places: list[Place]) -> None:
        """(Re)start the invalidation streams, one per node."""
        if self.streams is None:
            return
        self.streams.start(places, self._beat_tags(places), self._open_fast, self._send_to)

    def _beat_tags(self, places: list[Place]) -> list[str]:
        """A hash tag stored on each place (a cluster node holds only its slots)."""
        if not self.cluster:
            return ["beat"] * len(places)
        tags: dict[Place, str] = {}
        for n in range(100_000):
            tag = f"beat{n}"
            node = self._client.nodes_manager.get_node_from_slot(resp.key_slot("{" + tag + "}"))
            tags.setdefault((node.host, node.port), tag)
            if all(p in tags for p in places):
                break
        return [tags.get(p, "beat") for p in places]

    def _all_tracked(self, versions: Mapping[str, Sequence[str]]) -> bool:
        """Whether a stream of ours follows every node holding these version hashes (slots
        can move to a new node without a MOVED reaching the look-ups: redis-py follows it on
        its own connections); if not, the streams are started again for today's nodes."""
        assert self.streams is not None
        tracked = self.streams.places
        nodes = self._client.nodes_manager
        for key in versions:
            node = nodes.get_node_from_slot(resp.key_slot(key))
            if (node.host, node.port) not in tracked:
                self._retrack()
                return False
        return True

    def _retrack(self) -> None:
        if self._retracking is None or self._retracking.done():
            self._retracking = background(self._refresh_slots(), "following the cluster's nodes")

    async def _send_to(self, place: Place, commands: list[resp.Command]) -> list[Any]:
        return await resp.replies_within(self._fast_connection(place).send(commands), self.timeout)

    async def _open_fast(self, where: tuple[str, int] | str) -> resp.RespConnection:
        kwargs = dict(self._conn_kwargs)
        if isinstance(where, tuple):
            kwargs["host"], kwargs["port"] = where
            kwargs.pop("path", None)
        return await resp.open_connection(kwargs, max(self.timeout, 1.0))

    @property
    def _safe_url(self) -> str:
        return redact_url(self.url) or ""

    @property
    def available(self) -> bool:
        return self.breaker.ready()

    async def _run(self, operation: str, ops: list[Op]) -> list[Any]:
        """Run ``ops`` in one pipeline within the deadline; raises CacheUnavailable."""
        if not self.breaker.ready():
            raise CacheUnavailable("redis backing off after errors")
        client = self._ready_client()
        try:
            async with asyncio.timeout(self.timeout):
                pipe = client.pipeline(transaction=False)
                for name, args, kwargs in ops:
                    getattr(pipe, name)(*args, **kwargs)
                results: list[Any] = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            if not redis_failure(exc):
                raise
            self._failed(operation, exc)
            raise CacheUnavailable(str(exc) or type(exc).__name__) from exc
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            self._failed(operation, errors[0])
            raise CacheUnavailable(str(errors[0]))
        self._succeeded()
        return results

    def _succeeded(self) -> None:
        if self.breaker.succeeded():
            log.info("cache: redis is answering again")
            self.metrics.cache_available.set(1)

    def _failed(self, operation: str, exc: BaseException) -> None:
        self.metrics.cache_errors.labels(operation).inc()
        if isinstance(exc, (TimeoutError, RedisTimeout)) and operation != "connect":
            opened = self.breaker.timed_out()
            if opened is None:
                log.debug(
                    "cache: redis %s timed out; this call answered from the metastore", operation
                )
                return
        else:  # an error reply, or a connection refused or not made in time: down, not slow
            opened = self.breaker.failed()
        self.metrics.cache_available.set(0)  # at once; the readiness check confirms every 2 s
        (log.warning if opened.first else log.debug)(
            "cache: redis %s failed (%s); answering from the metastore, retrying in %.1f s",
            operation,
            str(exc) or type(exc).__name__,  # a timeout has no text of its own
            opened.delay,
        )
        if (
            isinstance(exc, (OSError, TimeoutError))
            or closed_transport(exc)
            or "connect" in str(exc).lower()
        ):
            self._drop_client()

    def _drop_client(self) -> None:
        if self.streams is not None:
            self.streams.stop()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                background(client.aclose(), "closing a redis client")
        for conn in self._fast.values():
            conn.close()
        self._fast.clear()

    # -- the hit path: look-ups over lean connections -----------------------------------------

    def _fast_connection(self, where: tuple[str, int] | str) -> resp.RespConnection:
        """The lean connection to ``where``; if it is gone, reconnect in the background."""
        conn = self._fast.get(where)
        if conn is None or conn.closed:
            self._fast.pop(where, None)
            task = asyncio.get_running_loop().create_task(self._reopen_fast(where))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            raise CacheUnavailable("reconnecting to redis")
        return conn

    async def _reopen_fast(self, where: tuple[str, int] | str) -> None:
        try:
            conn = await self._open_fast(where)
        except Exception as exc:
            if not (redis_failure(exc) or isinstance(exc, resp.RespError)):
                raise
            self._failed("connect", exc)
            return
        if self._closed:  # closed meanwhile: nobody would ever close this one
            conn.close()
            return
        self._fast[where] = conn

    async def _lookup_commands(self, commands: list[resp.Command]) -> list[Any]:
        """Send look-up commands (each to its node) and wait for all replies."""
        client = self._ready_client()
        futures: list[asyncio.Future[Any]]
        if not self.cluster:
            conn = self._fast_connection("single")
            futures = conn.send(commands)
        else:
            by_node: dict[tuple[str, int], list[int]] = {}
            for i, command in enumerate(commands):
                node = client.nodes_manager.get_node_from_slot(resp.key_slot(str(command[1])))
                by_node.setdefault((node.host, node.port), []).append(i)
            slots: dict[int, asyncio.Future[Any]] = {}
            for where, indexes in by_node.items():
                conn = self._fast_connection(where)
                sent = conn.send([commands[i] for i in indexes])
                slots.update(zip(indexes, sent, strict=True))
            futures = [slots[i] for i in range(len(commands))]
        return await resp.replies_within(futures, self.timeout)

    async def _lean(self, operation: str, commands: list[resp.Command]) -> list[Any]:
        """Commands over the lean connections, in one round trip (the hit path's way, and the
        lock fence's: both are on a client's clock); raises CacheUnavailable."""
        try:
            results = await self._lookup_commands(commands)
        except (resp.Disconnected, OSError, TimeoutError, RedisError) as exc:
            self._failed(operation, exc)
            raise CacheUnavailable(str(exc) or type(exc).__name__) from exc
        errors = [r for r in results if isinstance(r, resp.RespError)]
        if errors:
            text = str(errors[0])
            if text.startswith(("MOVED", "ASK")) and self._client is not None:
                # Slots moved (resharding, failover): refresh the map; this call misses.
                refresh = asyncio.get_running_loop().create_task(self._refresh_slots())
                self._tasks.add(refresh)
                refresh.add_done_callback(self._tasks.discard)
            else:
                self._failed(operation, errors[0])
            raise CacheUnavailable(text)
        self._succeeded()
        return results

    # -- the Store interface ---------------------------------------------------------------

    def local(self, versions: Mapping[str, Sequence[str]]) -> Versions | None:
        """The versions asked for, from the mirror, if it may answer for all of them."""
        mirror = self.mirror
        if mirror is None or not mirror.trusted(time.monotonic()):
            return None
        return mirror.get(versions)

    def used_local_versions(self) -> None:
        self._local.inc()

    def generation(self) -> int | None:
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

    async def ping(self) -> bool:
        try:
            client = self._ready_client()
            async with asyncio.timeout(max(self.timeout, 1.0)):
                await client.ping()
        except Exception as exc:
            if not (redis_failure(exc) or isinstance(exc, CacheUnavailable)):
                raise
            return False
        return True

    async def _refresh_slots(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.nodes_manager.initialize()
            # A failover or a resharding: each new primary gets a stream of its own.
            places: list[Place] = _slot_owners(self._client)
            if self.streams is not None and sorted(map(str, places)) != sorted(
                map(str, self.streams.places)
            ):
                self._track(places)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):  # reconnections under way open nothing more
            task.cancel()
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self.streams is not None:
            await self.streams.close()
        for conn in self._fast.values():
            conn.close()
        self._fast.clear()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None


def _slot_owners(client: Any) -> list[Place]:
    """The primaries that hold slots (a primary holding none has no key to look up, and no
    beat key could be placed on it)."""
    owners: dict[Place, None] = {}
    for nodes in client.nodes_manager.slots_cache.values():
        if nodes:
            owners[(nodes[0].host, nodes[0].port)] = None
    return list(owners) or [(n.host, n.port) for n in client.get_primaries()]
