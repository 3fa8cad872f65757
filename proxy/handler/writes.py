"""Calls that change metadata: forwarded, their reply held until the cache forgets what
they changed, then sent, so that a writer never reads its own write stale. Also the HMS's
lock calls, which fence the tables they name (see :mod:`proxy.cache.locks`), and Iceberg
commits, which get the metastore's own check of their base (see :mod:`proxy.iceberg`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from proxy import iceberg, idl
from proxy.cache.engine import CacheEngine
from proxy.cache.plan import FLUSH, WritePlan
from proxy.catalog import Kind, MethodSpec
from proxy.handler.forward import Forwarder, answer
from proxy.handler.session import SessionState
from proxy.upstream import ClientChannel, UpstreamError, UpstreamPool
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# Names of methods this proxy does not know that still cannot change metadata.
READ_PREFIXES = ("get", "list_", "show_", "fetch_", "check_", "is", "partition_name_", "find")


class FlushWarnings:
    """The warning that an unknown method flushed the cache, at most once per ``interval``
    seconds: a client can send any name, as often as it likes. In between it keeps a count and
    the first ``keep`` distinct names (cut to ``NAME_CHARS``), which the next line reports;
    nothing else, whatever clients send."""

    NAME_CHARS = 80

    def __init__(
        self, interval: float = 60.0, keep: int = 3, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.keep = keep
        self.clock = clock
        self._last: float | None = None  # when the last line was logged
        self._since = 0  # unknown calls that flushed since then
        self._names: list[str] = []

    def line(self, name: str) -> str | None:
        """The line to log for an unknown call that flushes, or ``None`` (counted instead)."""
        shown = _shown(name, self.NAME_CHARS)
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            self._since += 1
            if len(self._names) < self.keep and shown not in self._names:
                self._names.append(shown)
            return None
        text = f"unknown method {shown} may change metadata: the cache is flushed"
        if self._since:
            calls = "call" if self._since == 1 else "calls"
            text += (
                f" ({self._since} more unknown {calls} flushed it since the last warning: "
                f"{', '.join(self._names)}{', ...' if self._since > len(self._names) else ''})"
            )
        self._last, self._since, self._names = now, 0, []
        return text


def _shown(name: str, limit: int) -> str:
    """A client's method name as a log shows it: printable, and not too long."""
    cut = name[:limit] + ("..." if len(name) > limit else "")
    return cut if cut.isprintable() else ascii(cut)


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
        self.flush_warnings = FlushWarnings()

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
            return await self.forwarder.forward(session, message, client, oneway=oneway, write=True)
        if spec is not None:
            plan = await self.cache.expand(plan, lambda db: self._list_tables(session, db))
        else:
            line = self.flush_warnings.line(name)
            if line is not None:
                log.warning("%s", line)
        request = await self._guarded_commit(session, message) if spec is not None else None
        reply = await self._invalidating(
            plan,
            lambda: self.forwarder.call(
                session, message, client, hold=True, oneway=oneway, write=True, request=request
            ),
        )
        if isinstance(reply, str):
            return reply
        return await answer(client, reply)

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
        # Counted as writes by the pool: an unlock or commit ends fences that send reads to
        # the metastore, so it must not wait behind those reads.
        if plan.empty:
            reply = await self.forwarder.call(session, message, client, hold=True, write=True)
        else:
            plan = await self.cache.expand(plan, lambda db: self._list_tables(session, db))
            reply = await self._invalidating(
                plan,
                lambda: self.forwarder.call(session, message, client, hold=True, write=True),
            )
        if isinstance(reply, str):  # no answer: the fence holds until its deadline
            return reply
        fences.after(name, message.body, ticket, reply)  # runs while the reply goes out
        return await answer(client, reply)

    async def _invalidating(
        self, plan: WritePlan, call: Callable[[], Awaitable[str | Message]]
    ) -> str | Message:
        """Make ``call`` (the write, at the metastore) with ``plan``'s scopes fenced."""
        intent = await self.cache.begin_write(plan)
        try:
            return await call()
        finally:
            # Success or not, the HMS may have changed: invalidate before anyone is answered.
            await self.cache.end_write(plan, intent)

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
            # The _req form: every metastore since 2.3 has it, HMS 4.0.1 no longer get_table.
            request = idl.module().GetTableRequest(dbName=db, tblName=table)
            reply = await self.pool.ask_for_write(session.identity, "get_table_req", req=request)
        except UpstreamError:
            return None
        if reply.header.type != MessageType.REPLY:
            return None
        return iceberg.current_location(reply.body)

    async def _list_tables(self, session: SessionState, db: str) -> list[str]:
        """Ask the HMS which tables a database has (before a write drops them)."""
        reply = await self.pool.ask_for_write(session.identity, "get_all_tables", db_name=db)
        result = idl.decode_result("get_all_tables", reply.body)
        return list(result.success or [])
