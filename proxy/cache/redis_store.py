"""The shared store: Redis or Redis Cluster, fail-open.

* **One round trip per hit.** Look-ups issued in the same turn of the event loop (64 busy
  clients make many) are sent as one pipeline; a hit needs one look-up. On Redis Cluster the
  pipeline is split per node by redis-py and the parts go out together.
* **Fail open.** Every operation has a short deadline (``--redis-timeout``). A failure opens a
  breaker: for a backoff period (exponential, jittered) every operation fails at once
  without touching the network, and the engine answers from the HMS; then one attempt is
  let through, and success closes the breaker.
* **Eviction-safe invalidation.** A bump that Redis refuses (out of memory under
  ``noeviction``) falls back to deleting the version hash, which Redis allows even when full
  and which invalidates at least as much.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from proxy.cache.keys import EPOCH
from proxy.cache.plan import Bump
from proxy.cache.store import CacheUnavailable, Found, Versions, new_epoch
from proxy.metrics import Metrics
from proxy.retry import Backoff

log = logging.getLogger(__name__)

# One command for a pipeline: (method name, positional arguments, keyword arguments).
Op = tuple[str, tuple[Any, ...], dict[str, Any]]


def op(name: str, *args: Any, **kwargs: Any) -> Op:
    return name, args, kwargs


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
        backoff: Backoff | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.version_ttl = int(version_ttl)
        self.metrics = metrics
        self.mode = mode
        self.backoff = backoff or Backoff(base=0.2, cap=5.0)
        self._client: Any = None
        self._connecting: asyncio.Lock | None = None
        self._queue: list[tuple[list[Op], asyncio.Future[list[Any]]]] = []
        self._flush_scheduled = False
        self.cluster = False

    # -- connection and breaker ------------------------------------------------------------

    async def _connected(self) -> Any:
        if self._client is not None:
            return self._client
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is not None:
                return self._client
            limit = max(self.timeout, 1.0)
            plain = aredis.Redis.from_url(
                self.url, socket_timeout=limit, socket_connect_timeout=limit
            )
            cluster = self.mode == "cluster"
            if self.mode == "auto":
                async with asyncio.timeout(max(self.timeout, 1.0)):
                    info = await plain.info("cluster")
                cluster = bool(info.get("cluster_enabled"))
            if cluster:
                await plain.aclose()
                self._client = RedisCluster.from_url(
                    self.url, socket_timeout=limit, socket_connect_timeout=limit
                )
                async with asyncio.timeout(max(self.timeout * 10, 2.0)):
                    await self._client.initialize()
            else:
                self._client = plain
            self.cluster = cluster
            log.info(
                "cache: connected to %s Redis at %s",
                "cluster" if cluster else "single",
                self._safe_url,
            )
            return self._client

    @property
    def _safe_url(self) -> str:
        from proxy.config import redact_url

        return redact_url(self.url) or ""

    @property
    def available(self) -> bool:
        return self.backoff.ready()

    async def _run(self, operation: str, ops: list[Op]) -> list[Any]:
        """Run ``ops`` in one pipeline within the deadline; raises CacheUnavailable."""
        if not self.backoff.ready():
            raise CacheUnavailable("redis backing off after errors")
        try:
            client = await self._connected()
            async with asyncio.timeout(self.timeout):
                pipe = client.pipeline(transaction=False)
                for name, args, kwargs in ops:
                    getattr(pipe, name)(*args, **kwargs)
                results: list[Any] = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(operation, exc)
            raise CacheUnavailable(str(exc) or type(exc).__name__) from exc
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            self._failed(operation, errors[0])
            raise CacheUnavailable(str(errors[0]))
        if self.backoff.failures:
            log.info("cache: redis is answering again")
        self.backoff.succeeded()
        return results

    def _failed(self, operation: str, exc: BaseException) -> None:
        self.metrics.cache_errors.labels(operation).inc()
        first = self.backoff.failures == 0
        delay = self.backoff.failed()
        (log.warning if first else log.debug)(
            "cache: redis %s failed (%s); answering from the metastore, retrying in %.1f s",
            operation,
            exc or type(exc).__name__,
            delay,
        )
        if isinstance(exc, (OSError, TimeoutError)) or "connect" in str(exc).lower():
            self._drop_client()

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().create_task(client.aclose())

    # -- batching of look-ups --------------------------------------------------------------

    async def _batched(self, ops: list[Op]) -> list[Any]:
        """Queue ``ops``; everything queued in this loop turn goes out as one pipeline."""
        if not self.backoff.ready():
            raise CacheUnavailable("redis backing off after errors")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((ops, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        self._flush_scheduled = False
        batch, self._queue = self._queue, []
        asyncio.get_running_loop().create_task(self._flush(batch))

    async def _flush(self, batch: list[tuple[list[Op], asyncio.Future[list[Any]]]]) -> None:
        ops = [op for item_ops, _ in batch for op in item_ops]
        try:
            results = await self._run("get", ops)
        except CacheUnavailable as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(CacheUnavailable(str(exc)))
            return
        at = 0
        for item_ops, future in batch:
            if not future.done():
                future.set_result(results[at : at + len(item_ops)])
            at += len(item_ops)

    # -- the Store interface ---------------------------------------------------------------

    async def lookup(
        self, versions: Mapping[str, Sequence[str]], entries: Sequence[str]
    ) -> tuple[Versions, Found]:
        ops: list[Op] = []
        order = list(versions.items())
        for key, names in order:
            ops.append(op("hmget", key, list(names)))
        for key in entries:
            ops.append(op("get", key))
            ops.append(op("pttl", key))
        results = await self._batched(ops)
        got: Versions = {}
        for (key, names), values in zip(order, results, strict=False):
            got[key] = dict(zip(names, values, strict=True))
        found: Found = {}
        rest = results[len(order) :]
        for i, key in enumerate(entries):
            value, pttl = rest[2 * i], rest[2 * i + 1]
            found[key] = (value, pttl / 1000.0) if value is not None and pttl > 0 else None
        return got, found

    async def ensure_epochs(self, keys: Sequence[str]) -> dict[str, bytes]:
        ops: list[Op] = []
        for key in keys:
            ops.append(op("hsetnx", key, EPOCH, new_epoch()))
            ops.append(op("expire", key, self.version_ttl))
            ops.append(op("hget", key, EPOCH))
        results = await self._run("version", ops)
        return {key: results[i * 3 + 2] for i, key in enumerate(keys)}

    async def save(self, entries: Sequence[tuple[str, bytes, float]], touch: Sequence[str]) -> None:
        ops: list[Op] = []
        for key, value, ttl in entries:
            ops.append(op("set", key, value, px=max(1, int(ttl * 1000))))
        for key in touch:
            ops.append(op("expire", key, self.version_ttl))
        await self._run("set", ops)
        self.metrics.cache_stored_bytes.inc(sum(len(v) for _, v, _ in entries))

    async def bump(self, bumps: Sequence[Bump]) -> None:
        ops: list[Op] = []
        for b in bumps:
            if b.field == EPOCH:
                ops.append(op("hset", b.key, EPOCH, new_epoch()))
            else:
                ops.append(op("hincrby", b.key, b.field, 1))
            ops.append(op("expire", b.key, self.version_ttl))
        try:
            await self._run("version", ops)
        except CacheUnavailable:
            # Out of memory refuses HINCRBY but allows DEL: drop the hashes instead.
            if not self.backoff.ready():
                self.backoff.retry_at = 0.0  # one immediate attempt: invalidation matters
            keys = sorted({b.key for b in bumps})
            await self._run("delete", [op("delete", k) for k in keys])

    async def get(self, key: str) -> bytes | None:
        value: bytes | None = (await self._batched([op("get", key)]))[0]
        return value

    async def add(self, key: str, value: bytes, ttl: float) -> None:
        await self._run("set", [op("set", key, value, px=int(ttl * 1000), nx=True)])

    async def flush(self, pattern: str = "") -> int:
        client = await self._connected()
        removed = 0
        try:
            async with asyncio.timeout(max(self.timeout, 30.0)):
                batch: list[bytes] = []
                async for key in client.scan_iter(match=pattern, count=1000):
                    batch.append(key)
                    if len(batch) >= 500:
                        removed += await self._unlink(client, batch)
                        batch = []
                if batch:
                    removed += await self._unlink(client, batch)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("delete", exc)
            raise CacheUnavailable(str(exc)) from exc
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
            client = await self._connected()
            async with asyncio.timeout(max(self.timeout, 1.0)):
                await client.ping()
        except (RedisError, OSError, TimeoutError):
            return False
        return True

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
