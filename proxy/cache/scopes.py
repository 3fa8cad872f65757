"""What a judgement made in process read, so that only a change to it undoes the judgement.

A hit judged in process (a whole reply, see :meth:`.reads.WholeReads.judged_now`; a partition
judged current, see :meth:`.partition_reads.PartitionReads.lookup`) is judged from the
version hashes its plan reads: a table's hash, for most (``{t:db.tbl}``, see :mod:`.keys`);
a database's or the catalog's for listings; several for a read of many tables. Those hashes
are its :class:`Scope`, and the judgement stands while the scope has not moved: its
``mark`` is what the item is stamped with (``Item.judged_under``), and any change the store
could answer differently for one of its hashes (a version bumped, an epoch made, a fence or
a lock marked or lifted, the hash evicted or forgotten, another value learned) gives every
scope that reads the hash a new mark. A write to one table then re-judges that table's hits
only, not every hit in the process (issue 41, item 3; ``bench.mixed_load`` measures it).

Marks are drawn from one counter for every scope: a mark is given once, to one scope, so a
stamp equal to a scope's mark says the item was judged under that scope as it is now, with
no need to ask which scope the item was judged under (the assembled path compares a
request's partitions' stamps with their table's mark, in C). What changes every hash at once
(a flush, the mirror forgotten or resynchronised) moves every scope.

Scopes are held by what was judged under them (items, lookups in progress) and otherwise let
go: the registry keeps them weakly, so there are never more than L1 holds items, and L1
counts their bytes against its budget (:attr:`Scopes.bytes`). A scope made again for the
same hashes gets a new mark, which nothing was stamped with.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable


class Scope:
    """The version hashes a judgement read (``keys``), and the mark a judgement made under
    them as they are now carries (see the module's docstring)."""

    __slots__ = ("__weakref__", "keys", "mark")

    def __init__(self, keys: tuple[str, ...], mark: int) -> None:
        self.keys = keys
        self.mark = mark

    def __repr__(self) -> str:
        return f"Scope({self.keys!r}, mark={self.mark})"


# The scope of an item not judged yet: no stamp is its mark (stamps are marks, or
# UNJUDGED and RETIRED, below every mark).
NOWHERE = Scope((), 0)


# What a scope keeps, by tracemalloc (tests/unit/test_memo.py holds these to what is
# measured): a scope of one hash (~310 bytes: the Scope, its keys, its weak reference and
# the registry's slot), and each hash more of a wider one (~130 bytes: its place in the list
# of scopes reading the hash, one list per hash).
SCOPE_BYTES = 360
WIDER_KEY_BYTES = 160


class _Ref(weakref.ref[Scope]):
    __slots__ = ("keys",)
    keys: tuple[str, ...]


class Scopes:
    """The scopes judgements in process stand on, moved by the store's changes."""

    def __init__(self) -> None:
        self._marks = itertools.count(1)  # (NOWHERE's 0 is given to no other scope)
        self._of: dict[tuple[str, ...], _Ref] = {}
        # Hash -> the scopes of several hashes that read it (most scopes read one: a
        # table's; found by their keys, with nothing more kept for them).
        self._wider: dict[str, list[_Ref]] = {}
        self.bytes = 0  # what the scopes held keep (see SCOPE_BYTES)

    def of(self, keys: Iterable[str]) -> Scope:
        """The scope of a judgement that reads the hashes ``keys``, made if none is held."""
        keys = tuple(keys)
        ref = self._of.get(keys)
        scope = ref() if ref is not None else None
        if scope is None:
            scope = Scope(keys, next(self._marks))
            ref = _Ref(scope, self._gone)
            ref.keys = keys
            self._of[keys] = ref
            self.bytes += _cost(keys)
            if len(keys) > 1:
                for key in keys:
                    self._wider.setdefault(key, []).append(ref)
        return scope

    def held(self, keys: tuple[str, ...]) -> Scope | None:
        """The scope of ``keys`` if something holds it (nothing was judged under one that
        nobody holds)."""
        ref = self._of.get(keys)
        return ref() if ref is not None else None

    def _gone(self, ref: weakref.ref[Scope]) -> None:
        assert isinstance(ref, _Ref)
        keys = ref.keys
        if self._of.get(keys) is ref:
            del self._of[keys]
        self.bytes -= _cost(keys)
        if len(keys) > 1:
            for key in keys:
                wider = self._wider.get(key)
                if wider is not None and ref in wider:
                    wider.remove(ref)
                    if not wider:
                        del self._wider[key]

    def moved(self, key: str) -> None:
        """The hash ``key`` changed (or may have): judgements that read it stand no more."""
        ref = self._of.get((key,))
        scope = ref() if ref is not None else None
        if scope is not None:
            scope.mark = next(self._marks)
        wider = self._wider.get(key)
        if wider:
            for ref in tuple(wider):  # (a scope let go meanwhile changes the list)
                scope = ref()
                if scope is not None:
                    scope.mark = next(self._marks)

    def moved_all(self) -> None:
        """Every hash may have changed: no judgement made in process stands."""
        for ref in list(self._of.values()):
            scope = ref()
            if scope is not None:
                scope.mark = next(self._marks)

    def __len__(self) -> int:
        return len(self._of)


def _cost(keys: tuple[str, ...]) -> int:
    return SCOPE_BYTES + (WIDER_KEY_BYTES * len(keys) if len(keys) > 1 else 0)
