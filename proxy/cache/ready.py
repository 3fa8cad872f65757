"""A cache hit judged once, kept with its in-process copy to be answered again.

A hit answered at once (see :meth:`.reads.WholeReads.judged_now`) is judged against the
versions kept in process; the judgement stands while the store's version generation does
(:meth:`.store.Store.generation`: it moves with every change a version look-up could see),
until the entry expires, and while the in-process copy is kept. :class:`Ready` is that
judgement, one per in-process copy, updated in place when a new generation confirms it:
a connection that asks the same thing again checks three numbers and answers, with the
reply's parts the first answer prepared (see :class:`proxy.handler.again.Again`).

When its copy leaves the in-process front (evicted, replaced, expired, cleared), the L1
retires it: it answers nothing again and lets go of the reply.
"""

from __future__ import annotations

from proxy.cache.entry import Payload
from proxy.cache.keys import TableRef
from proxy.loop_metrics import Count

# A generation no store has: never judged, or retired.
UNJUDGED = -1
# What a Ready and the answer prepared from it keep in memory (the object, its deadline, a
# copy of the reply's header, a view of the rest and its buffer, the tuple), charged to its
# in-process copy's size: ~580 bytes by tracemalloc (tests/unit/test_memo.py holds the
# charge to what is measured).
READY_BYTES = 700
# Its look-ups' counter until it is first judged (then the result's own).
_NOT_COUNTED = Count()


class Ready:
    """The judgement of one in-process copy's hits (see the module's docstring). Its reply
    is the copy's, for as long as it lives."""

    __slots__ = (
        "answer",
        "deadline",
        "generation",
        "key",
        "lookups",
        "method",
        "reply",
        "seen_hit",
        "table",
    )

    def __init__(
        self,
        key: str,
        reply: Payload,
        method: str,
        deadline: float,
        table: TableRef | None,
    ) -> None:
        self.key = key  # the L1 key of its copy
        self.reply = reply  # the copy's reply message
        self.method = method  # the method's metric label
        self.deadline = deadline  # monotonic: the entry's expiry, or its copy's if sooner
        self.table = table  # counted as looked up on the status page (None: not counted)
        self.seen_hit = True  # counted there as a hit
        self.generation = UNJUDGED  # the store's generation it was last judged a hit under
        self.lookups = _NOT_COUNTED  # hmsproxy_cache_lookups{method, result}, once judged
        # The reply's parts as the handler prepares them once (proxy.handler.again): the
        # header up to its seqid, the rest after it, the outcome label. None once retired.
        self.answer: tuple[bytes, Payload, str] | None = None

    def judged(self, generation: int, lookups: Count, seen_hit: bool) -> None:
        """A hit under ``generation`` (``lookups``: its result's counter): its reply for
        every call of its key while the generation stands."""
        self.generation, self.lookups, self.seen_hit = generation, lookups, seen_hit

    def retire(self) -> None:
        """Its copy left the in-process front: nothing answered from it again, and nothing
        of the reply kept (whoever still holds this Ready holds a few numbers)."""
        self.generation = UNJUDGED
        self.reply = b""
        self.answer = None
