"""The connection to Redis or Redis Cluster under the shared store: fail-open.

What :class:`proxy.cache.redis_store.RedisStore` runs its operations over, one thing each:

* **No call waits for a connection.** While there is none, operations fail at once (the
  call goes to the metastore) and a background task connects; a Redis that accepts
  connections but does not answer costs callers nothing but the cache.
* **Two ways to Redis.** redis-py's pipelines (:meth:`RedisLink._run`) for fills, bumps and
  fences, and the lean pipelined connections of :mod:`proxy.cache.resp`
  (:meth:`RedisLink._lean`) for what is on a client's clock: look-ups and lock fences. On
  Redis Cluster each command goes to its slot's node.
* **A breaker.** Every operation has a short deadline (``--redis-timeout``). A connection
  failure or an error reply opens a :class:`proxy.retry.Breaker` at once; timeouts open it
  when they outnumber successes within a second (at least :data:`TIMEOUTS_TO_OPEN`): a busy
  machine that delays a few replies must not send every call to the HMS, which would make
  it busier still. While open, for a backoff period (exponential, jittered), every
  operation fails at once without touching the network; then attempts are let through,
  and a success closes the breaker.
* **Invalidation streams** (``--redis-tracking``): one per node, started with each
  connection (:mod:`proxy.cache.tracking`), feeding the :class:`VersionMirror`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from proxy.cache import resp
from proxy.cache.mirror import VersionMirror
from proxy.cache.redis_commands import FENCE_SUFFIX, Op
from proxy.cache.redis_tls import refusal
from proxy.cache.store import CacheUnavailable, Standing
from proxy.cache.tracking import InvalidationStreams, Place
from proxy.cache.write_trust import PROBE_EVERY, WriteTrust
from proxy.loop import closed_transport
from proxy.metrics import Metrics
from proxy.retry import Backoff, Breaker
from proxy.tasks import background
from proxy.urls import redact_url

log = logging.getLogger(__name__)

# Seconds a background connection attempt may take (TLS and cluster discovery included).
CONNECT_BUDGET = 5.0


READONLY_RECONNECT = 5.0  # seconds between reconnections for a probe answered READONLY
TIMEOUTS_TO_OPEN = 3  # timeouts within a second, outnumbering successes, that open the breaker
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


class RedisLink:
    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        metrics: Metrics,
        mode: str = "auto",
        breaker: Breaker | None = None,
        tracking_prefix: str | None = None,
        tracking_max_lag: float = 1.0,
        write_trust: float = 2.0,
        key_prefix: str = "",
        mirror_bytes: int = 32 << 20,
        clients: int = 0,
    ) -> None:
        self.url = url
        self.key_prefix = key_prefix
        self.timeout = timeout
        # --max-client-connections (0: no limit): how many operations may want a connection.
        self.pool_size = clients + OWN_OPERATIONS if clients else NO_LIMIT
        self.metrics = metrics
        self.mode = mode
        self.breaker = breaker or Breaker(Backoff(base=0.2, cap=5.0), TIMEOUTS_TO_OPEN)
        self._client: Any = None
        self._connect_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._conn_kwargs: dict[str, Any] = {}
        self._fast: dict[tuple[str, int] | str, resp.RespConnection] = {}
        self.cluster = False
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
        self.write_trust = WriteTrust(write_trust, timeout)
        self._probing: asyncio.Task[None] | None = None
        self._reconnect_after = 0.0  # (monotonic) a READONLY probe reconnects, not more often
        self._probe_keys: list[tuple[Place, str]] = []
        # Without a coherent copy nothing in process is trusted: every hit reads Redis.
        self.standing = self.mirror.standing if self.mirror is not None else Standing(-math.inf)
        self.standing.trust(-math.inf)  # (until a probe is taken: see _probe_once)

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
        self._probe_at(places)
        if self._probing is None or self._probing.done():
            self._probing = asyncio.get_running_loop().create_task(self._probe())
            self._tasks.add(self._probing)
        self._track(places)

    def _probe_at(self, places: list[Place]) -> None:
        """Probe these nodes from now on (after a connection, a failover, a resharding)."""
        token = os.urandom(6).hex()
        self._probe_keys = [
            (place, f"{self.key_prefix}{{{tag}}}:probe:{token}")
            for place, tag in zip(places, self._beat_tags(places), strict=True)
        ]

    async def _probe(self) -> None:
        """Is Redis taking this proxy's writes? (:mod:`.write_trust`)"""
        trusted = False
        while not self._closed:
            why = await self._probe_once()
            now = time.monotonic()
            if self.write_trust.trusted(now) != trusted:
                trusted = not trusted
                self.metrics.redis_writes_taken.set(1 if trusted else 0)
                if not trusted and self.mirror is not None:
                    # Versions kept in process may be ones another proxy could not bump
                    # (once, as trust ends: a probe merely late, on a busy machine, keeps them).
                    self.mirror.forget_everything()
                if trusted:
                    log.info("cache: redis takes this proxy's writes: serving from it again")
                elif self.write_trust.ever_taken:
                    log.warning(
                        "cache: redis does not take this proxy's writes (%s): answering from "
                        "the metastore until it does",
                        why or "no reply in time",
                    )
            await asyncio.sleep(PROBE_EVERY)

    async def _probe_once(self) -> str:
        """Set a key of this proxy's on every node; on a failure, ping (reads served?).
        Returns the error reply that refused it, if one did."""
        refusals: list[str] = []
        taken = False
        if self._client is not None and self._probe_keys:
            sends = [
                self._send_to(place, [("SET", key, "1", "PX", "10000")])
                for place, key in self._probe_keys
            ]
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome
            replies = [r for o in outcomes if isinstance(o, list) for r in o]
            errors = [str(r) for r in replies if isinstance(r, resp.RespError)]
            moved = [e for e in errors if e.startswith(("MOVED", "ASK"))]
            if moved:
                # Slots moved (a failover, a resharding): not a refusal; probe the new
                # owners, and follow them with the streams too.
                self._retrack()
            now = time.monotonic()
            if any(e.startswith("READONLY") for e in errors) and now >= self._reconnect_after:
                # A demoted primary: a connection made now may reach the new one (a name
                # that moved with the failover), as the other proxies' may already have.
                self._reconnect_after = now + READONLY_RECONNECT
                self._drop_client()
                self._start_connecting()
            refusals = [e for e in errors if e not in moved]
            taken = len(replies) == len(sends) and not errors
        if taken:
            now = time.monotonic()
            self.write_trust.taken(now)
            self.standing.trust(self.write_trust.horizon(now))
            return ""
        answered = self._client is not None and await self.ping()
        now = time.monotonic()
        self.write_trust.not_taken(now, refused=bool(refusals), answered=answered)
        self.standing.trust(self.write_trust.horizon(now))
        return refusals[0] if refusals else ""

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
            if sorted(map(str, places)) != sorted(map(str, (p for p, _ in self._probe_keys))):
                self._probe_at(places)
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
