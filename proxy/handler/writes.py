"""Calls that change metadata: forwarded, their reply held until the cache forgets what
they changed, then sent, so that a writer never reads its own write stale. Also the HMS's
lock calls, which fence the tables they name (see :mod:`proxy.cache.locks`), and Iceberg
commits, which get the metastore's own check of their base (see :mod:`proxy.iceberg`)."""

from __future__ import annotations

import logging

from proxy import iceberg, idl
from proxy.cache.engine import CacheEngine
from proxy.cache.plan import FLUSH, WritePlan
from proxy.catalog import Kind, MethodSpec
from proxy.handler.forward import Forwarder
from proxy.handler.session import SessionState
from proxy.upstream import ClientChannel, UpstreamError, UpstreamPool, result_outcome
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# Names of methods this proxy does not know that still cannot change metadata.
READ_PREFIXES = ("get", "list_", "show_", "fetch_", "check_", "is", "partition_name_", "find")


class Writes:
    def __init__(
        self,
        cache: CacheEngine,
        forwarder: Forwarder,
        pool: UpstreamPool,
        *,
        check_iceberg_base: bool,
    ) -> None:
        self.cache = cache
        self.forwarder = forwarder
        self.pool = pool
        self.check_iceberg_base = check_iceberg_base  # --iceberg-expected-location on

    async def write(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        spec: MethodSpec | None,
    ) -> str:
        """Forward a write, invalidate what it changes, then answer the writer."""
        name = message.header.name
        oneway = name in idl.oneway_methods()  # the metastore sends no reply
        if spec is None and name.startswith(READ_PREFIXES):
            return await self.forwarder.forward(session, message, client, oneway=oneway)
        plan = FLUSH if spec is None else self.cache.plan_write(spec, message)
        if plan.empty:
            return await self.forwarder.forward(session, message, client, oneway=oneway)
        if spec is not None:
            plan = await self.cache.expand(plan, lambda db: self._list_tables(session, db))
        else:
            log.warning("unknown method %s may change metadata: the cache is flushed", name)
        request = await self._guarded_commit(session, message) if spec is not None else None
        intent = await self.cache.begin_write(plan)
        try:
            reply = await self.forwarder.call(
                session, message, client, hold=True, oneway=oneway, request=request
            )
        finally:
            # Success or not, the HMS may have changed: invalidate before anyone is answered.
            await self.cache.end_write(plan, intent)
        if isinstance(reply, str):
            return reply
        await client.send(client.transport.frame(reply.data))
        return result_outcome(reply.header.type, reply.body[:3])

    async def locking(
        self,
        session: SessionState,
        message: Message,
        client: ClientChannel,
        spec: MethodSpec | None,
    ) -> str:
        """``lock`` and the calls that keep or end it, forwarded untouched: a ``lock`` first
        fences what it names, the replies of all of them settle fences afterwards. One of them
        can also change what the cache holds (a replicated ``commit_txn``, see the catalog):
        that is invalidated as for any write."""
        fences = self.cache.locks
        name = message.header.name
        ticket = await fences.before_lock(message.body) if name == "lock" else None
        plan = WritePlan()
        if spec is not None and spec.kind is Kind.WRITE:
            plan = self.cache.plan_write(spec, message)
        if plan.empty:
            reply = await self.forwarder.call(session, message, client, hold=True)
        else:
            plan = await self.cache.expand(plan, lambda db: self._list_tables(session, db))
            intent = await self.cache.begin_write(plan)
            try:
                reply = await self.forwarder.call(session, message, client, hold=True)
            finally:
                await self.cache.end_write(plan, intent)
        if isinstance(reply, str):  # no answer: the fence holds until its deadline
            return reply
        fences.after(name, message.body, ticket, reply)  # runs while the reply goes out
        await client.send(client.transport.frame(reply.data))
        return result_outcome(reply.header.type, reply.body[:3])

    async def _guarded_commit(self, session: SessionState, message: Message) -> bytes | None:
        """An Iceberg commit with the metastore's own check of its base added, or ``None``
        to forward the call as it came."""
        h = message.header
        if h.name not in iceberg.GUARDED or not self.check_iceberg_base:
            return None
        try:
            args = idl.decode_args(h.name, message.body)
        except ProtocolError:
            return None
        commit = iceberg.commit_shape(h.name, args)
        if commit is None:
            return None
        # Only an alter that moves metadata_location is a commit; one that keeps it (a
        # rename, a property change) must not be checked against its previous location.
        current = await self._current_location(session, commit.db, commit.table)
        if current is None or current == commit.location:
            return None
        body = iceberg.with_expected_location(args, message.body, commit.previous)
        if body is None:
            return None
        log.debug("%s: the metastore checks the base of this Iceberg commit", h.name)
        return encode_header(h.name, h.type, h.seqid) + body

    async def _current_location(self, session: SessionState, db: str, table: str) -> str | None:
        """The table's metadata_location at the metastore now (``None``: unknown)."""
        if session.pinned is not None:
            return None  # its connection is the client's own: leave its calls alone
        try:
            reply = await self.pool.ask(session.identity, "get_table", dbname=db, tbl_name=table)
        except UpstreamError:
            return None
        if reply.header.type != MessageType.REPLY:
            return None
        return iceberg.current_location(reply.body)

    async def _list_tables(self, session: SessionState, db: str) -> list[str]:
        """Ask the HMS which tables a database has (before a write drops them)."""
        reply = await self.pool.ask(session.identity, "get_all_tables", db_name=db)
        result = idl.decode_result("get_all_tables", reply.body)
        return list(result.success or [])
