"""Backoff and a circuit breaker as values (as redis-py does backoff): how long to stay away
after failures, and when failures are enough to stay away at all."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Exponential backoff with full jitter, between ``base`` and ``cap`` seconds."""

    base: float = 0.1
    cap: float = 10.0
    failures: int = 0
    retry_at: float = 0.0
    _random: random.Random = field(default_factory=random.Random, repr=False)

    def failed(self, now: float | None = None) -> float:
        """Record a failure; returns the delay until the next attempt."""
        now = time.monotonic() if now is None else now
        self.failures += 1
        ceiling = min(self.cap, self.base * (2 ** min(self.failures - 1, 30)))
        delay = self._random.uniform(ceiling / 2, ceiling)
        self.retry_at = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.retry_at = 0.0

    def ready(self, now: float | None = None) -> bool:
        """May an attempt be made now?"""
        now = time.monotonic() if now is None else now
        return now >= self.retry_at


@dataclass(frozen=True, slots=True)
class Opened:
    """What a failure did to a :class:`Breaker`: it is open for ``delay`` seconds."""

    delay: float
    first: bool  # it was closed until now (the start of an outage: worth a warning)


@dataclass
class Breaker:
    """When to stop trying a service that fails, and when to try again (pure: it says what
    happened; the caller logs and counts).

    A connection failure or an error opens it at once. Timeouts open it only when at least
    ``timeouts_to_open`` of them outnumber the successes within one second: a busy machine
    that delays a few replies must not send every call elsewhere, which would make it busier
    still. While open, ``ready`` is false for the backoff's delay; then attempts are let
    through, and the first success closes it.
    """

    backoff: Backoff = field(default_factory=Backoff)
    timeouts_to_open: int = 3
    clock: Callable[[], float] = time.monotonic
    # This second's count: (when it began, successes, timeouts).
    _window: tuple[float, int, int] = (float("-inf"), 0, 0)

    def ready(self) -> bool:
        """May an attempt be made now?"""
        return self.backoff.ready(self.clock())

    def try_now(self) -> None:
        """Let the next attempt through at once, open or not (one that matters)."""
        self.backoff.retry_at = 0.0

    def succeeded(self) -> bool:
        """Record a success; true if it closed the breaker."""
        self._count(ok=1)
        was_open = self.backoff.failures > 0
        self.backoff.succeeded()
        return was_open

    def failed(self) -> Opened:
        """Record a failure (a connection refused, an error reply): the breaker opens."""
        first = self.backoff.failures == 0
        return Opened(self.backoff.failed(self.clock()), first)

    def timed_out(self) -> Opened | None:
        """Record a timeout; the breaker opens (``Opened``) only if timeouts now outnumber
        successes within this second, and at least ``timeouts_to_open`` came."""
        oks, timeouts = self._count(timeouts=1)
        if timeouts < self.timeouts_to_open or timeouts <= oks:
            return None
        return self.failed()

    def _count(self, *, ok: int = 0, timeouts: int = 0) -> tuple[int, int]:
        """Add to this second's successes and timeouts; returns the totals."""
        started, oks, slow = self._window
        now = self.clock()
        if now - started >= 1.0:
            started, oks, slow = now, 0, 0
        self._window = (started, oks + ok, slow + timeouts)
        return oks + ok, slow + timeouts
