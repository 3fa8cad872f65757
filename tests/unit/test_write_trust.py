"""Reads from Redis are trusted only while Redis takes this proxy's writes; refused fences wait."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from proxy.cache import write_trust
from proxy.cache.store import CacheUnavailable, Standing
from proxy.cache.write_trust import WriteTrust, insist


def test_nothing_is_trusted_before_a_write_was_taken() -> None:
    trust = WriteTrust(2.0, 0.05)
    assert not trust.trusted(0.0)
    trust.taken(0.0)
    assert trust.trusted(0.0)  # a proxy starting has no one's pending writes to wait for


def test_trust_lapses_when_writes_stop_being_taken_and_returns_after_probation() -> None:
    trust = WriteTrust(2.0, 0.05)
    trust.taken(10.0)
    assert trust.trusted(11.9)
    assert not trust.trusted(12.1)  # no write taken for longer than trust_for: a pause
    trust.taken(14.5)  # taken again after 4.5 s: trust lapsed
    assert not trust.trusted(14.5)  # writers' pending bumps land first (probation)
    trust.taken(16.0)
    assert trust.trusted(16.6)


def test_a_late_probe_within_trust_for_lapses_nothing() -> None:
    trust = WriteTrust(2.0, 0.05)
    trust.taken(10.0)
    trust.not_taken(10.5, refused=False, answered=True)  # timed out: a busy machine, a pause
    assert trust.trusted(11.0)
    trust.taken(11.9)
    assert trust.trusted(11.9)


def test_a_refused_probe_ends_trust_at_once() -> None:
    trust = WriteTrust(2.0, 0.05)
    trust.taken(10.0)
    trust.not_taken(10.2, refused=True, answered=True)  # NOREPLICAS, READONLY, MISCONF, OOM
    assert not trust.trusted(10.2)
    trust.taken(10.4)
    trust.taken(12.0)
    assert not trust.trusted(12.4)  # probation: trust_for and a deadline after 10.4
    assert trust.trusted(12.5)


def test_a_redis_that_answers_is_waited_for_one_that_does_not_is_not() -> None:
    trust = WriteTrust(2.0, 0.05)
    trust.taken(0.0)
    trust.not_taken(1.0, refused=True, answered=True)
    assert trust.answering(2.9)
    trust.not_taken(1.5, refused=False, answered=False)
    assert trust.answering(1.0 + trust.hold)
    assert not trust.answering(1.01 + trust.hold)


def test_a_refused_fence_is_retried_until_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_trust, "RETRY_EVERY", 0.0)
    trust = WriteTrust(2.0, 0.05)
    trust.taken(write_trust.time.monotonic())
    attempts: list[int] = []
    let_through: list[int] = []

    async def fence() -> str:
        attempts.append(1)
        if len(attempts) < 4:
            raise CacheUnavailable("NOREPLICAS Not enough good replicas to write.")
        return "fenced"

    assert asyncio.run(insist(trust, fence, lambda: let_through.append(1))) == "fenced"
    assert len(attempts) == 4 and len(let_through) == 3


def test_a_fence_refused_for_the_whole_hold_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(write_trust.time, "monotonic", lambda: clock[0])

    async def no_sleep(_: float) -> None:
        clock[0] += 0.5

    monkeypatch.setattr(write_trust.asyncio, "sleep", no_sleep)
    trust = WriteTrust(2.0, 0.05)
    trust.taken(100.0)

    async def fence() -> None:
        trust.not_taken(clock[0], refused=True, answered=True)  # the probes meet the same refusal
        raise CacheUnavailable("MISCONF")

    with pytest.raises(CacheUnavailable):
        asyncio.run(insist(trust, fence, lambda: None))
    assert clock[0] >= 100.0 + trust.hold  # every proxy's trust has lapsed by now


def test_a_redis_that_stopped_answering_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(write_trust.time, "monotonic", lambda: clock[0])
    trust = WriteTrust(2.0, 0.05)
    trust.taken(90.0)  # nothing taken or answered for ten seconds: down for everyone

    async def fence() -> None:
        raise CacheUnavailable("connection refused")

    with pytest.raises(CacheUnavailable):
        asyncio.run(insist(trust, fence, lambda: None))
    assert clock[0] == 100.0


def test_a_proxy_starting_while_redis_refuses_waits_for_probation() -> None:
    trust = WriteTrust(2.0, 0.05)
    trust.not_taken(1.0, refused=True, answered=True)
    trust.taken(1.5)
    assert not trust.trusted(1.6)
    trust.taken(3.5)
    assert trust.trusted(3.6)


def test_a_refusal_older_than_the_hold_holds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten minutes into a refusal every proxy has long stopped trusting Redis: a write made
    then goes ahead at once, not after another hold."""
    clock = [700.0]
    monkeypatch.setattr(write_trust.time, "monotonic", lambda: clock[0])
    trust = WriteTrust(2.0, 0.05)
    trust.taken(100.0)
    trust.not_taken(699.9, refused=True, answered=True)

    async def fence() -> None:
        raise CacheUnavailable("NOREPLICAS")

    with pytest.raises(CacheUnavailable):
        asyncio.run(insist(trust, fence, lambda: None))
    assert clock[0] == 700.0


def test_the_horizon_never_trusts_a_moment_trusted_does_not() -> None:
    # The standing's trust horizon (Standing.trust, set after every probe) is what the hit
    # path checks: it must never trust a moment trusted() does not.
    rng = random.Random(7)
    for _ in range(200):
        trust = WriteTrust(2.0, 0.05)
        now = 0.0
        for _ in range(40):
            now += rng.choice((0.05, 0.25, 0.25, 1.0, 3.0))
            if rng.random() < 0.7:
                trust.taken(now)
            else:
                trust.not_taken(now, refused=rng.random() < 0.5, answered=rng.random() < 0.5)
            horizon = trust.horizon(now)
            assert trust.trusted(now) == (now <= horizon)
            for later in (now + 0.1, now + 1.9, now + 2.1):
                if later <= horizon:
                    assert trust.trusted(later)
                elif trust.trusted(later):
                    # only a probation not over at ``now``: the next probe taken moves the
                    # horizon (at most one interval late, never early)
                    assert horizon == -math.inf and not trust.trusted(now)


def test_a_refused_probe_ends_the_standing_at_once_and_the_sooner_horizon_holds() -> None:
    standing = Standing(-math.inf)
    standing.track(10.0)
    standing.trust(5.0)
    assert standing.until == 5.0 and standing.at(5.0) and not standing.at(5.1)
    standing.trust(20.0)
    assert standing.until == 10.0  # the streams' horizon is the sooner now
    trust = WriteTrust(2.0, 0.05)
    trust.taken(8.0)
    standing.trust(trust.horizon(8.0))
    assert standing.until == 10.0
    trust.not_taken(8.25, refused=True, answered=True)  # READONLY, MISCONF, OOM, ...
    standing.trust(trust.horizon(8.25))
    assert not standing.at(8.25)  # no hit in process from now, whatever the scopes
    standing.track(-math.inf)
    standing.trust(30.0)
    assert not standing.at(9.0)  # (the streams down)
