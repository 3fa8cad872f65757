"""Cached listings of sealed partitions, under the versions of the partitions they list.

A listing is stored in the table's slot (``{t:..}:l:<digest>``), with the fingerprint of the
partition's versions read **before** its metadata was fetched and its directory listed:
``epoch`` (the table as a whole), ``pgen`` (all partitions at once) and ``p:<values>`` (this
partition). Whatever alters, drops, renames or writes into the partition, through this proxy
or seen in the notification log, bumps one of them, and the listing is never served again.

No stale fill: after listing, the versions are read once more and a listing whose partition
changed meanwhile (or is being written: a write fence) is dropped, not stored. The
fingerprint covers the instant between that check and the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.cache import entry as codec
from proxy.cache.keys import DEFAULT_CATALOG, EPOCH, Naming, TableRef, digest, partition_field
from proxy.cache.store import FENCED, CacheUnavailable, Store

Values = tuple[str, ...]
COMMON = (EPOCH, "pgen")


@dataclass(frozen=True, slots=True)
class Looked:
    """What one look-up found: cached payloads, and the versions to fill the rest under."""

    cached: dict[Values, bytes]
    versions: dict[str, bytes | None] | None  # None: do not fill (store down, write fenced)


class ListingCache:
    def __init__(self, store: Store, naming: Naming, ttl: float, variant: str) -> None:
        self.store = store
        self.naming = naming
        self.ttl = ttl
        self.variant = variant  # the sealed rule's settings: a new rule starts afresh

    def key(self, table: TableRef, values: Values, recursive: bool) -> str:
        # The table's tag is the same in every catalog (see proxy.cache.keys): the catalog
        # tells the listings apart (the default one as it always has, by nothing).
        catalog = () if table.catalog == DEFAULT_CATALOG else ("@" + table.catalog,)
        name = digest(self.variant, *catalog, "r" if recursive else "-", *values)
        return f"{self.naming.prefix}{{{table.tag}}}:l:{name}"

    @staticmethod
    def _fingerprint(versions: dict[str, bytes | None], values: Values) -> bytes:
        return codec.fingerprint(
            [versions.get(EPOCH), versions.get("pgen"), versions.get(partition_field(values))]
        )

    def _fields(self, partitions: Sequence[Values]) -> list[str]:
        return [*COMMON, *dict.fromkeys(partition_field(v) for v in partitions)]

    async def lookup(
        self, table: TableRef, partitions: Sequence[Values], recursive: bool
    ) -> Looked:
        vkey = self.naming.versions(table.tag)
        keys = [self.key(table, v, recursive) for v in partitions]
        try:
            found_versions, found = await self.store.lookup({vkey: self._fields(partitions)}, keys)
        except CacheUnavailable:
            return Looked({}, None)
        versions = found_versions[vkey]
        if FENCED in versions:
            return Looked({}, None)  # a write is under way: list live, store nothing
        cached: dict[Values, bytes] = {}
        if versions.get(EPOCH) is not None:
            for values, key in zip(partitions, keys, strict=True):
                raw = found.get(key)
                if raw is None:
                    continue
                try:
                    item = codec.decode(raw, None)
                except codec.EntryError:
                    continue
                if item.fingerprint == self._fingerprint(versions, values) and item.ttl > 0:
                    cached[values] = bytes(item.payload)
        return Looked(cached, dict(versions))

    async def fill(
        self,
        table: TableRef,
        versions: dict[str, bytes | None],
        listings: dict[Values, bytes],
        recursive: bool,
        max_bytes: int,
    ) -> tuple[int, int]:
        """Store ``listings`` made under ``versions``; (stored, dropped as stale)."""
        if not listings:
            return 0, 0
        vkey = self.naming.versions(table.tag)
        try:
            if versions.get(EPOCH) is None:
                epochs = await self.store.ensure_epochs([vkey])
                versions = {**versions, EPOCH: epochs.get(vkey)}
            now, _ = await self.store.lookup({vkey: self._fields(list(listings))}, [])
        except CacheUnavailable:
            return 0, 0
        current = now[vkey]
        if FENCED in current:
            return 0, len(listings)
        items = []
        stale = 0
        for values, payload in listings.items():
            fp = self._fingerprint(versions, values)
            if fp != self._fingerprint(current, values):
                stale += 1  # invalidated while it was being listed
                continue
            stored = codec.encode(fp, 0, payload, self.ttl, compress=True)
            if len(stored) <= max_bytes:
                items.append((self.key(table, values, recursive), stored, self.ttl))
        if not items:
            return 0, stale
        try:
            await self.store.save(items, [vkey])
        except CacheUnavailable:
            return 0, stale
        return len(items), stale
