"""The admin port: the admin API behind a bearer token, and the health service.

Health answers two services, for Kubernetes gRPC probes:

* ``""`` (liveness): SERVING while the process's event loop answers; it never depends on
  the metastore, so an HMS outage does not get every proxy restarted;
* ``"readiness"``: SERVING when the Thrift port listens, the metastore answers, and Redis
  answers (or ``--ready-without-redis on``, the default: the proxy then serves from the
  metastore, degraded). Checked every couple of seconds.

The token guards the admin and listing APIs, everything but health: probes cannot send one,
and health reveals nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from proxy.admin._gen import admin_pb2_grpc as pb_grpc
from proxy.admin._gen import listing_pb2_grpc as listing_grpc
from proxy.admin.service import AdminService
from proxy.config import Options, is_loopback
from proxy.listing.service import ListingService

log = logging.getLogger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"
# What each readiness check says; ``degraded`` is down but ready all the same.
OK, DOWN, DEGRADED = "ok", "down", "degraded"
READINESS = "readiness"
CHECK_EVERY = 2.0


class TokenGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls (but health checks) that do not carry ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if details.method.startswith(HEALTH_PREFIX) or handler is None:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(given).encode(), self.expected):
            return handler
        log.warning("admin: refused %s without a valid token", details.method)

        async def deny_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required")

        async def deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required")
            yield  # pragma: no cover - makes this an async generator

        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(deny_stream, **codec)
        return grpc.unary_unary_rpc_method_handler(deny_unary, **codec)


class AdminServer:
    def __init__(
        self,
        options: Options,
        service: AdminService,
        checks: Callable[[], Awaitable[dict[str, str]]],
        listing: ListingService | None = None,
    ) -> None:
        self.options = options
        self.service = service
        self.listing = listing
        self.checks = checks
        self.health = HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = 0
        self.ready = False
        self.last_checks: dict[str, str] = {}

    async def start(self) -> None:
        interceptors = []
        if self.options.admin_token_file:
            token = Path(self.options.admin_token_file).read_text().strip()
            interceptors.append(TokenGuard(token))
        # gRPC sets SO_REUSEPORT by default: a second proxy on the same host would then
        # listen on this port too, and admin calls reach either at random.
        self._server = grpc.aio.server(
            interceptors=interceptors, options=[("grpc.so_reuseport", 0)]
        )
        pb_grpc.add_AdminServicer_to_server(self.service, self._server)  # type: ignore[no-untyped-call]
        if self.listing is not None:
            listing_grpc.add_ListingServicer_to_server(self.listing, self._server)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        address = str(self.options.admin_listen)
        try:
            if self.options.admin_tls_cert:
                self.port = self._server.add_secure_port(address, self._credentials())
            else:
                self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's way of saying it could not bind
            raise OSError(f"admin port {address}: {exc} (is another proxy using it?)") from exc
        if not self.port:
            raise OSError(f"admin port {address}: cannot listen (is another proxy using it?)")
        if not self.options.admin_tls_cert and not is_loopback(self.options.admin_listen.host):
            log.warning(
                "admin: %s is not loopback and has no TLS (--admin-tls-cert): the admin token "
                "crosses the network in the clear",
                address,
            )
        await self._server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def _credentials(self) -> grpc.ServerCredentials:
        assert self.options.admin_tls_cert and self.options.admin_tls_key
        key = Path(self.options.admin_tls_key).read_bytes()
        chain = Path(self.options.admin_tls_cert).read_bytes()
        return grpc.ssl_server_credentials([(key, chain)])

    async def _watch(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(CHECK_EVERY)

    async def check(self) -> bool:
        before = self.last_checks
        try:
            self.last_checks = await self.checks()
        except Exception:
            log.exception("readiness check failed")
            self.last_checks = {"checks": DOWN}
        ready = all(v in (OK, DEGRADED) for v in self.last_checks.values())
        if ready != self.ready or self.last_checks != before:  # said once per change
            log.info("readiness: %s (%s)", "ready" if ready else "not ready", self.summary())
        self.ready = ready
        status = health_pb2.HealthCheckResponse
        await self.health.set(READINESS, status.SERVING if ready else status.NOT_SERVING)
        return ready

    def summary(self) -> str:
        """``listening=ok, metastore=ok, redis=down (degraded: serving from the metastore)``"""
        return ", ".join(f"{k}={v}" for k, v in self.shown_checks().items())

    def shown_checks(self) -> dict[str, str]:
        """The last checks as the log and ``/readyz`` say them: a degraded part is ``down``
        (it is: Redis does not answer), with why the proxy is ready all the same."""
        return {
            k: "down (degraded: serving from the metastore)" if v == DEGRADED else v
            for k, v in self.last_checks.items()
        }

    async def not_ready(self) -> None:
        """Draining: take the proxy out of rotation, stay alive."""
        if self._task is not None:
            self._task.cancel()
        await self.health.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self.listing is not None:
            self.listing.close()
