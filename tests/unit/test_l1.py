"""The in-process front (proxy.cache.l1): its budget and LRU order with the second chance
that hits marking items used get, and the rule that a stamp stands only while its item is
held."""

from __future__ import annotations

import time

import pytest

from proxy.cache import l1 as l1_module
from proxy.cache.entry import Entry
from proxy.cache.l1 import L1, OVERHEAD_BYTES, RETIRED, Item
from proxy.cache.scopes import NOWHERE

PAYLOAD = b"x" * 1000
SIZE = len("k0") + len(PAYLOAD) + OVERHEAD_BYTES  # what each item below costs


def entry(ttl: float = 60.0) -> Entry:
    return Entry(b"fp", 0, PAYLOAD, time.time() + ttl)


def filled(count: int) -> L1:
    """An L1 with room for ``count`` items, holding k0 .. k{count-1} (k0 the oldest); at
    least four (an item is kept only if it is at most a quarter of the budget)."""
    l1 = L1(count * SIZE)
    for at in range(count):
        l1.put(f"k{at}", entry(), 60)
    assert len(l1) == count and l1.bytes == count * SIZE
    return l1


def held(l1: L1, key: str) -> bool:
    """Whether ``key`` has a copy in ``l1`` (expired or not), its LRU place unchanged."""
    return l1.peek(key) is not None


def items(l1: L1, *keys: str) -> list[Item]:
    found = [l1.peek(key) for key in keys]
    assert all(found)
    return found  # type: ignore[return-value]


def judged(l1: L1, *keys: str, mark: int = 7) -> list[Item]:
    """Items stamped current at ``mark`` (as a partition look-up does)."""
    out = items(l1, *keys)
    for item in out:
        item.stamp(mark, NOWHERE)
    return out


def test_the_least_recently_used_goes_first() -> None:
    l1 = filled(4)
    assert l1.get("k0") is not None  # used: now the most recent
    l1.put("k4", entry(), 60)
    assert not held(l1, "k1") and all(held(l1, k) for k in ("k0", "k2", "k3", "k4"))
    assert l1.bytes == 4 * SIZE


def test_items_marked_used_get_a_second_chance_and_the_rest_go_in_order() -> None:
    l1 = filled(4)
    assert l1_module.judged(judged(l1, "k0", "k1"), 7, time.monotonic(), time.time())
    l1.put("k4", entry(), 60)  # k0 and k1 are moved on, k2 goes
    assert [held(l1, f"k{i}") for i in range(5)] == [True, True, False, True, True]
    # Moved on, k0 and k1 are newer than k3 and k4; their chance used, they go in turn.
    for new, gone in (("k5", "k3"), ("k6", "k4"), ("k7", "k0"), ("k8", "k1")):
        l1.put(new, entry(), 60)
        assert not held(l1, gone) and held(l1, new)
    assert l1.bytes == 4 * SIZE == len(l1) * SIZE


def test_the_newest_item_is_never_the_one_its_own_keeping_pushes_out() -> None:
    l1 = filled(4)
    assert l1_module.judged(judged(l1, "k0", "k1", "k2", "k3"), 7, time.monotonic(), time.time())
    l1.put("k4", entry(), 60)  # every older one marked used: one of them still goes
    assert held(l1, "k4") and len(l1) == 4 and l1.bytes == 4 * SIZE
    assert not held(l1, "k0")  # (each had its chance, in order)


def test_a_stamp_never_stands_on_an_item_let_go() -> None:
    # A look-up finds an item, awaits its versions, and stamps it: if L1 let the item go
    # meanwhile, the stamp must not make it current again (a memo of items may hold it).
    l1 = filled(4)
    (item,) = items(l1, "k0")
    l1.pop("k0")
    item.stamp(7, NOWHERE)
    assert item.judged_under == RETIRED
    assert not l1_module.judged([item], 7, time.monotonic(), time.time())
    (kept,) = items(l1, "k1")
    l1.put("k1", entry(), 60)  # kept anew: the old item is retired, the new one unstamped
    assert kept.judged_under == RETIRED and items(l1, "k1")[0] is not kept


@pytest.mark.parametrize("why", ["another mark", "twice", "expired", "entry expired"])
def test_items_not_all_current_and_distinct_are_not_judged(why: str) -> None:
    l1 = filled(4)
    found = judged(l1, "k0", "k1", "k2")
    now, wall = time.monotonic(), time.time()
    assert l1_module.judged(found, 7, now, wall)
    if why == "another mark":
        assert not l1_module.judged(found, 8, now, wall)
    elif why == "twice":
        assert not l1_module.judged([*found, found[0]], 7, now, wall)
    elif why == "expired":
        assert not l1_module.judged(found, 7, found[1].expires_at, wall)
    else:
        assert not l1_module.judged(found, 7, now, found[2].entry.expires_at)
    assert not l1_module.judged([], 7, now, wall)


def test_an_item_evicted_or_cleared_is_retired() -> None:
    l1 = filled(4)
    (old,) = judged(l1, "k0")
    l1.put("k4", entry(), 60)  # k0 (not marked used) goes
    assert not held(l1, "k0") and old.judged_under == RETIRED
    old.stamp(7, NOWHERE)
    assert not l1_module.judged([old], 7, time.monotonic(), time.time())
    kept = judged(l1, "k1", "k2")
    l1.clear()
    assert l1.bytes == 0 and all(item.judged_under == RETIRED for item in kept)


def test_a_copy_is_held_no_longer_than_its_entry_lives() -> None:
    # L1.put takes the sooner of the time it is given and the entry's own expiry: the one
    # clock a hit in process reads (Item.expires_at, see l1.stands).
    l1 = L1(8 * SIZE)
    before = time.monotonic()
    l1.put("entry sooner", entry(ttl=5), 60)
    l1.put("ttl sooner", entry(ttl=60), 5)
    l1.put("expired", entry(ttl=-1), 60)
    after = time.monotonic()
    sooner, shorter = items(l1, "entry sooner", "ttl sooner")
    assert before + 4 < sooner.expires_at <= after + 5
    assert before + 4 < shorter.expires_at <= after + 5
    assert not held(l1, "expired")
