"""The metastores the proxy connects to: which to try first, and opening a connection to one.

Several metastores may be configured (``--upstream``), in order of preference. A new
connection goes to the first that answers, passing over those that refused one within the
last :data:`ENDPOINT_BACKOFF_SECONDS` while others are tried (their connect timeout would
otherwise be paid on every new connection while one is down). It is authenticated as the
pool's :class:`UpstreamAuth` says (SASL on a Kerberized metastore); a plain one's replies
can be taken as they arrive (:mod:`.streams`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from proxy.config import Endpoint, Options
from proxy.metrics import Metrics
from proxy.sasl.stream import ByteReader, ByteWriter
from proxy.tls import upstream_context
from proxy.upstream.connection import Identity, UpstreamConnection
from proxy.upstream.errors import UpstreamUnreachable
from proxy.upstream.relay import READ_SIZE
from proxy.upstream.streams import diverting, open_connection
from proxy.wire.framing import MessageReader

log = logging.getLogger(__name__)

# How long an endpoint that refused a connection is passed over while others are tried.
ENDPOINT_BACKOFF_SECONDS = 10.0


# Opens the byte stream to one endpoint (TCP, with TLS if configured; tests pass their own).
Opener = Callable[[Endpoint], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class UpstreamAuth(Protocol):
    """How a new connection authenticates (SASL on a Kerberized metastore)."""

    @property
    def per_user(self) -> bool:
        """Whether an identity's user is bound by the negotiation (a delegation token of
        theirs): then no connection of another identity can become theirs by set_ugi."""

    async def prepare(self, identity: Identity | None) -> None:
        """What a connection for ``identity`` needs first (its token), before a slot is held."""

    async def negotiate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        endpoint: Endpoint,
        identity: Identity | None,
    ) -> tuple[ByteReader, ByteWriter]:
        """The streams of an authenticated connection; raises UpstreamAuthFailed."""


class Endpoints:
    """The configured metastores, those that failed recently, and connections to them."""

    def __init__(self, options: Options, metrics: Metrics, opener: Opener | None = None) -> None:
        self._options = options
        self._metrics = metrics
        self._tls = upstream_context(options)
        self._open_stream = opener or self._open_tcp
        self._failed_at: dict[Endpoint, float] = {}
        self._down: set[Endpoint] = set()  # endpoints whose last connection attempt failed

    def _order(self) -> list[Endpoint]:
        """Configured order, passing over endpoints that failed recently (all, if all did)."""
        now = time.monotonic()
        healthy = [
            e
            for e in self._options.upstream
            if now - self._failed_at.get(e, -1e9) > ENDPOINT_BACKOFF_SECONDS
        ]
        return healthy + [e for e in self._options.upstream if e not in healthy]

    async def connect(
        self, identity: Identity | None, auth: UpstreamAuth | None
    ) -> UpstreamConnection:
        """A new connection to the first metastore that answers, authenticated by ``auth``
        for ``identity`` (not yet bound to it: that is the pool's); raises
        UpstreamUnreachable, or UpstreamAuthFailed."""
        errors = []
        for endpoint in self._order():
            try:
                reader, writer = await asyncio.wait_for(
                    self._open_stream(endpoint), self._options.upstream_connect_timeout
                )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                self._metrics.upstream_connects.labels("failed").inc()
                self._failed_at[endpoint] = time.monotonic()
                reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
                errors.append(f"{endpoint}: {reason}")
                # Said once when it goes down (and once when it is back), not at every try:
                # the health probe alone tries every 2 s.
                if endpoint not in self._down:
                    self._down.add(endpoint)
                    log.warning("cannot connect to metastore %s: %s", endpoint, reason)
                else:
                    log.debug("cannot connect to metastore %s: %s", endpoint, reason)
                continue
            self._metrics.upstream_connects.labels("ok").inc()
            self._failed_at.pop(endpoint, None)
            if endpoint in self._down:
                self._down.discard(endpoint)
                log.info("metastore %s is reachable again", endpoint)
            replies = MessageReader(
                self._options.upstream_transport, self._options.max_reply_bytes, keep=False
            )
            if auth is None:
                conn = UpstreamConnection(endpoint, reader, writer, replies)
                conn.diverter = diverting(writer)
                return conn
            try:
                streams = await auth.negotiate(reader, writer, endpoint, identity)
            except BaseException:
                writer.close()
                raise
            return UpstreamConnection(endpoint, *streams, replies)
        raise UpstreamUnreachable("no metastore reachable (" + "; ".join(errors) + ")")

    async def open_raw(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A bare stream to the first metastore that answers, outside the pool (for relaying
        an engine's own SASL negotiation to it)."""
        errors = []
        for endpoint in self._order():
            try:
                return await self._open_stream(endpoint)
            except OSError as exc:
                errors.append(f"{endpoint}: {exc}")
        raise OSError("no metastore reachable (" + "; ".join(errors) + ")")

    async def _open_tcp(
        self, endpoint: Endpoint
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_connection(
            endpoint.host,
            endpoint.port,
            limit=READ_SIZE,
            ssl=self._tls,
            server_hostname=endpoint.host if self._tls else None,
        )
