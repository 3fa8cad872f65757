"""Delegation tokens the proxy holds for its users, so that calls run at the HMS as them.

Under SASL the HMS ignores ``set_ugi``; what makes a call run as alice is a connection
authenticated as her. The proxy (with ``hadoop.proxyuser`` rights at the HMS) asks for a token
owned by alice, ``get_delegation_token("alice", <proxy>)``, on its own Kerberos connection,
then opens DIGEST-MD5 connections with it (Trino's and Waggle Dance's method).

A token is replaced by a new one after ``TOKEN_TTL`` (Trino's ``delegation-token.cache-ttl``
and Waggle Dance's default, one hour), long before it could expire (Hive: a day without
renewal, seven at most), and at once when the HMS no longer knows it (an HMS restart with the
in-memory token store forgets every token). Renewing instead is not possible for a proxy with
a service principal: HMS 2.3 compares the stored renewer, a short name (``proxy``), with the
renewing caller's full name (``proxy/host@REALM``) and refuses.
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
from proxy.tasks import background
from proxy.upstream.errors import UpstreamAuthFailed, UpstreamError
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

TOKEN_TTL = 3600.0
# How long past its replacement time a held token is still used for a connection opened in a
# pool slot (a call may have waited that long for its slot): well within Hadoop's renewal
# interval (a day by default) of a token replaced every TOKEN_TTL.
HELD_GRACE = 900.0

# ``ask(method, **args)``: one call on the proxy's own (Kerberos) metastore connection.
Ask = Callable[..., Awaitable[Message]]


@dataclass
class Held:
    text: str  # as the HMS sent it
    token: HadoopToken
    identifier: TokenIdentifier
    replace_at: float  # epoch seconds


class TokenBroker:
    def __init__(
        self,
        ask: Ask,
        renewer: str,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        ttl: float = TOKEN_TTL,
    ) -> None:
        self.ask = ask
        self.renewer = renewer
        self.metrics = metrics
        self.clock = clock
        self.ttl = ttl
        self._held: dict[str, Held] = {}
        self._flights: dict[str, asyncio.Future[Held]] = {}

    async def token(self, user: str) -> HadoopToken:
        """A live token of ``user``'s: held, or fetched (one fetch per user at a time)."""
        held = self._held.get(user)
        if held is not None and self.clock() < held.replace_at:
            return held.token
        flight = self._flights.get(user)
        if flight is None:
            flight = asyncio.ensure_future(self._fetch(user))
            self._flights[user] = flight
            flight.add_done_callback(lambda _: self._flights.pop(user, None))
        return (await asyncio.shield(flight)).token

    def held(self, user: str) -> HadoopToken | None:
        """``user``'s token as held now, never fetched: for a connection being opened in a
        pool slot (:meth:`token` ran before the slot was taken; a fetch now would need a
        connection of its own while holding one). Still given a while after it was due for
        replacement (``HELD_GRACE``), never near its own end."""
        held = self._held.get(user)
        if held is None:
            return None
        max_date = held.identifier.max_date / 1000 if held.identifier.max_date else float("inf")
        if self.clock() >= min(held.replace_at + HELD_GRACE, max_date - 60):
            return None
        return held.token

    def forget(self, user: str, token: HadoopToken) -> None:
        """The HMS refused ``token`` (it no longer knows it): the next connection fetches anew."""
        held = self._held.get(user)
        if held is not None and held.token == token:
            del self._held[user]

    @property
    def users(self) -> int:
        return len(self._held)

    async def _fetch(self, user: str) -> Held:
        try:
            reply = await self.ask(
                "get_delegation_token",
                token_owner=user,
                renewer_kerberos_principal_name=self.renewer,
            )
            result = _result("get_delegation_token", reply)
        except UpstreamError:
            self.metrics.kerberos_tokens.labels("fetch_failed").inc()
            raise
        if result.success is None:
            self.metrics.kerberos_tokens.labels("fetch_failed").inc()
            short = self.renewer.split("/")[0].split("@")[0]
            raise UpstreamAuthFailed(
                f"the metastore gave no delegation token for {user}: {_error(result)} (does it "
                f"grant the proxy hadoop.proxyuser.{short}.hosts/groups/users?)"
            )
        text = str(result.success)
        token = HadoopToken.decode(text)
        identifier = TokenIdentifier.from_bytes(token.identifier)
        self.metrics.kerberos_tokens.labels("fetched").inc()
        # Never past the token's own end, should the HMS's lifetimes be shorter than the TTL.
        max_date = identifier.max_date / 1000 if identifier.max_date else float("inf")
        replace_at = min(self.clock() + self.ttl, max_date - 60)
        held = Held(text, token, identifier, replace_at)
        replaced = self._held.get(user)
        self._held[user] = held
        if replaced is not None:
            # The HMS would keep it until it expires; the proxy, its renewer, may cancel it.
            background(self._cancel(replaced.text), "cancelling a replaced delegation token")
        return held

    async def _cancel(self, text: str) -> None:
        try:
            reply = await self.ask("cancel_delegation_token", token_str_form=text)
            result = _result("cancel_delegation_token", reply)
            if getattr(result, "o1", None) is not None:
                log.info("could not cancel a replaced delegation token: %s", _error(result))
        except UpstreamError as exc:
            log.info("could not cancel a replaced delegation token: %s", exc)


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
