"""Compression dictionaries for partition entries: made per table, kept in the store, and
remembered in process (bounded in bytes, since a client decides how many tables there are).

A partition entry compressed against a dictionary names it by id; a proxy that reads the
entry loads the dictionary from the store once. A proxy that fills a table's partitions
makes the table's dictionary from the first partition it stores (see :mod:`.entry`).
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.cache import entry as codec
from proxy.cache.keys import Naming
from proxy.cache.store import CacheUnavailable, Store
from proxy.memo import BoundedMemo, Footprint, footprint_of

DICTIONARY_BYTES = 16 << 20


class Dictionaries:
    def __init__(self, store: Store, naming: Naming, max_bytes: int = DICTIONARY_BYTES) -> None:
        self.store = store
        self.naming = naming
        self._by_id: BoundedMemo[bytes, bytes] = BoundedMemo(10_000, max_bytes)
        # Each table's own dictionary: tag -> (id, bytes), for the entries this proxy fills.
        self._by_table: BoundedMemo[str, tuple[bytes, bytes]] = BoundedMemo(10_000, max_bytes)

    def footprint(self) -> Footprint:
        return footprint_of(self._by_id, self._by_table)

    def get(self, dict_id: bytes | None) -> bytes | None:
        return self._by_id.get(dict_id) if dict_id is not None else None

    async def for_value(self, value: bytes, tag: str) -> bytes | None:
        """The dictionary ``value`` was compressed with (loaded from the store if need be)."""
        dict_id = codec.dictionary_id(value)
        if dict_id is None:
            return None
        if dict_id not in self._by_id:
            await self.load(tag, [dict_id])
        return self._by_id.get(dict_id)

    async def load(self, tag: str, ids: Iterable[bytes | None]) -> None:
        """Load the dictionaries ``ids`` of table ``tag`` not yet known (best effort)."""
        for dict_id in ids:
            if dict_id is None or dict_id in self._by_id:
                continue
            try:
                data = await self.store.get(self.naming.dictionary(tag, dict_id.hex()))
            except CacheUnavailable:
                return
            if data is not None:
                self._remember(dict_id, data)

    def of_table(self, tag: str, sample: bytes | None) -> tuple[bytes, bytes] | None:
        """(id, bytes) of the dictionary this proxy compresses ``tag``'s partitions with,
        made from ``sample`` the first time."""
        known = self._by_table.get(tag)
        if known is None and sample is not None:
            known = codec.new_dictionary(sample)
            self._by_table.put(tag, known, len(known[1]))
            self._remember(*known)
        return known

    def forget_table(self, tag: str) -> None:
        """The table changed: its next partitions get a dictionary of their own."""
        self._by_table.pop(tag)

    def clear(self) -> None:
        self._by_table.clear()

    def _remember(self, dict_id: bytes, data: bytes) -> None:
        self._by_id.put(dict_id, data, len(data))
