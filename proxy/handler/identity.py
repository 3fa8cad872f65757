"""Calls that change their connection's state: ``set_ugi`` (which binds a user to it for its
whole life) and the ones the proxy cannot reproduce on another connection (``setMetaConf``),
for which the client keeps a connection of its own (see :mod:`proxy.upstream.pool`)."""

from __future__ import annotations

from typing import Any

from proxy import idl
from proxy.handler.forward import Forwarder, answer, upstream_request
from proxy.handler.session import SessionState
from proxy.upstream import (
    ClientChannel,
    Identity,
    UpstreamError,
    UpstreamPool,
    exchange,
    set_ugi_succeeded,
)
from proxy.wire.binary import MessageType, encode_header, with_seqid
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message


def authenticated_identity(user: str, *, end_user: bool, upstream_sasl: bool) -> Identity | None:
    """Who an authenticated engine's calls run as at the metastore: the user (by their
    delegation token on a Kerberized metastore, by set_ugi on a plain one), or the proxy."""
    if not end_user:
        return None
    if upstream_sasl:
        return Identity(user=user)
    args = idl.encode(idl.args_class("set_ugi")(user_name=user, group_names=[]))
    return Identity(args, user=user)


class Identities:
    def __init__(self, pool: UpstreamPool, forwarder: Forwarder) -> None:
        self.pool = pool
        self.forwarder = forwarder

    async def set_ugi(self, session: SessionState, message: Message, client: ClientChannel) -> str:
        """``set_ugi``: answer from a bound connection's reply, or bind a connection now."""
        if session.user is not None:
            return await self._authenticated_set_ugi(message, client)
        identity = Identity(message.body)
        seqid = message.header.seqid
        if session.identity is None and session.pinned is None:
            known = self.pool.ugi_reply(identity)
            if known is not None:
                session.identity = identity
                await client.send(
                    client.transport.frame(with_seqid(known.data, known.header, seqid))
                )
                return "ok"
        timeout = self.pool.timeouts.read
        try:
            async with self.pool.connection(session.identity, pinned=session.pinned) as conn:
                reply = await exchange(conn, upstream_request(message), "set_ugi", seqid, timeout)
                if set_ugi_succeeded(reply):
                    self.pool.bind(conn, identity)
                    self.pool.remember_ugi_reply(identity, reply)
                    session.identity = identity
                else:
                    # The HMS refused (or already had an identity): the state is unknown.
                    self.pool.discard(conn)
        except UpstreamError as exc:
            session.lost_pin()
            return await self.forwarder.upstream_failed(client, message, exc)
        session.lost_pin()
        return await answer(client, reply)

    async def _authenticated_set_ugi(self, message: Message, client: ClientChannel) -> str:
        """An authenticated engine's ``set_ugi`` changes nothing, as on a Kerberized HMS, and
        never reaches the metastore: on a plain one it would bind a pooled connection (that
        other users' calls then take) to whoever the engine named. It is answered as a
        Kerberized HMS 2.3 answers it: success, the groups then the user."""
        try:
            args = idl.decode_args("set_ugi", message.body)
            said = [*(args.group_names or []), args.user_name or ""]
        except ProtocolError:
            said = []
        result = idl.result_class("set_ugi")(success=[str(s) for s in said])
        await self._reply(client, message, result)
        return "ok"

    async def _reply(self, client: ClientChannel, message: Message, result: Any) -> None:
        """A reply of the proxy's own making (the HMS's shape and words)."""
        header = message.header
        if header.type == MessageType.ONEWAY:
            return
        reply = encode_header(header.name, MessageType.REPLY, header.seqid) + idl.encode(result)
        await client.send(client.transport.frame(reply))

    async def pinned_call(
        self, session: SessionState, message: Message, client: ClientChannel
    ) -> str:
        """A call that changes its connection's state: from now on this client keeps it."""
        if session.pinned is None:
            try:
                session.pinned = await self.pool.pin(session.identity)
            except UpstreamError as exc:
                return await self.forwarder.upstream_failed(client, message, exc)
        return await self.forwarder.forward(session, message, client)

    async def delegation_token(
        self, session: SessionState, message: Message, client: ClientChannel
    ) -> str:
        """``get_delegation_token`` from an authenticated engine (Trino with impersonation,
        HiveServer2, Spark submitting to a cluster).

        When calls run as their engine's user (``--upstream-identity end-user``) it goes out
        like any call, as the engine's user, and the HMS decides what it decides for a direct
        caller: one's own token, or another's with ``hadoop.proxyuser`` rights (Trino's
        impersonation). When every call runs as the proxy, which may impersonate anyone, the
        HMS cannot tell who asks: the proxy then allows only a token of the engine's own.
        """
        if session.identity is not None and session.user is not None:
            return await self.forwarder.forward(session, message, client)
        if session.user is None:
            if self.pool.auth is None:  # a plain metastore: it answers for itself
                return await self.forwarder.forward(session, message, client)
            # The call would run as the proxy, which may impersonate anyone, for an engine
            # nobody authenticated.
            text = "delegation tokens need an authenticated engine (--client-auth kerberos)"
            await self._reply(client, message, _token_refusal(text))
            return "user_error"
        try:
            owner = idl.decode_args("get_delegation_token", message.body).token_owner
        except ProtocolError:
            owner = None
        if not isinstance(owner, str) or owner not in (session.user, session.principal):
            text = f"User: {session.user} is not allowed to impersonate {owner}"
            await self._reply(client, message, _token_refusal(text))
            return "user_error"
        return await self.forwarder.forward(session, message, client)

    def end_session(self, session: SessionState) -> None:
        if session.pinned is not None:
            self.pool.discard(session.pinned)
            session.pinned = None


def _token_refusal(text: str) -> Any:
    return idl.result_class("get_delegation_token")(o1=idl.module().MetaException(message=text))
