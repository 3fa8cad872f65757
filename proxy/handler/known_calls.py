"""Calls known by their bytes but for the seqid: the one table of requests kept.

Engines send the same calls again and again: on one connection (Spark's ``get_table`` while
it plans a query, a pooled connection's look-ups), or on a new connection each time (Trino).
A cacheable read planned once is kept here (and, when the cache is per user, by whose entries
it reads) as a :class:`KnownCall`, by what it is known by (:func:`call_key`): its bytes but
the seqid when it is one small strict call (``framing.call_without_seqid``, at most 16 KiB),
else a digest of its method and arguments (a client decides how big those are). It keeps:

* its plan (or that it has none: not one to cache), so that asked again it is neither
  decoded nor planned; known by its bytes, it is not even scanned
  (``CallHandler.serve_known_now``: one dict look-up, then the hit);
* once it was answered at once, the :class:`.again.Again` that answers it again from the
  item it was answered from, on its connection or any other, compared in place.

A plan depends only on the request and the planner (fixed at start): it is never wrong. An
Again answers only while its hit :func:`proxy.cache.l1.stands`. So nothing here needs
ending: entries only go to keep the table within :data:`KNOWN_CALLS` calls and
:data:`KNOWN_CALL_BYTES` bytes, the oldest first, unless asked since they were kept or last
passed over (a second chance, at the back: calls asked once do not push out those asked all
the time). An entry's Again counts its answers as it goes (:meth:`.again.Again.settle`).

A connection with its own metastore connection (pinned) reads none: its calls are never
answered at once, nor cached. Before this table, the plans (by digest) and the answers were
memos of their own (``git log -S KEPT_ANSWERS -S PLAN_ENTRIES``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from proxy.cache.plan import ReadPlan
from proxy.handler.again import Again
from proxy.handler.session import SessionState
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, Transport, call_without_seqid

# Calls kept, and their bytes as counted (see KnownCall.cost): an engine's working set of
# distinct calls (every table's get_table, every batch of partition names) and the plans of
# many partitions each.
KNOWN_CALLS = 24_096
KNOWN_CALL_BYTES = 44 << 20
# One call's share at most (a plan of tens of thousands of partition names is megabytes):
# kept, it would push every other call out (its plan is made for it again each time).
KNOWN_CALL_LARGEST = KNOWN_CALL_BYTES // 16
# What a call too big to be known by its bytes is known by starts with this (a call's own
# bytes start with 0x80, the strict protocol's version).
DIGESTED = b"\x00"
# What a call kept costs beyond its request's bytes, its user's and its plan's: the
# KnownCall, the key tuple, the dict's slot (~250 bytes measured, tests/unit/test_memo.py).
KNOWN_OVERHEAD = 320
# What an Again costs beyond the bytes of its request (kept twice: the parts it compares),
# its object and its list of times (~1,050 bytes measured, tests/unit/test_memo.py).
AGAIN_OVERHEAD = 1536


@dataclass(slots=True, eq=False)
class KnownCall:
    """One call kept (see the module's docstring)."""

    key: tuple[bytes | None, bytes]  # (whose, when per user; what it is known by: call_key)
    plan: ReadPlan | None  # (None: not one to cache)
    cost: int  # bytes, as the table counts them: its own and its Again's
    again: Again | None = None  # what answers it again, once it was answered at once
    asked: bool = False  # by its plan, since kept or last passed over (the Again has its own)


class KnownCalls:
    """The calls kept (see the module's docstring)."""

    def __init__(self, per_user: bool) -> None:
        self.per_user = per_user
        self._kept: dict[tuple[bytes | None, bytes], KnownCall] = {}
        self.bytes = 0

    def _key(self, session: SessionState, repeat: bytes) -> tuple[bytes | None, bytes]:
        return (session.cache_identity if self.per_user else None, repeat)

    def get(self, session: SessionState, repeat: bytes) -> KnownCall | None:
        """The call kept for ``repeat`` (the call's bytes but for its seqid) as ``session``
        would read it; ``None``: none kept, or not for this session."""
        if session.pinned is not None:
            return None
        return self._kept.get(self._key(session, repeat))

    def first(self, repeat: bytes) -> KnownCall | None:
        """:meth:`get` for a connection that has said nothing before (no identity, no
        connection of its own to the metastore)."""
        return self._kept.get((None, repeat))

    def plan(
        self,
        session: SessionState,
        message: Message,
        make: Callable[[], ReadPlan | None],
        repeat: bytes | None = None,
    ) -> ReadPlan | None:
        """The plan of the call ``message`` holds, as kept for ``session``, or made now by
        ``make`` and kept (``repeat``: its bytes but for the seqid, if already known). A
        pinned session's calls are not cached: none is kept for them. Nor is a call whose
        arguments do not decode (``make`` raises ProtocolError: garbage is rarely asked
        again, and would push out what is), nor one past :data:`KNOWN_CALL_LARGEST`."""
        if session.pinned is not None:
            return None
        key = self._key(session, repeat if repeat is not None else call_key(message))
        call = self._kept.get(key)
        if call is not None:
            call.asked = True
            return call.plan
        try:
            plan = make()
        except ProtocolError:
            return None
        size = plan.approx_size() if plan is not None else 0
        cost = len(key[1]) + len(key[0] or b"") + size + KNOWN_OVERHEAD
        if cost > KNOWN_CALL_LARGEST:
            return plan
        self._make_room(cost, entries=1)
        self._kept[key] = KnownCall(key, plan, cost)
        self.bytes += cost
        return plan

    def answer_with(self, call: KnownCall, again: Again) -> None:
        """Answer ``call`` again with ``again`` from now on (the Again before, if any, counts
        its answers first); ``call`` goes to the back, as the newest kept. If it is no longer
        kept, ``again`` is not either: its connection counts its answers."""
        kept = self._kept
        if kept.get(call.key) is not call:
            return
        del kept[call.key]  # (never let go to make room for itself)
        self.bytes -= call.cost
        before = call.again
        if before is not None:
            self._let_go(before)
            call.cost -= _again_cost(before)
        call.again = again
        call.cost += _again_cost(again)
        again.kept = True
        self._make_room(call.cost, entries=1)
        kept[call.key] = call
        self.bytes += call.cost

    def _make_room(self, cost: int, entries: int) -> None:
        """Let calls go until ``entries`` more calls and ``cost`` more bytes fit."""
        kept = self._kept
        while kept and (len(kept) + entries > KNOWN_CALLS or self.bytes + cost > KNOWN_CALL_BYTES):
            self._let_one_go()

    def _let_one_go(self) -> None:
        """The oldest kept not asked since it was kept or last passed over goes; those
        passed over go to the back (if every one was asked, the oldest goes)."""
        kept = self._kept
        for _ in range(len(kept)):
            key = next(iter(kept))
            call = kept[key]
            again = call.again
            if not call.asked and (again is None or not again.asked):
                break
            call.asked = False
            if again is not None:
                again.asked = False
            del kept[key]
            kept[key] = call
        call = kept.pop(next(iter(kept)))
        self.bytes -= call.cost
        if call.again is not None:
            self._let_go(call.again)
            call.again = None  # (a reference kept elsewhere answers nothing new here)

    @staticmethod
    def _let_go(again: Again) -> None:
        again.kept = False
        again.settle()

    def settle(self) -> None:
        """Count every answer not counted yet (see :meth:`.again.Again.settle`)."""
        for call in self._kept.values():
            if call.again is not None:
                call.again.settle()

    def footprint(self) -> tuple[int, int]:
        """(calls kept, their bytes) for /metrics (hmsproxy_memo_bytes)."""
        return len(self._kept), self.bytes


def _again_cost(again: Again) -> int:
    return 2 * again.length + AGAIN_OVERHEAD


def call_key(message: Message) -> bytes:
    """What a call is known by (see the module's docstring): its bytes but for the seqid,
    or, past the size those are kept at, a digest of its method and arguments."""
    found = call_without_seqid(message.data, Transport.BUFFERED)
    if found is not None:
        return found[0]
    digest = hashlib.blake2b(message.header.name.encode(), digest_size=16)
    digest.update(b"\x00")
    digest.update(memoryview(message.data)[message.header.length :])  # (not copied)
    return DIGESTED + digest.digest()
