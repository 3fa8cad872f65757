"""Cacheable reads: the cache's read-through (:meth:`CacheEngine.read`) given this client's
call, its channel, and the way to the metastore.

Replies the cache serves are the metastore's bytes with the caller's seqid patched in; a
reply fetched from the metastore is streamed to the client while it is kept, and stored
before its last piece goes out when it is small (so the client's next call can already hit).
"""

from __future__ import annotations

from proxy.cache.engine import CacheEngine
from proxy.cache.entry import Payload
from proxy.cache.reads import Fallback, Keep, Served
from proxy.catalog import MethodSpec
from proxy.handler.forward import Forwarder
from proxy.handler.session import SessionState
from proxy.upstream import ClientChannel, result_outcome
from proxy.wire.binary import MessageHeader, parse_header, reseq
from proxy.wire.framing import Message


async def cached_read(
    cache: CacheEngine,
    forwarder: Forwarder,
    session: SessionState,
    message: Message,
    client: ClientChannel,
    spec: MethodSpec,
) -> Served:
    call = _Read(forwarder, session, message, client)
    return await cache.read(spec, call, session.cache_identity, shared=session.pinned is None)


class _Read:
    """One client's read, as the cache's read-through sees it (a :class:`ReadCall`)."""

    __slots__ = ("client", "forwarder", "message", "session")

    def __init__(
        self,
        forwarder: Forwarder,
        session: SessionState,
        message: Message,
        client: ClientChannel,
    ) -> None:
        self.forwarder = forwarder
        self.session = session
        self.message = message
        self.client = client

    async def serve(self, cached: Payload) -> str:
        """A cached reply, with the caller's seqid, without copying its body."""
        head, at, mtype = reseq(cached, self.message.header.seqid)
        await self.client.send_message(head, memoryview(cached)[at:])
        return result_outcome(mtype, bytes(cached[at : at + 3]))

    async def send(self, reply: bytes) -> str:
        await self.client.send(self.client.transport.frame(reply))
        header = _header_of(reply)
        return result_outcome(header.type, reply[header.length : header.length + 3])

    async def forward(self, keep: Keep | None, fallback: Fallback | None) -> str:
        return await self.forwarder.forward(
            self.session, self.message, self.client, retries=1, keep=keep, fallback=fallback
        )

    async def fetch(self, request: bytes | None) -> Message | str:
        return await self.forwarder.call(
            self.session, self.message, self.client, hold=True, retries=1, request=request
        )


def _header_of(reply: Payload) -> MessageHeader:
    """The header of a whole reply message the proxy holds (parsing reads only its bytes)."""
    header = parse_header(reply, 0, len(reply))
    assert header is not None
    return header
