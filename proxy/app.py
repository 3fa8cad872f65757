"""Composition root: build the proxy from its options, run it, stop it gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import hmac
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.admin.server import DEGRADED, DOWN, OK, AdminServer
from proxy.admin.service import AdminService
from proxy.audit import AuditLog
from proxy.auth import Kerberos
from proxy.cache.engine import CacheEngine
from proxy.cache.keys import Naming
from proxy.cache.planner import Planner, Ttls
from proxy.cache.redis_store import RedisStore
from proxy.cache.resp import encoded_footprint
from proxy.cache.store import MemoryStore, Store
from proxy.config import Options, option_warnings
from proxy.follower import NotificationFollower
from proxy.freshness import FreshnessCheck
from proxy.handler import CallHandler
from proxy.http import MetricsServer
from proxy.listing.service import ListingService
from proxy.memory import keep_trimming
from proxy.metrics import Metrics
from proxy.server import ThriftServer
from proxy.status import Activity, render
from proxy.upstream import UpstreamPool

log = logging.getLogger(__name__)


def tune_garbage_collector() -> None:
    """Fewer, not longer, full collections.

    The cache keeps many small objects alive (entries, plans, version maps), and a full
    collection walks all of them: ~100 ms every few seconds under load, during which no
    client is answered and Redis replies look late. What exists at start-up (modules, the
    IDL's classes) is frozen out of collections for good, and young objects are collected
    in larger batches, so a full collection comes minutes apart instead of seconds. The
    proxy makes little cyclic garbage; the soak benchmark (bench/load.py --soak) shows its
    memory flat with these settings.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


@dataclass
class Proxy:
    options: Options
    metrics: Metrics
    pool: UpstreamPool
    thrift: ThriftServer
    http: MetricsServer

    cache: CacheEngine | None
    follower: NotificationFollower | None
    admin: AdminServer | None = None
    kerberos: Kerberos | None = None
    freshness: FreshnessCheck | None = None
    audit: AuditLog | None = None
    _login_task: asyncio.Task[None] | None = None
    _trim_task: asyncio.Task[None] | None = None

    @classmethod
    def build(cls, options: Options, metrics: Metrics | None = None) -> Proxy:
        for warning in option_warnings(options):  # once: build runs at start-up only
            log.warning("configuration: %s", warning)
        metrics = metrics or Metrics()
        activity = Activity(
            show_names=options.status_show_names == "on", secret=status_secret(options)
        )
        kerberos = Kerberos.build(options, metrics)
        pool = UpstreamPool(options, metrics, auth=kerberos.upstream if kerberos else None)
        if kerberos is not None:
            kerberos.attach(pool, options, metrics)
        cache = build_cache(options, metrics, activity) if options.cache == "on" else None
        handler = CallHandler(
            pool,
            metrics,
            cache,
            max_reply_bytes=options.max_reply_bytes,
            check_iceberg_base=options.iceberg_expected_location == "on",
            audit=(
                AuditLog(options.audit_log, options.audit_log_max_bytes, options.audit_log_backups)
                if options.audit_log
                else None
            ),
        )

        def status_page() -> Callable[[], bytes]:
            """Taken on the event loop (a copy of what changes), rendered off it."""
            metrics.settle()
            snapshot, facts = activity.snapshot(), status_facts(options, cache)
            return lambda: render(metrics, snapshot, facts)

        follower = None
        if cache is not None and options.notifications != "off":
            follower = NotificationFollower(options, cache, pool, metrics)
        if cache is not None:
            cache.serve_iceberg = iceberg_policy(options, follower)
        metrics.watch_memos(
            {
                "redis_commands": encoded_footprint(),
                "set_ugi_replies": pool.ugi_replies_footprint(),
                **(cache.memos() if cache is not None else {}),
                **({"known_calls": handler.known.footprint} if handler.known is not None else {}),
            }
        )
        proxy = cls(
            options,
            metrics,
            pool,
            ThriftServer(options, handler, metrics, kerberos.acceptor if kerberos else None),
            MetricsServer(options.metrics_listen, metrics, status_page),
            cache,
            follower,
        )
        service = AdminService(handler, cache, metrics, follower)
        listing = ListingService(options, service.calls, cache, metrics)
        proxy.kerberos = kerberos
        proxy.audit = handler.audit.log if handler.audit is not None else None
        if cache is not None and options.freshness_check_rate > 0:
            proxy.freshness = FreshnessCheck(
                options, cache, handler.forwarder, pool, metrics, follower
            )
        proxy.admin = AdminServer(options, service, proxy.readiness_checks, listing)
        admin = proxy.admin
        proxy.http.readiness = lambda: (admin.ready, admin.shown_checks())
        return proxy

    async def readiness_checks(self) -> dict[str, str]:
        """What readiness depends on, each ``ok``, ``down`` or ``degraded`` (down, and ready
        all the same: Redis with ``--ready-without-redis on``, calls then go to the HMS)."""
        metastore = await self.pool.probe()
        self.metrics.upstream_available.set(1 if metastore else 0)
        checks = {
            "listening": OK if self.thrift.listening else DOWN,
            "metastore": OK if metastore else DOWN,
        }
        if self.kerberos is not None:
            checks["kerberos"] = OK if self.kerberos.login.valid() else DOWN
        if self.cache is not None and self.options.redis:
            redis_ok = await self.cache.store.ping()
            self.metrics.cache_available.set(1 if redis_ok else 0)
            degraded = self.options.ready_without_redis == "on"
            checks["redis"] = OK if redis_ok else DEGRADED if degraded else DOWN
        return checks

    async def start(self) -> None:
        if self.options.forward_at_once == "off":
            log.warning(
                "--forward-at-once is gone and is ignored: calls only forwarded are sent as "
                "they arrive (--fast-paths off, for development, turns every fast path off)"
            )
        if self.kerberos is not None:
            await self.kerberos.start(self.metrics)
            self._login_task = asyncio.create_task(self.kerberos.keep_logged_in(self.metrics))
        await self.http.start()
        if self.cache is not None and not await self.cache.store.connect(wait=3.0):
            log.warning("cache: Redis not reachable yet; serving from the metastore meanwhile")
        if self.follower is not None:
            # A first poll before serving: if this cache has never been followed, it is
            # flushed now, not under the first clients' feet.
            await self.follower.first_poll(wait=5.0)
        await self.thrift.start()
        if self.admin is not None:
            await self.admin.start()
            await self.admin.check()
        if self.follower is not None:
            self.follower.start()
        if self.cache is not None:
            self.cache.locks.start()
        if self.freshness is not None:
            self.freshness.start()
        tune_garbage_collector()
        if self.options.malloc_trim_seconds > 0:
            self._trim_task = asyncio.create_task(keep_trimming(self.options.malloc_trim_seconds))
        log.info(
            "hms-cache-proxy listening on %s (metrics on %s, admin on %s), metastore %s",
            self.options.listen,
            self.options.metrics_listen,
            self.options.admin_listen,
            ", ".join(str(e) for e in self.options.upstream),
        )

    async def stop(self) -> None:
        if self.admin is not None:
            await self.admin.not_ready()
        for task in (self._login_task, self._trim_task):
            if task is not None:
                task.cancel()
        if self.follower is not None:
            await self.follower.stop()
        if self.freshness is not None:
            await self.freshness.stop()
        await self.thrift.stop(self.options.drain_timeout)
        if self.cache is not None:
            await self.cache.locks.stop()
        if self.admin is not None:
            await self.admin.stop()
        await self.pool.close()
        if self.cache is not None:
            await self.cache.store.close()
        await self.http.stop()
        if self.audit is not None:
            self.audit.close()  # (the lines of the last second)


def ttls_of(options: Options) -> Ttls:
    return Ttls(
        catalog=options.ttl_catalog,
        database=options.ttl_database,
        table=options.ttl_table,
        partitions=options.ttl_partitions,
        statistics=options.ttl_statistics,
        functions=options.ttl_functions,
        negative=options.ttl_negative,
    )


def status_secret(options: Options) -> bytes | None:
    """The key of the status page's table hashes: derived from the admin token, the one
    secret a deployment's proxies share, so that their pages agree; without a token (the
    admin port on loopback), a random one of this process."""
    if not options.admin_token_file:
        return None
    token = Path(options.admin_token_file).read_bytes().strip()
    return hmac.new(token, b"hms-cache-proxy status page names", hashlib.sha256).digest()


def iceberg_policy(options: Options, follower: NotificationFollower | None) -> Callable[[], bool]:
    """Whether Iceberg table objects may be served from the cache now."""
    if options.cache_iceberg_tables == "on":
        return lambda: True
    if options.cache_iceberg_tables == "off" or follower is None:
        return lambda: False
    return lambda: follower.following


def status_facts(options: Options, cache: CacheEngine | None) -> dict[str, object]:
    """What the status page shows that the metrics do not hold."""
    if cache is None:
        store = "off"
    elif options.redis:
        store = f"Redis ({options.redis_mode})"
    else:
        store = "embedded (in this process)"
    return {"upstreams": [str(e) for e in options.upstream], "store": store}


def build_cache(
    options: Options, metrics: Metrics, activity: Activity | None = None
) -> CacheEngine:
    ttls = ttls_of(options)
    store: Store
    if options.redis:
        store = RedisStore(
            options.redis,
            timeout=options.redis_timeout,
            # A version hash must outlive every entry filled under it (listings included).
            version_ttl=max(ttls.longest, options.ttl_listings) * 2 + 60,
            metrics=metrics,
            mode=options.redis_mode,
            # (A freshness quarantine is a fence too: see proxy.freshness.)
            fence_ttl=max(
                options.write_fence_seconds,
                options.lock_fence_seconds,
                options.freshness_quarantine,
            ),
            tracking_prefix=options.redis_key_prefix if options.redis_tracking == "on" else None,
            tracking_max_lag=options.redis_tracking_max_lag,
            write_trust=options.redis_write_trust,
            key_prefix=options.redis_key_prefix,
            # The versions are small next to the replies: an eighth of the front's budget.
            mirror_bytes=max(1 << 20, options.memory_cache_bytes // 8),
            clients=options.max_client_connections,
        )
    else:
        # Seven eighths for the entries, one for the decoded front (see CacheEngine.l1).
        store = MemoryStore(options.memory_cache_bytes - options.memory_cache_bytes // 8)
    planner = Planner(Naming(options.redis_key_prefix), ttls, per_user=options.per_user_cache)
    return CacheEngine(
        store,
        planner,
        metrics,
        l1_bytes=options.memory_cache_bytes,
        max_entry_bytes=options.cache_max_entry_bytes,
        write_fence=options.write_fence_seconds,
        lock_fence=options.lock_fence_seconds,
        stale_window=options.stale_if_error,
        activity=activity,
    )


async def serve(options: Options) -> int:
    """Run until SIGTERM or SIGINT, then drain in-flight calls and return the exit code."""
    proxy = Proxy.build(options)
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: draining calls in flight (up to %g s)", options.drain_timeout)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
    await proxy.stop()
    log.info("stopped")
    return 0
