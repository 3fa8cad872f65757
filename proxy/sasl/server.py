"""The proxy's side of an engine's SASL negotiation: who the engine is, and its frames.

GSSAPI (Kerberos) is terminated here with the proxy's keytab. DIGEST-MD5 (a metastore
delegation token: Trino with impersonation, Hive tasks, Spark in cluster mode) is checked by
the metastore itself: the negotiation is relayed to it (see :mod:`proxy.upstream.token_relay`),
and the token's owner is the user once the metastore accepts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.sasl.gssapi_mech import GssapiServer
from proxy.sasl.kerberos import KerberosLogin, short_name
from proxy.sasl.layer import PLAIN, Qop, SaslError, SecurityLayer
from proxy.sasl.negotiation import Status
from proxy.sasl.stream import Negotiator, PeerClosed, SaslReader, SaslWriter

log = logging.getLogger(__name__)


class TokenRelay(Protocol):
    """Has the metastore check a DIGEST-MD5 negotiation; returns the token's owner."""

    async def relay(self, negotiator: Negotiator, initial: bytes) -> str: ...


@dataclass(frozen=True, slots=True)
class Authenticated:
    user: str  # the short name calls run as
    principal: str  # the Kerberos principal, or the token's owner
    mechanism: str
    qop: Qop
    reader: SaslReader
    writer: SaslWriter


class Refused(Exception):
    """The negotiation failed; the engine was told, the connection must close. ``reason`` is
    the metric label."""

    def __init__(self, mechanism: str, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.mechanism = mechanism
        self.reason = reason


class SaslAcceptor:
    def __init__(
        self,
        login: KerberosLogin,
        offered: Sequence[Qop],
        local_realms: frozenset[str],
        max_frame: int,
        token_relay: TokenRelay | None,
    ) -> None:
        self.login = login
        self.offered = list(offered)
        self.local_realms = local_realms
        self.max_frame = max_frame
        self.token_relay = token_relay

    async def accept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float,
        on_frame_error: Callable[[SaslError], None] | None = None,
    ) -> Authenticated:
        negotiator = Negotiator(reader, writer, timeout)
        mechanism = "none"
        try:
            start = await negotiator.receive()
            if start.status is not Status.START:
                raise SaslError(f"expected START, got {start.status.name}")
            mechanism = start.payload.decode("ascii", "replace").upper()
            initial = await negotiator.receive()
            if mechanism == "GSSAPI":
                principal, layer = await self._gssapi(negotiator, initial.payload)
                user = short_name(principal, self.local_realms)
            elif mechanism == "DIGEST-MD5" and self.token_relay is not None:
                if Qop.AUTH not in self.offered:
                    # A relayed token connection can only be unprotected (see token_relay).
                    raise SaslError(
                        "token (DIGEST-MD5) engines need --sasl-qop to include authentication"
                    )
                principal = await self.token_relay.relay(negotiator, initial.payload)
                user, layer = principal, PLAIN
            else:
                await negotiator.fail(Status.BAD, f"unsupported SASL mechanism {mechanism}")
                raise Refused(mechanism, "unsupported", f"unsupported SASL mechanism {mechanism!r}")
        except TimeoutError:
            raise Refused(
                mechanism, "timeout", f"no SASL negotiation within {timeout:g} s"
            ) from None
        except PeerClosed:
            raise Refused(mechanism, "none", "closed before a word") from None
        except SaslError as exc:
            await negotiator.fail(Status.BAD, str(exc))
            reason = "protocol" if mechanism == "none" else "failed"
            raise Refused(mechanism, reason, self._explained(str(exc))) from None
        sasl_reader = SaslReader(
            reader, layer, self.max_frame, early=negotiator.messages.rest(), on_error=on_frame_error
        )
        return Authenticated(
            user, principal, mechanism, layer.qop, sasl_reader, SaslWriter(writer, layer)
        )

    def _explained(self, text: str) -> str:
        """The likely mistake behind the two commonest refusals, for the log line."""
        if "request ticket server" in text or "Cannot find key for" in text:
            return (
                f"{text} (the engine asked for another service's ticket: it must name this "
                f"proxy's principal, {self.login.principal}, as hive.metastore.kerberos."
                "principal / hive.metastore.service.principal)"
            )
        if "closed the connection during SASL negotiation" in text:
            offered = ", ".join(q.value for q in self.offered)
            return (
                f"{text} (offered protection: {offered} (--sasl-qop); an engine wanting "
                "another, e.g. hadoop.rpc.protection=privacy, hangs up)"
            )
        return text

    async def _gssapi(self, negotiator: Negotiator, token: bytes) -> tuple[str, SecurityLayer]:
        context = self.login.acceptor()
        server = GssapiServer(context, self.offered)
        # The first step decrypts the ticket and checks the replay cache, on disk: off the loop.
        reply, last = await asyncio.to_thread(server.step, token, lambda: context.initiator_name)
        while True:
            if last:
                await negotiator.send(Status.COMPLETE, reply)
                break
            await negotiator.send(Status.OK, reply)
            message = await negotiator.receive()
            # Java's client sends its last message (the chosen layer) as COMPLETE.
            if message.status not in (Status.OK, Status.COMPLETE):
                raise SaslError(f"the client sent {message.status.name} during GSSAPI")
            reply, last = server.step(message.payload, lambda: context.initiator_name)
        assert server.outcome is not None
        return server.outcome.principal, server.outcome.layer
