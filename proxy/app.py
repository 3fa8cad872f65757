"""Composition root: build the proxy from its options, run it, stop it gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

from proxy.config import Options
from proxy.handler import CallHandler
from proxy.http import MetricsServer
from proxy.metrics import Metrics
from proxy.server import ThriftServer
from proxy.upstream import UpstreamPool

log = logging.getLogger(__name__)


@dataclass
class Proxy:
    options: Options
    metrics: Metrics
    pool: UpstreamPool
    thrift: ThriftServer
    http: MetricsServer

    @classmethod
    def build(cls, options: Options, metrics: Metrics | None = None) -> Proxy:
        metrics = metrics or Metrics()
        pool = UpstreamPool(options, metrics)
        handler = CallHandler(options, pool, metrics)
        return cls(
            options,
            metrics,
            pool,
            ThriftServer(options, handler, metrics),
            MetricsServer(options.metrics_listen, metrics),
        )

    async def start(self) -> None:
        await self.http.start()
        await self.thrift.start()
        log.info(
            "hms-cache-proxy listening on %s (metrics on %s), metastore %s",
            self.options.listen,
            self.options.metrics_listen,
            ", ".join(str(e) for e in self.options.upstream),
        )

    async def stop(self) -> None:
        await self.thrift.stop(self.options.drain_timeout)
        await self.pool.close()
        await self.http.stop()


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
