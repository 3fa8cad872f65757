"""A small HTTP/1.1 server on the metrics port: ``/metrics`` for Prometheus, ``/`` the status
page for people, ``/healthz`` and ``/readyz`` for Kubernetes HTTP probes.

Written on asyncio streams rather than prometheus_client's threaded server so that it shares
the event loop for the cheap parts. The expensive ones, writing out every series of the
registry (~20 ms) and rendering the status page, run in a worker thread: on the event loop
they would stall every client for as long at each scrape. prometheus_client's metrics are
thread-safe; what the status page reads besides the registry is copied on the loop first.

``/metrics`` speaks what the scraper asks for (``Accept``: the Prometheus text format, or
OpenMetrics) and gzips when it may (``Accept-Encoding``), as prometheus_client's own server
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
from collections.abc import Callable

from prometheus_client.exposition import choose_encoder

from proxy.config import HostPort
from proxy.loop import guarded_write
from proxy.metrics import Metrics

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 16 * 1024
# A page renderer taken on the event loop, run in a thread.
StatusPage = Callable[[], Callable[[], bytes]]
# (ready, the checks) as the admin port's readiness service last saw them.
Readiness = Callable[[], tuple[bool, dict[str, str]]]


class MetricsServer:
    def __init__(
        self,
        listen: HostPort,
        metrics: Metrics,
        status: StatusPage | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.listen = listen
        self.metrics = metrics
        self.status = status
        self.readiness = readiness
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
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            status, extra, body = await self._answer(method, target.split("?", 1)[0], headers)
            head_out = (
                f"HTTP/1.1 {status}\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            guarded_write(writer, head_out + (body if method != "HEAD" else b""))
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

    async def _answer(
        self, method: str, path: str, headers: dict[str, str]
    ) -> tuple[str, str, bytes]:
        """(status line, extra header lines, body)."""
        text = "Content-Type: text/plain; charset=utf-8\r\n"
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", text, b"GET only\n"
        if path == "/metrics":
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            self.metrics.settle()
            body = await asyncio.to_thread(encoder, self.metrics.registry)
            extra = f"Content-Type: {content_type}\r\n"
            if "gzip" in headers.get("accept-encoding", ""):
                body = await asyncio.to_thread(gzip.compress, body, 6)
                extra += "Content-Encoding: gzip\r\n"
            return "200 OK", extra, body
        if path == "/healthz":  # liveness: the event loop answers
            return "200 OK", text, b"ok\n"
        if path == "/readyz":
            if self.readiness is None:
                return "200 OK", text, b"ready\n"
            ready, checks = self.readiness()
            detail = "".join(f"{k}={v}\n" for k, v in checks.items())
            if ready:
                return "200 OK", text, ("ready\n" + detail).encode()
            return "503 Service Unavailable", text, ("not ready\n" + detail).encode()
        if path == "/" and self.status is not None:
            page = await asyncio.to_thread(self.status())
            return "200 OK", "Content-Type: text/html; charset=utf-8\r\n", page
        if path == "/":
            return "200 OK", text, b"hms-cache-proxy: metrics at /metrics\n"
        return "404 Not Found", text, b"not found\n"
