"""The follower applies every event, whatever ids they share and in whatever order they show up.

A scripted log stands in for the metastore: events are made visible between polls the way
HMS 2.3 makes them under concurrent writes (HIVE-16886: one id for several events; a
transaction's event visible after higher ids). Each poll is driven by hand, no sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from proxy import follower as follower_module
from proxy.cache.events import Event
from proxy.cache.store import MemoryStore
from proxy.config import load
from proxy.follower import NotificationFollower
from proxy.log_cursor import LogCursor
from proxy.metrics import Metrics
from proxy.upstream import UpstreamPool
from tests.unit.helpers import engine

NOW = 1_000_000.0


def event(event_id: int, table: str, *, at: float = NOW) -> Event:
    return Event(event_id, int(at), "ALTER_TABLE", "db", table, f'{{"t": "{table}"}}', "json-0.2")


class ScriptedLog:
    """The notification log as the metastore shows it at one moment."""

    def __init__(self) -> None:
        self.visible: list[Event] = []
        self.head = 0
        self.reads: list[int] = []

    def show(self, *events: Event) -> None:
        self.visible.extend(events)
        self.head = max([self.head, *(e.event_id for e in events)])

    def after(self, last: int, limit: int) -> list[Event]:
        self.reads.append(last)
        found = sorted((e for e in self.visible if e.event_id > last), key=lambda e: e.event_id)
        return found[:limit]


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, window: str = "30") -> None:
        self.clock = [NOW]
        monkeypatch.setattr(follower_module.time, "time", lambda: self.clock[0])
        self.log = ScriptedLog()
        self.applied: list[tuple[int, str | None]] = []
        self.refuse: set[tuple[int, str | None]] = set()
        self.flushes = 0
        store = MemoryStore(1 << 20)
        e = engine(store)
        options = load({"upstream": "thrift://h:1", "notification_window": window}, {})
        self.follower = f = NotificationFollower(
            options, e, UpstreamPool(options, Metrics()), Metrics()
        )

        async def current() -> int:
            return self.log.head

        async def after(last: int) -> list[Event]:
            return self.log.after(last, follower_module.BATCH)

        async def apply(ev: Event) -> bool:
            if (ev.event_id, ev.table) in self.refuse:
                return False
            self.applied.append((ev.event_id, ev.table))
            return True

        async def flush() -> None:
            self.flushes += 1

        monkeypatch.setattr(f, "_current_id", current)
        monkeypatch.setattr(f, "_events_after", after)
        monkeypatch.setattr(f, "_apply", apply)
        monkeypatch.setattr(e, "flush", flush)

    def poll(self, seconds_later: float = 1.0) -> None:
        self.clock[0] += seconds_later
        asyncio.run(self.follower.poll())

    def tables_applied(self) -> list[str | None]:
        return [t for _, t in self.applied]


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    r = Rig(monkeypatch)
    r.log.show(event(1, "seed"))
    r.poll()  # the first poll on a store starts at the head (after a flush)
    assert r.flushes == 1
    r.poll()  # what the log showed before the flush is covered by it: not applied again
    assert r.applied == []
    yield r


def test_events_that_share_an_id_in_one_read_are_all_applied(rig: Rig) -> None:
    """HMS 2.3 under ten concurrent alter_tables: ten events, a few ids."""
    rig.log.show(*(event(2 + i // 4, f"t{i}") for i in range(10)))
    rig.poll()
    assert sorted(rig.tables_applied()) == sorted(f"t{i}" for i in range(10))
    assert rig.follower.state.last_applied == 4
    rig.poll()  # read again in the window, recognised: nothing applied twice
    assert len(rig.applied) == 10


def test_an_event_with_an_id_already_passed_is_applied_when_it_shows_up(rig: Rig) -> None:
    rig.log.show(event(2, "a"), event(3, "b"))
    rig.poll()
    assert rig.follower.state.last_applied == 3
    rig.log.show(event(2, "late"))  # committed later, with an id the follower passed
    rig.poll(5)
    assert rig.tables_applied() == ["a", "b", "late"]
    assert rig.flushes == 1


def test_a_missing_id_is_waited_for_then_applied(rig: Rig) -> None:
    rig.log.show(event(3, "b"))  # 2 is still committing
    rig.poll()
    assert rig.tables_applied() == ["b"]  # applied at once, but the position waits at 1
    assert rig.follower.state.last_applied == 1
    rig.log.show(event(2, "a"))
    rig.poll(10)
    assert rig.tables_applied() == ["b", "a"]
    assert rig.follower.state.last_applied == 3
    assert rig.flushes == 1


def test_an_id_missing_longer_than_the_window_is_a_gap(rig: Rig) -> None:
    rig.log.show(event(3, "b"))
    rig.poll()
    rig.poll(20)
    assert rig.flushes == 1
    rig.poll(11)  # 31 s: the write behind id 2 will not be seen; flush
    assert rig.flushes == 2
    assert rig.follower.metrics.notification_gaps._value.get() == 1
    assert rig.follower.state.last_applied == 3


def test_a_missing_id_before_old_events_is_a_gap_at_once(rig: Rig) -> None:
    """What follows the hole is older than the window: purged by the cleaner, not in flight."""
    rig.log.show(event(5, "b", at=NOW - 3600))
    rig.poll()
    assert rig.flushes == 2


def test_ids_the_sequence_passed_with_nothing_visible_are_a_gap(rig: Rig) -> None:
    rig.log.head = 7  # events 2..7 were logged and purged before this poll
    rig.poll()
    assert rig.flushes == 2
    assert rig.follower.state.last_applied == 7


def test_a_page_cut_inside_a_run_of_equal_ids_misses_none(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follower_module, "BATCH", 4)
    rig.log.show(*(event(2 + i // 3, f"t{i}") for i in range(12)))
    rig.poll()
    assert sorted(rig.tables_applied()) == sorted(f"t{i}" for i in range(12))
    assert rig.follower.state.last_applied == 5


def test_a_refused_invalidation_holds_the_position_and_is_applied_again(rig: Rig) -> None:
    rig.log.show(event(2, "a"), event(2, "b"), event(3, "c"))
    rig.refuse.add((2, "b"))
    with pytest.raises(follower_module.CacheUnavailable):
        rig.poll()
    assert rig.follower.state.last_applied == 1
    rig.refuse.clear()
    rig.poll()
    assert sorted(rig.tables_applied()) == ["a", "b", "c"]
    assert rig.follower.state.last_applied == 3


def test_a_new_leader_reads_back_and_applies_again_what_it_cannot_know(rig: Rig) -> None:
    rig.log.show(event(2, "a"))
    rig.poll()
    rig.follower._cursor = None  # as a proxy taking over finds the position in the store
    rig.log.show(event(2, "late"))
    rig.poll()
    assert rig.tables_applied() == ["a", "seed", "a", "late"]  # seed and a: again


def test_the_window_forgets_what_it_no_longer_reads() -> None:
    cursor = LogCursor(10, NOW, window=30)
    assert cursor.read_from() == 0  # a new cursor reads back up to 1,000 ids
    events = [event(i, f"t{i}") for i in range(11, 21)]
    for e in events:
        cursor.applied(e)
    assert cursor.advance(20, events, NOW + 1, held=None, complete=True) is None
    assert cursor.last == 20
    assert cursor.read_from() == 0  # a new cursor reads back that far for a window
    assert cursor.advance(20, events, NOW + 30.5, held=None, complete=True) is None
    assert cursor.read_from() == 0  # 30 s ago it still stood back
    assert cursor.advance(20, events, NOW + 40, held=None, complete=True) is None
    assert cursor.read_from() == 20  # nothing moved in the last 30 s
    assert not cursor.has_applied(events[0])


def test_an_event_that_shows_up_below_the_head_after_a_flush_is_applied(rig: Rig) -> None:
    rig.log.show(event(1, "committed-after-the-flush"))  # id 1, like the seed, but later
    rig.poll()
    assert rig.tables_applied() == ["committed-after-the-flush"]


def test_a_backlog_is_saved_page_by_page(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure in the middle of a long backlog keeps the pages before it."""
    monkeypatch.setattr(follower_module, "BATCH", 4)
    rig.log.show(*(event(i, f"t{i}") for i in range(2, 22)))
    rig.refuse.add((11, "t11"))
    with pytest.raises(follower_module.CacheUnavailable):
        rig.poll()
    assert rig.follower.state.last_applied == 10
    rig.refuse.clear()
    rig.poll()
    assert rig.follower.state.last_applied == 21
    assert sorted(t for _, t in set(rig.applied)) == sorted(f"t{i}" for i in range(2, 22))


