"""Listings under partition versions (with the embedded store), and the storage rules on a
real directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.cache.keys import Naming, TableRef, partition_field
from proxy.cache.plan import Bump
from proxy.cache.store import MemoryStore
from proxy.config import Options
from proxy.listing.cache import ListingCache
from proxy.listing.storage import Storage

NAMING = Naming()
TABLE = TableRef.of("db", "t")
VERSIONS = NAMING.versions(TABLE.tag)
A, B = ("2024-01-01",), ("2024-01-02",)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def cache() -> ListingCache:
    return ListingCache(MemoryStore(1 << 20), NAMING, ttl=60, variant="rule")


def test_a_listing_is_served_until_its_partition_changes() -> None:
    c = cache()

    async def scenario() -> list[object]:
        looked = await c.lookup(TABLE, [A, B], False)
        assert looked.cached == {} and looked.versions is not None
        stored = await c.fill(TABLE, looked.versions, {A: b"a", B: b"b"}, False, 1 << 20)
        hits = (await c.lookup(TABLE, [A, B], False)).cached
        other_mode = (await c.lookup(TABLE, [A], True)).cached  # recursive is another listing
        await c.store.bump([Bump(VERSIONS, partition_field(A), "partitions")])
        after_a = (await c.lookup(TABLE, [A, B], False)).cached
        await c.store.bump([Bump(VERSIONS, "pgen", "partitions")])
        after_all = (await c.lookup(TABLE, [A, B], False)).cached
        return [stored, hits, other_mode, after_a, after_all]

    stored, hits, other_mode, after_a, after_all = run(scenario())
    assert stored == (2, 0)
    assert hits == {A: b"a", B: b"b"}
    assert other_mode == {}
    assert after_a == {B: b"b"}
    assert after_all == {}


def test_a_listing_whose_partition_changed_while_it_was_made_is_dropped() -> None:
    c = cache()

    async def scenario() -> tuple[tuple[int, int], dict[tuple[str, ...], bytes]]:
        looked = await c.lookup(TABLE, [A, B], False)
        assert looked.versions is not None
        await c.store.ensure_epochs([VERSIONS])
        await c.store.bump([Bump(VERSIONS, partition_field(A), "partitions")])  # meanwhile
        stored = await c.fill(TABLE, looked.versions, {A: b"a", B: b"b"}, False, 1 << 20)
        return stored, (await c.lookup(TABLE, [A, B], False)).cached

    stored, cached = run(scenario())
    assert stored == (1, 1)  # B stored, A dropped as stale
    assert cached == {B: b"b"}


def test_a_new_sealed_rule_starts_afresh() -> None:
    store = MemoryStore(1 << 20)
    before = ListingCache(store, NAMING, ttl=60, variant="rule-1")
    after = ListingCache(store, NAMING, ttl=60, variant="rule-2")

    async def scenario() -> dict[tuple[str, ...], bytes]:
        looked = await before.lookup(TABLE, [A], False)
        assert looked.versions is not None
        await before.fill(TABLE, looked.versions, {A: b"a"}, False, 1 << 20)
        return (await after.lookup(TABLE, [A], False)).cached

    assert run(scenario()) == {}


def test_local_listing_follows_hives_hidden_file_rule(tmp_path: Path) -> None:
    for name in ("a", "b", "_SUCCESS", ".a.crc", "sub/c", "_temporary/0/d", ".staging/e"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"12345")
    storage = Storage(Options())
    try:
        flat = storage.list_sync(f"file:{tmp_path}", recursive=False)
        deep = storage.list_sync(tmp_path.as_uri(), recursive=True)
        missing = storage.list_sync(f"file:{tmp_path}/nope", recursive=False)
    finally:
        storage.close()
    assert [f.path for f in flat.files] == [f"file:{tmp_path}/a", f"file:{tmp_path}/b"]
    assert {"_SUCCESS", ".a.crc", "sub", "a"} <= flat.names  # the sealed rule may need them
    assert [f.path.rsplit("/", 2)[-2:] for f in deep.files] == [
        [tmp_path.name, "a"],
        [tmp_path.name, "b"],
        ["sub", "c"],
    ]
    assert all(f.size == 5 and f.mtime_ms > 0 for f in deep.files)
    assert missing.files == () and missing.names == frozenset()
