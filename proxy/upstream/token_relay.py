"""Engines holding a metastore delegation token (DIGEST-MD5): the metastore checks it.

The proxy cannot check a token itself (its password is derived from the HMS's secret keys),
so it relays the engine's DIGEST-MD5 negotiation, message for message, over a new connection
to the metastore. If the metastore completes it, the token is good and its owner (the
``username`` of the engine's response is the token's identifier) is the engine's user; that
connection is then closed, and the engine's calls go out like any other user's.

The relay narrows the metastore's challenge to ``qop="auth"``: the frames that follow are
keyed by the token's password, which the proxy does not know, so only unprotected frames can
be read (and cached). Against a metastore that allows no ``auth`` (``hadoop.rpc.protection``
without ``authentication``), token engines are refused with a line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from proxy.sasl.digest import parse_directives, restrict_qop, token_owner
from proxy.sasl.kerberos import short_name
from proxy.sasl.layer import Qop, SaslError
from proxy.sasl.negotiation import Status, encode
from proxy.sasl.stream import Negotiator

log = logging.getLogger(__name__)

# Opens a plain (not yet authenticated) connection to a metastore.
OpenRaw = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class DigestRelay:
    """The :class:`~proxy.sasl.server.TokenRelay` of the proxy."""

    def __init__(self, open_raw: OpenRaw, timeout: float, local_realms: frozenset[str]) -> None:
        self.open_raw = open_raw
        self.timeout = timeout
        self.local_realms = local_realms

    async def relay(self, client: Negotiator, initial: bytes) -> str:
        try:
            reader, writer = await asyncio.wait_for(self.open_raw(), self.timeout)
        except (OSError, TimeoutError) as exc:
            await client.fail(Status.ERROR, "the metastore is not reachable to check the token")
            raise SaslError(f"cannot reach the metastore to check a token: {exc}") from None
        try:
            return await self._relay(client, Negotiator(reader, writer, self.timeout), initial)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _relay(self, client: Negotiator, upstream: Negotiator, initial: bytes) -> str:
        upstream.writer.write(encode(Status.START, b"DIGEST-MD5"))
        await upstream.send(Status.OK, initial)
        owner: str | None = None
        first = True
        while True:
            message = await upstream.receive()
            if message.status is Status.COMPLETE:
                if owner is None:
                    raise SaslError("the metastore completed DIGEST-MD5 before a response")
                await client.send(Status.COMPLETE, message.payload)
                return owner
            if message.status is not Status.OK:
                await client.send(message.status, message.payload)  # the HMS's own words
                reason = message.payload.decode("utf-8", "replace") or message.status.name
                raise SaslError(f"the metastore refused the token: {reason}")
            payload = message.payload
            if first:
                first = False
                payload = self._narrow(payload)
            await client.send(Status.OK, payload)
            answer = await client.receive()
            if answer.status not in (Status.OK, Status.COMPLETE):
                raise SaslError(f"the engine sent {answer.status.name} during DIGEST-MD5")
            if owner is None and answer.payload:
                owner = self._owner(answer.payload)
            await upstream.send(answer.status, answer.payload)

    def _narrow(self, challenge: bytes) -> bytes:
        offered = parse_directives(challenge).get("qop", "auth")
        if "auth" not in [q.strip() for q in offered.split(",")]:
            raise SaslError(
                f"the metastore allows DIGEST-MD5 only with {offered} (hadoop.rpc.protection "
                "privacy/integrity): the proxy cannot read such a token connection"
            )
        return restrict_qop(challenge, {Qop.AUTH})

    def _owner(self, response: bytes) -> str:
        directives = parse_directives(response)
        if directives.get("qop", "auth") != "auth":
            raise SaslError(f"the engine chose qop {directives.get('qop')} (only auth relays)")
        try:
            owner = token_owner(response)
        except (ValueError, SaslError) as exc:
            raise SaslError(f"not a metastore delegation token: {exc}") from None
        user = short_name(owner, self.local_realms) if "@" in owner else owner
        if not user:
            raise SaslError("a delegation token without an owner")
        return user