def test_a_backlog_longer_than_a_poll_goes_on_at_the_next(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy import log_cursor

    monkeypatch.setattr(follower_module, "BATCH", 4)
    monkeypatch.setattr(log_cursor, "MAX_IDS", 4)  # (as in production: at most a page back)
    monkeypatch.setattr(follower_module, "PAGES_PER_POLL", 2)
    rig.log.show(*(event(i, f"t{i}") for i in range(2, 22)))
    rig.poll()
    assert rig.follower.state.last_applied is not None
    assert 2 < rig.follower.state.last_applied < 21
    for _ in range(5):
        rig.poll()
    assert rig.follower.state.last_applied == 21
    assert rig.flushes == 1


def test_a_metastore_clock_behind_the_proxys_does_not_make_a_hole_a_gap(rig: Rig) -> None:
    behind = NOW - 15  # the metastore's clock, 15 s behind (a window of 30 s in this rig)
    rig.log.show(event(3, "b", at=behind))
    rig.poll()
    assert rig.flushes == 1  # waited for, not flushed at once
    rig.log.show(event(2, "a", at=behind))
    rig.poll()
    assert rig.tables_applied() == ["b", "a"]
    assert rig.flushes == 1


def test_a_sequence_written_back_below_visible_ids_is_not_a_reset(rig: Rig) -> None:
    """HIVE-16886: a late transaction writes the sequence back under ids already logged."""
    rig.log.show(event(2, "a"), event(3, "b"))
    rig.poll()
    rig.log.show(event(4, "c"))
    rig.log.head = 2
    rig.poll()
    assert rig.flushes == 1
    assert rig.tables_applied() == ["a", "b", "c"]


def test_a_log_reset_is_a_flush(rig: Rig) -> None:
    rig.log.show(event(2, "a"), event(3, "b"))
    rig.poll()
    rig.log.visible = [event(1, "new")]  # a metastore rebuilt: its ids start again
    rig.log.head = 1
    rig.poll()
    assert rig.flushes == 2


def test_a_late_event_refused_stays_in_the_window_until_applied(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.log.show(event(2, "a"), event(3, "b"))
    rig.poll()
    rig.log.show(event(2, "late"))
    rig.refuse.add((2, "late"))
    for _ in range(3):  # refused for longer than the window
        with pytest.raises(follower_module.CacheUnavailable):
            rig.poll(20)
    rig.refuse.clear()
    rig.poll()
    assert ("late" in rig.tables_applied()) and rig.flushes == 1
