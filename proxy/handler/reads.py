"""Cacheable reads: the cache's read-through (:meth:`CacheEngine.read`) given this client's
call, its channel, and the way to the metastore.

Replies the cache serves are the metastore's bytes with the caller's seqid patched in; a
reply fetched from the metastore is read whole, then sent and kept; stored before it goes out
when it is small (so the client's next call can already hit).

While the freshness check wants a hit (``proxy.cache.sampling``), the read is watched: the
first one the cache answers is handed to it, with what it was sent.
"""

from __future__ import annotations

from proxy.cache.engine import CacheEngine
from proxy.cache.entry import Payload
from proxy.cache.plan import ReadPlan
from proxy.cache.reads import Fallback, Keep, ReadCall, Served
from proxy.cache.sampling import Sample, read_fields
from proxy.cache.store import Versions
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
    plan: ReadPlan | None,
) -> Served:
    """``plan``: the call's (``None``: not one to cache, or a pinned session's)."""
    call = _Read(forwarder, session, message, client)
    if not cache.freshness.want or plan is None:
        return await cache.read(spec, call, plan)
    watched = _Watched(call, cache, plan)
    served = await cache.read(spec, watched, plan)
    if served.source == "cache" and watched.reply is not None:
        # (The request copied: a sample outlives the session's buffers.)
        request = Message(message.header, bytes(message.data))
        sample = Sample(spec, request, watched.reply, session.identity, plan, watched.stamp)
        cache.freshness.offer(sample)
    return served


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


class _Watched:
    """A read whose answer from the cache the freshness check wants (see
    ``proxy.cache.sampling`` for what is recorded and why). A reply sent after the call went
    to the metastore (a fetch, a forward) is the metastore's, not a hit: not recorded."""

    __slots__ = ("cache", "call", "message", "plan", "reply", "stamp", "upstream")

    def __init__(self, call: ReadCall, cache: CacheEngine, plan: ReadPlan) -> None:
        self.call = call
        self.message = call.message
        self.cache = cache
        self.plan = plan
        self.reply: Payload | None = None
        self.stamp: Versions | None = None
        self.upstream = False

    async def serve(self, cached: Payload) -> str:
        if not self.upstream:  # a whole entry (the check judges it again)
            self.reply, self.stamp = cached, None
        return await self.call.serve(cached)

    async def send(self, reply: bytes) -> str:
        if not self.upstream:
            # Assembled from partitions judged current just now (no await since): the
            # versions they were judged under, if the store keeps them in process.
            stamp = self.cache.store.local(read_fields(self.plan))
            if stamp is not None:
                self.reply, self.stamp = reply, stamp
        return await self.call.send(reply)

    async def forward(self, keep: Keep | None, fallback: Fallback | None) -> str:
        self.upstream = True
        return await self.call.forward(keep, fallback)

    async def fetch(self, request: bytes | None) -> Message | str:
        self.upstream = True
        return await self.call.fetch(request)


def _header_of(reply: Payload) -> MessageHeader:
    """The header of a whole reply message the proxy holds (parsing reads only its bytes)."""
    header = parse_header(reply, 0, len(reply))
    assert header is not None
    return header
