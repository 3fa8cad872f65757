"""Who asked what, for the audit log (:mod:`proxy.audit`), at each place a call is answered:
the awaited way (:meth:`.CallHandler.handle`), a hit or a forward answered at once, an
``Again``. Only made when ``--audit-log`` is on; each place asks it with what it already
holds (a plan's table, the reply it wrote), so a hit is not decoded to be logged.

Each runs after its call was answered and counted, often in a socket's callback: whatever
goes wrong in one is logged (at most once a minute) and swallowed, never the call's or its
connection's end."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, ParamSpec

from proxy.audit import AuditLog, partitions_in
from proxy.cache.keys import TableRef
from proxy.guard.calls import table_named
from proxy.guard.gate import Gate, address_of
from proxy.handler.again import Again
from proxy.handler.session import SessionState, peer_name
from proxy.wire.framing import Message, Transport

log = logging.getLogger(__name__)
P = ParamSpec("P")
_quiet_until = [0.0]


def _guarded(record: Callable[P, None]) -> Callable[P, None]:
    @functools.wraps(record)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            record(*args, **kwargs)
        except Exception:
            now = time.monotonic()
            if now >= _quiet_until[0]:
                _quiet_until[0] = now + 60
                log.exception("audit log: a call's line was not made")

    return guarded


class CallAudit:
    def __init__(self, log: AuditLog, gate: Gate) -> None:
        self.log = log
        self.gate = gate  # (who a session's user is: its memo of set_ugi names)

    def who(self, session: SessionState | None, transport: Any = None) -> tuple[str | None, str]:
        if session is None:  # (a connection answered before it needed a session)
            name = peer_name(transport) if transport is not None else "?"
            return None, name.rsplit(":", 1)[0]
        return self.gate.user(session), address_of(session)

    @_guarded
    def handled(
        self,
        session: SessionState,
        message: Message,
        outcome: str,
        source: str | None,
        cacheable: bool,
        took: float,
        client: Any,
        sent_before: int,
    ) -> None:
        """A call answered the awaited way; ``client``'s counts of what it was sent."""
        name = message.header.name
        db, table = _named(message)
        head = getattr(client, "head", b"")
        if getattr(client, "transport", None) is Transport.FRAMED:
            head = head[4:]
        size = getattr(client, "sent", 0) - sent_before
        user, address = self.who(session)
        cache = "hit" if source == "cache" else "miss" if cacheable else "none"
        self.log.record(
            user,
            address,
            name,
            db,
            table,
            partitions_in(name, head) if size else None,
            size,
            outcome,
            cache,
            took,
        )

    @_guarded
    def forwarded(
        self, session: SessionState, message: Message, reply: bytes, outcome: str, took: float
    ) -> None:
        """A call only forwarded, answered as its reply arrived (a ``Flight``)."""
        db, table = _named(message)
        name = message.header.name
        self.log.record(
            *self.who(session),
            name,
            db,
            table,
            partitions_in(name, reply),
            len(reply),
            outcome,
            "none",
            took,
        )

    @_guarded
    def answered(
        self,
        session: SessionState | None,
        method: str,
        table: TableRef | None,
        reply: bytes | memoryview,
        outcome: str,
        cache: str,
        took: float,
        transport: Any = None,
        size: int | None = None,
    ) -> None:
        """A call answered at once (a hit, assembled or whole; a forward); ``reply``: its
        bytes, or their start if ``size`` says how many there were."""
        user, address = self.who(session, transport)
        self.log.record(
            user,
            address,
            method,
            table.db if table is not None else None,
            table.table if table is not None else None,
            partitions_in(method, reply),
            len(reply) if size is None else size,
            outcome,
            cache,
            took,
        )

    @_guarded
    def again(
        self, session: SessionState | None, transport: Any, again: Again, started: float
    ) -> None:
        """A call an ``Again`` answered (its reply: the item's, with the caller's seqid)."""
        item = again.item()
        parts = item.answer if item is not None else None
        if parts is None:
            return
        head, rest, outcome = parts
        counted = again.counted
        self.answered(
            session,
            counted.method,
            counted.table,
            head + b"\x00\x00\x00\x00" + rest[:64],  # (enough to count its partitions)
            outcome,
            "hit",
            time.perf_counter() - started,
            transport,
            size=len(head) + 4 + len(rest),
        )


def _named(message: Message) -> tuple[str | None, str | None]:
    """The database and table a call names (``None``: none)."""
    where = table_named(message)
    if not where:
        return None, None
    db, _, table = where.partition(".")
    return db, table or None
