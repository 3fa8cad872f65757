"""Delegation tokens the proxy holds for its users, so that calls run at the HMS as them.

Under SASL the HMS ignores ``set_ugi``; what makes a call run as alice is a connection
authenticated as her. The proxy (with ``hadoop.proxyuser`` rights at the HMS) asks for a token
owned by alice and renewable by itself, ``get_delegation_token("alice", <proxy>)``, on its own
Kerberos connection, then opens DIGEST-MD5 connections with it (Trino's and Waggle Dance's
method). A token is renewed before it expires (the HMS says when, in the reply to a renewal),
and fetched anew near its maximum lifetime or when the HMS no longer knows it (an HMS restart
with the in-memory token store forgets every token).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from proxy import idl
from proxy.metrics import Metrics
from proxy.sasl.tokens import HadoopToken, TokenIdentifier
from proxy.upstream.errors import UpstreamAuthFailed, UpstreamError
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# Renew when this fraction of the time to expiry has passed; fetch anew this long before the
# token's maximum lifetime (Hive: renew interval 1 day, maximum lifetime 7 days).
RENEW_FRACTION = 0.75
REFETCH_BEFORE_MAX = 3600.0

# ``ask(method, **args)``: one call on the proxy's own (Kerberos) metastore connection.
Ask = Callable[..., Awaitable[Message]]


@dataclass
class Held:
    text: str  # as the HMS sent it (renew and cancel take this form)
    token: HadoopToken
    identifier: TokenIdentifier
    renew_at: float  # epoch seconds
    refetch_at: float


class TokenBroker:
    def __init__(
        self, ask: Ask, renewer: str, metrics: Metrics, clock: Callable[[], float] = time.time
    ) -> None:
        self.ask = ask
        self.renewer = renewer
        self.metrics = metrics
        self.clock = clock
        self._held: dict[str, Held] = {}
        self._flights: dict[str, asyncio.Future[Held]] = {}

    async def token(self, user: str) -> HadoopToken:
        """A live token of ``user``'s: held, renewed, or fetched (one fetch per user at a time)."""
        held = self._held.get(user)
        now = self.clock()
        if held is not None and now < held.renew_at:
            return held.token
        flight = self._flights.get(user)
        if flight is None:
            flight = asyncio.ensure_future(self._refresh(user, held))
            self._flights[user] = flight
            flight.add_done_callback(lambda _: self._flights.pop(user, None))
        return (await asyncio.shield(flight)).token

    def forget(self, user: str, token: HadoopToken) -> None:
        """The HMS refused ``token`` (it no longer knows it): the next connection fetches anew."""
        held = self._held.get(user)
        if held is not None and held.token == token:
            del self._held[user]

    @property
    def users(self) -> int:
        return len(self._held)

    async def _refresh(self, user: str, held: Held | None) -> Held:
        if held is not None and self.clock() < held.refetch_at:
            try:
                expires = await self._renew(held.text)
                held.renew_at = self._renew_time(expires)
                self.metrics.kerberos_tokens.labels("renewed").inc()
                return held
            except UpstreamError as exc:
                self.metrics.kerberos_tokens.labels("renew_failed").inc()
                log.info(
                    "could not renew %s's delegation token (fetching a new one): %s", user, exc
                )
        fresh = await self._fetch(user)
        self._held[user] = fresh
        return fresh

    async def _fetch(self, user: str) -> Held:
        reply = await self.ask(
            "get_delegation_token", token_owner=user, renewer_kerberos_principal_name=self.renewer
        )
        result = _result("get_delegation_token", reply)
        if result.success is None:
            self.metrics.kerberos_tokens.labels("fetch_failed").inc()
            raise UpstreamAuthFailed(
                f"the metastore gave no delegation token for {user}: {_error(result)} (does it "
                f"grant hadoop.proxyuser.{self.renewer.split('/')[0].split('@')[0]}.* rights?)"
            )
        text = str(result.success)
        token = HadoopToken.decode(text)
        identifier = TokenIdentifier.from_bytes(token.identifier)
        self.metrics.kerberos_tokens.labels("fetched").inc()
        # The reply says nothing of the expiry; a renewal does (and costs one call).
        expires = await self._renew(text)
        max_date = identifier.max_date / 1000
        return Held(
            text,
            token,
            identifier,
            renew_at=self._renew_time(expires),
            refetch_at=max(self.clock(), max_date - REFETCH_BEFORE_MAX),
        )

    async def _renew(self, text: str) -> float:
        reply = await self.ask("renew_delegation_token", token_str_form=text)
        result = _result("renew_delegation_token", reply)
        if result.success is None:
            raise UpstreamAuthFailed(f"renewal refused: {_error(result)}")
        return int(result.success) / 1000

    def _renew_time(self, expires: float) -> float:
        now = self.clock()
        return now + max(1.0, (expires - now) * RENEW_FRACTION)


def _result(method: str, reply: Message) -> Any:
    if reply.header.type != MessageType.REPLY:
        raise UpstreamAuthFailed(f"{method}: the metastore answered with an exception")
    try:
        return idl.decode_result(method, reply.body)
    except ProtocolError as exc:
        raise UpstreamAuthFailed(f"{method}: undecodable reply: {exc}") from None


def _error(result: Any) -> str:
    error = getattr(result, "o1", None)
    return str(getattr(error, "message", error)) if error is not None else "no answer"
