"""Hits handed to the freshness check (:mod:`proxy.freshness`), one at a time.

The check wants one hit at a time, at most ``--freshness-check-rate`` a second. While it
wants one (:attr:`Sampler.want`), the hits that need no await decline
(``CallHandler.serve_hit_now`` and ``serve_known_now``, the answers kept to answer again:
``proxy.handler.again``), so the next hit takes the ordinary way (``CallHandler.handle``),
and there the first read the cache answers is recorded (``proxy.handler.reads``): its call,
the reply it was sent, and how to tell later whether that reply still stood. Every hit
path is sampled so, in one place, by one record; the hit path pays one attribute read
(``want``), false but for the one call each check takes.

What is recorded says how the reply was judged:

* a **whole reply** (an entry served as it is): nothing more. The check looks the entry up
  again against the versions in the store, and goes on only if it is still the one served
  (a reply a write replaced since, or that a flight shared after a write, is not judged).
* a reply **assembled from partitions** (``get_partitions_by_names``): the versions it was
  assembled under, as the store keeps them in process when it is sent (no await since the
  partitions were judged; a copy that lags the store is older, and the check then sees
  versions that moved and judges nothing). Without versions in process (Redis with
  ``--redis-tracking off``, or its copy not trusted just then) it is not recorded, and the
  next hit is offered instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.cache.entry import Payload
from proxy.cache.plan import ReadPlan
from proxy.cache.store import Versions
from proxy.catalog import MethodSpec
from proxy.upstream import Identity
from proxy.wire.framing import Message


def read_fields(plan: ReadPlan) -> Mapping[str, Sequence[str]]:
    """Every version field a reply of ``plan`` may depend on, by hash: a partition plan's
    include each partition's own field."""
    if plan.partitions is not None:
        return plan.partitions.wanted_fields
    return plan.grouped


@dataclass(frozen=True, slots=True)
class Sample:
    """One hit, as the check needs it."""

    spec: MethodSpec
    request: Message  # the client's call, as it came (sent again to the metastore as it is)
    # The reply message it was sent (the seqid aside, what the check compares): the entry's
    # own bytes, not a copy (they never change; the sample holds them while it is checked).
    reply: Payload
    identity: Identity | None  # who asked: the metastore is asked again as them
    plan: ReadPlan
    # The versions of read_fields(plan) a reply assembled from partitions was judged under;
    # None: a whole entry's reply, judged again when checked (see the module's docstring).
    stamp: Versions | None


class Sampler:
    """Where the hit path and the check meet (see the module's docstring)."""

    __slots__ = ("_next", "want")

    def __init__(self) -> None:
        self.want = False  # read on every hit: the check waits for one
        self._next: asyncio.Future[Sample] | None = None

    async def next(self) -> Sample:
        """The next hit the cache answers the ordinary way (hits that need no await decline
        meanwhile)."""
        future: asyncio.Future[Sample] = asyncio.get_running_loop().create_future()
        self._next = future
        self.want = True
        try:
            return await future
        finally:
            self.want = False
            self._next = None

    def offer(self, sample: Sample) -> None:
        """A hit, recorded as :class:`Sample` says, for the check waiting for one."""
        future = self._next
        if future is None or future.done():
            return
        self.want = False
        future.set_result(sample)
