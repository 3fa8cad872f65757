"""Backoff as a value (as redis-py does it): how long to stay away after failures."""

from __future__ import annotations

import random
import time
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
