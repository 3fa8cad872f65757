"""A small HTTP/1.1 server on the metrics port: ``/metrics`` for Prometheus, ``/`` the status
page for people.

Written on asyncio streams rather than prometheus_client's threaded server so that it shares
the event loop (no locks around the metrics or the status figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.config import HostPort
from proxy.metrics import Metrics

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 16 * 1024


class MetricsServer:
    def __init__(
        self, listen: HostPort, metrics: Metrics, status: Callable[[], bytes] | None = None
    ) -> None:
        self.listen = listen
        self.metrics = metrics
        self.status = status
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.listen.host, self.listen.port, reuse_address=True
        )

    @property
    def ports(self) -> list[int]:
        assert self._server is not None
        return [s.getsockname()[1] for s in self._server.sockets]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            if len(head) > MAX_REQUEST_HEAD:
                raise ValueError("request head too large")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, ctype = "200 OK", CONTENT_TYPE_LATEST
                body = generate_latest(self.metrics.registry)
            elif path == "/" and self.status is not None:
                status, ctype = "200 OK", "text/html; charset=utf-8"
                body = self.status()
            elif path == "/":
                status, ctype = "200 OK", "text/plain; charset=utf-8"
                body = b"hms-cache-proxy: metrics at /metrics\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head_out = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            writer.write(head_out + (body if method != "HEAD" else b""))
            await writer.drain()
        except (
            TimeoutError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ) as exc:
            log.debug("metrics request failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
