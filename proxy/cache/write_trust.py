"""Serve from Redis only while Redis takes this proxy's writes.

Redis can refuse writes and still serve reads: ``CLIENT PAUSE WRITE``, ``min-replicas-to-write``
unmet (NOREPLICAS), a failed save (MISCONF), a demoted primary (READONLY), ``maxmemory``
under ``noeviction`` (OOM). Then a writer's fence and bumps do not land, and every other proxy
would go on reading the old versions and serving the old entries. So:

* **Every proxy probes.** Every :data:`PROBE_EVERY` seconds it sets a short-lived key of its
  own on every node (a write, refused like any other), and pings when that fails (are reads
  still served?).
* **Trust lapses.** Versions and entries read from Redis are used only while a probe was
  taken within ``trust_for`` seconds and none was refused (an error reply) since. A proxy
  whose writes Redis stopped taking answers from the metastore within ``trust_for`` of the
  last one it took.
* **A refused write waits for that.** A write's fence (or a lock's) that Redis refuses while
  it answers reads is retried until Redis takes it or ``hold`` (``trust_for``, a deadline and
  a probe interval) has passed: by then every proxy has stopped trusting Redis, since the
  same refusal met their probes. Only then is the write forwarded (its invalidation kept
  pending, as for any store failure). A write made when this proxy's own writes have not
  been taken for longer than ``hold`` goes ahead at once: that moment has passed.
* **Probation after.** When writes are taken again after trust lapsed, it returns
  ``trust_for`` and a deadline later, not at once: long enough for the writers' pending
  invalidations (retried within a second) to land first.

The embedded store cannot refuse; it has none of this.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.cache.store import CacheUnavailable

T = TypeVar("T")

PROBE_EVERY = 0.25
RETRY_EVERY = 0.05  # between attempts at a refused fence


class WriteTrust:
    """Pure: what the probes said, and whether reads may be trusted at ``now`` (monotonic)."""

    def __init__(self, trust_for: float, timeout: float) -> None:
        self.trust_for = trust_for
        # Long enough that every proxy's last taken probe is older than trust_for (a probe
        # in flight when the refusal began may be counted up to a deadline later).
        self.hold = trust_for + timeout + PROBE_EVERY
        self.probation = trust_for + timeout
        self._taken_at = -math.inf  # nothing taken yet: nothing trusted
        self._answered_at = -math.inf
        self._refused = False  # a probe was refused since the last one taken
        self._missed = False  # a probe was not taken since the last one taken
        self._since = -math.inf  # when writes were taken again after a refusal

    @property
    def ever_taken(self) -> bool:
        return self._taken_at > -math.inf

    def taken(self, now: float) -> None:
        lapsed = now - self._taken_at > self.trust_for
        if self._refused or (lapsed and (self.ever_taken or self._missed)):
            # Trust had lapsed, or never was and a probe failed first (a proxy starting
            # while Redis refuses writes): probation.
            self._since = now
        self._refused = self._missed = False
        self._taken_at = self._answered_at = now

    def not_taken(self, now: float, *, refused: bool, answered: bool) -> None:
        """A probe was not taken: ``refused`` by an error reply (trust ends at once; a
        probe that timed out, perhaps only late on a busy machine, lets it lapse with time);
        ``answered``: Redis still answers reads (a ping)."""
        self._missed = True
        if refused:
            self._refused = True
        if answered:
            self._answered_at = now

    def lapsed_long_ago(self, now: float) -> bool:
        """Whether no write of this proxy's was taken for longer than ``hold``: a refusal
        that met every proxy's probes has ended their trust already, nothing to wait for."""
        return now - self._taken_at > self.hold

    def trusted(self, now: float) -> bool:
        return now <= self.horizon(now)

    def horizon(self, now: float) -> float:
        """Until when reads are trusted, as the probes stand at ``now``: ``trust_for`` after
        the last probe taken, unless one was refused since, or trust is on probation (then
        ``-inf``, until a probe taken after the probation moves it)."""
        if self._refused or now - self._since < self.probation:
            return -math.inf
        return self._taken_at + self.trust_for

    def answering(self, now: float) -> bool:
        """Whether Redis answered within ``hold``: peers may still be trusting it (their last
        write taken is no older than this proxy's last answer, a probe interval and a
        deadline aside)."""
        return now - self._answered_at <= self.hold


async def insist(
    trust: WriteTrust, attempt: Callable[[], Awaitable[T]], let_through: Callable[[], None]
) -> T:
    """``attempt`` (a fence), retried while Redis answers but refuses it, for at most
    ``trust.hold`` seconds; then its ``CacheUnavailable`` is raised (every proxy has stopped
    trusting Redis by then). A Redis that does not answer at all is not waited for: nobody
    reads from it. ``let_through`` lets each retry past the breaker."""
    deadline: float | None = None
    while True:
        try:
            return await attempt()
        except CacheUnavailable:
            now = time.monotonic()
            if deadline is None:
                deadline = now + trust.hold
            if now >= deadline or not trust.answering(now) or trust.lapsed_long_ago(now):
                raise
        await asyncio.sleep(RETRY_EVERY)
        let_through()
