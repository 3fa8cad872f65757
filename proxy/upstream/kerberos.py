"""Connections to a Kerberized metastore: GSSAPI as the proxy, DIGEST-MD5 as an end user.

A connection without a user (the proxy's own calls, and every call with
``--upstream-identity proxy``) authenticates with the proxy's keytab. A connection for an
authenticated end user authenticates with that user's delegation token (see
:mod:`proxy.upstream.tokens`), so the HMS runs its calls as the user, and it is pooled for that
user alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from proxy.config import Endpoint, Options
from proxy.metrics import Metrics
from proxy.sasl.digest import DigestClient
from proxy.sasl.gssapi_mech import GssapiClient
from proxy.sasl.kerberos import KerberosLogin, expand_host, off_loop
from proxy.sasl.layer import Qop, SaslError, SecurityLayer, at_least
from proxy.sasl.stream import (
    ByteReader,
    ByteWriter,
    Negotiator,
    SaslReader,
    SaslWriter,
    client_negotiate,
)
from proxy.upstream.connection import Identity
from proxy.upstream.errors import UpstreamAuthFailed
from proxy.upstream.relay import UNREFUSED_REPLY_BYTES
from proxy.upstream.tokens import TokenBroker

log = logging.getLogger(__name__)

# Frames from the metastore carry replies: a wrapped one must fit in memory whole.
FRAME_SLACK = 64 * 1024


class KerberosUpstream:
    """The pool's :class:`~proxy.upstream.endpoints.UpstreamAuth` for a Kerberized metastore."""

    def __init__(self, options: Options, login: KerberosLogin, metrics: Metrics) -> None:
        assert options.upstream_principal
        self.options = options
        self.login = login
        self.metrics = metrics
        self.principal = options.upstream_principal
        self.qops: Sequence[Qop] = [Qop(q) for q in options.sasl_qop]
        self.tokens: TokenBroker | None = None  # set for --upstream-identity end-user
        # A frame may carry a reply past --max-reply-bytes: the reply's reader says so (a
        # clear error to a client, or a write's reply taken whole), not the frame's.
        self.max_frame = max(options.max_reply_bytes, UNREFUSED_REPLY_BYTES) + FRAME_SLACK
        self._offered_logged = False

    @property
    def per_user(self) -> bool:
        return self.tokens is not None

    async def prepare(self, identity: Identity | None) -> None:
        if self.tokens is not None and identity is not None and identity.user:
            await self.tokens.token(identity.user)

    async def negotiate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        endpoint: Endpoint,
        identity: Identity | None,
    ) -> tuple[ByteReader, ByteWriter]:
        negotiator = Negotiator(reader, writer, self.options.upstream_connect_timeout)
        user = identity.user if identity is not None else None
        mechanism = "gssapi"
        try:
            if self.tokens is not None and user:
                mechanism = "digest-md5"
                layer = await self._digest(negotiator, user)
            else:
                layer = await self._gssapi(negotiator, endpoint)
        except TimeoutError:
            self.metrics.upstream_auth.labels(mechanism, "timeout").inc()
            raise UpstreamAuthFailed(
                f"{endpoint}: no SASL answer within {self.options.upstream_connect_timeout:g} s"
            ) from None
        except SaslError as exc:
            self.metrics.upstream_auth.labels(mechanism, "failed").inc()
            # A refused token was dropped: a new connection fetches another and may succeed.
            raise UpstreamAuthFailed(
                f"{endpoint}: {exc}", retry=mechanism == "digest-md5"
            ) from None
        self.metrics.upstream_auth.labels(mechanism, "ok").inc()
        rest = negotiator.messages.rest()
        return SaslReader(reader, layer, self.max_frame, early=rest), SaslWriter(writer, layer)

    async def _gssapi(self, negotiator: Negotiator, endpoint: Endpoint) -> SecurityLayer:
        target = expand_host(self.principal, endpoint.host)

        def start() -> tuple[GssapiClient, bytes]:
            # Blocking: a login from the keytab when due, and the service ticket's TGS request.
            client = GssapiClient(self.login.initiator(target), self.qops)
            return client, client.first()

        client, first = await off_loop(start, self.options.upstream_connect_timeout)
        self.metrics.kerberos_login_expiry.set(self.login.expires_at)
        await client_negotiate(negotiator, "GSSAPI", first, client.step)
        return client.finish()

    async def _digest(self, negotiator: Negotiator, user: str) -> SecurityLayer:
        assert self.tokens is not None
        # Fetched by prepare(), before the pool slot this connection holds was taken: a fetch
        # here would wait for a connection of the proxy's own while holding one (with every
        # slot so held, until the callers' patience ran out). None held: the pool frees the
        # slot, prepares again and retries once.
        token = self.tokens.held(user)
        if token is None:
            raise UpstreamAuthFailed(f"no delegation token of {user} held yet", retry=True)
        # The same rule as GSSAPI's: the weakest protection offered, at least --sasl-qop's.
        client = DigestClient.for_token(token, qops=at_least(self.qops))
        try:
            rspauth = await client_negotiate(negotiator, "DIGEST-MD5", b"", client.respond)
        except SaslError:
            # Most likely the HMS no longer knows the token (restarted with the memory store):
            # the next connection for this user fetches a new one.
            self.tokens.forget(user, token)
            self.metrics.kerberos_tokens.labels("refused").inc()
            raise
        return client.finish(rspauth)
