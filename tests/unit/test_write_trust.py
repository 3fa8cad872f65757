"""Reads from Redis are trusted only while Redis takes this proxy's writes; refused fences wait."""

from __future__ import annotations

import asyncio

import pytest

from proxy.cache import write_trust
from proxy.cache.store import CacheUnavailable
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
    trust.taken(12.2)
    assert trust.trusted(12.2)  # nothing was refused: taken late (a busy machine) is fine
    trust.refused(12.4, answered=True)
    assert not trust.trusted(12.4)  # refused: at once
    trust.taken(13.0)
    trust.taken(14.0)
    assert not trust.trusted(14.9)  # writes taken again, but writers' pending bumps first
    trust.taken(15.0)
    assert trust.trusted(15.1)


def test_a_redis_that_answers_is_waited_for_one_that_does_not_is_not() -> None:
    trust = WriteTrust(2.0, 0.05)
    trust.taken(0.0)
    trust.refused(1.0, answered=True)
    assert trust.answering(2.9)
    trust.refused(1.5, answered=False)
    assert not trust.answering(3.1)


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
        trust.refused(clock[0], answered=True)  # the probes meet the same refusal
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
