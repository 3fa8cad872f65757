"""Calls that change their connection's state: ``set_ugi`` (which binds a user to it for its
whole life) and the ones the proxy cannot reproduce on another connection (``setMetaConf``),
for which the client keeps a connection of its own (see :mod:`proxy.upstream.pool`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy import idl
from proxy.handler.forward import Forwarder, upstream_request
from proxy.handler.session import SessionState
from proxy.upstream import (
    ClientChannel,
    Identity,
    UpstreamError,
    UpstreamPool,
    exchange,
    result_outcome,
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
            # The engine authenticated: set_ugi cannot change who its calls run as (a
            # Kerberized HMS ignores it too). It goes to the metastore as the user, unbound.
            return await self.forwarder.forward(session, message, client)
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
        await client.send(client.transport.frame(reply.data))
        return result_outcome(reply.header.type, reply.body[:3])

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

        The HMS issues tokens only on Kerberos connections, and an end user's pooled
        connection is a token (DIGEST-MD5) one, so the call goes out on the proxy's own
        Kerberos connection, where the HMS sees the proxy asking on the owner's behalf. The
        proxy may impersonate anyone there, so it first checks what the HMS would check of a
        direct caller: one may ask only for a token of one's own. An engine that itself came
        with a token is refused by the HMS, as it would be directly.
        """
        if session.user is None or session.mechanism != "GSSAPI":
            return await self.forwarder.forward(session, message, client)
        try:
            owner = idl.decode_args("get_delegation_token", message.body).token_owner
        except ProtocolError:
            owner = None
        if owner is None or owner.split("@")[0].split("/")[0] != session.user:
            text = f"User: {session.user} is not allowed to impersonate {owner}"
            result = idl.result_class("get_delegation_token")(o1=_meta_exception(text))
            header = message.header
            reply = encode_header(header.name, MessageType.REPLY, header.seqid) + idl.encode(result)
            await client.send(client.transport.frame(reply))
            return "user_error"
        as_proxy = replace(session, identity=None, pinned=None)
        return await self.forwarder.forward(as_proxy, message, client)

    def end_session(self, session: SessionState) -> None:
        if session.pinned is not None:
            self.pool.discard(session.pinned)
            session.pinned = None


def _meta_exception(text: str) -> Any:
    return idl.module().MetaException(message=text)
