"""``get_partitions_by_names`` answered at once from partitions judged before, unplanned.

Engines ask for sets of one table's partitions that differ from request to request (a
query's pruned list, the next query's): such a request is new each time, and planning it
(its arguments decoded, 100 names parsed, 100 version fields, refs and keys, the look-up
grouped by hash) cost more than everything else its hit does. Here a request is answered
without a plan when every partition it names is in process and was judged current under
its table's scope as it stands (``Item.judged_under``: stamped by
:meth:`.partition_reads.PartitionReads.lookup` with the mark of the table's version hash
read before its versions, so any change to the hash since has moved it, see :mod:`.scopes`):

1. The request's arguments but the names list are looked up among the variants planned
   before (:class:`Variant`: the table, and where its partitions' entries are kept for those
   arguments and that user), so the request's other arguments are never decoded.
2. The names are read from the bytes. Each name asked of the variant before is remembered
   with its partition's item in process (weakly: ``Variant.found``); any other is parsed (a
   memo) to its columns, which must be the variant's (the metastore matches a name whole),
   and its entry key, as the planner does, and its item found by that key.
3. Each item must be held, stamped with the table's mark of today, unexpired, named once
   (:func:`.l1.judged`; an item L1 let go or replaced is retired, its stamp never
   current again, so a remembered one that fails is looked up once more by key). Then the
   reply is the HMS's: the partitions it has, in name order.

When every name is remembered, steps 2 and 3 and the reply's join are one pass in C
(:func:`answer`, the twin of :func:`py_answer`; ``_assemble.c``): in Python they were most
of an assembled hit (git log -p docs/benchmarks.md, issue 16's twelfth step). Names not
remembered yet are found by their keys first, then the pass is made.

Anything else takes the planned way, which decides again: a name of other columns, an
entry not in process or not judged since a change, two spellings of one partition, a name
that does not parse or is not certain (see :mod:`.keys`), text that is not UTF-8,
invalidations pending, the versions in process not trusted. A request is answered this way
once only (told by the hash of its arguments' bytes, whoever asks: with ``--cache-scope
user``, once for all users): the second time the planned way keeps it whole
(:meth:`.partition_reads.PartitionReads._keep_whole`), and from then on it is one entry. A
request that names a partition the metastore does not have is never kept whole: the planned
way forgets it was asked, and it is assembled each time.
"""

from __future__ import annotations

import itertools
import operator
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from proxy.cache import partitions as parts
from proxy.cache.entry import ABSENT, Entry, Payload
from proxy.cache.keys import MEMO_LONGEST, Naming, TableRef, columns_and_tail
from proxy.cache.l1 import Item, current, judged
from proxy.cache.plan import PartitionPlan
from proxy.memo import BoundedMemo
from proxy.wire.errors import ProtocolError
from proxy.wire.fields import names_list, without_strings

_I32 = struct.Struct(">i")

# Variants remembered: a request's other arguments (a database and a table name, and the
# Hive 3/4 fields), at most this long each, for this many variants.
VARIANT_ARGS = 1024
VARIANT_ENTRIES = 8192
VARIANT_BYTES = 4 << 20
# Names remembered with their partitions' items, over all variants (a name's bytes, a
# weak reference and a dictionary slot: at most about this many bytes each, a name being
# at most MEMO_LONGEST); past this, every variant forgets its names.
FOUND_NAMES = 32768
FOUND_NAME_BYTES = 280

# A reference's item, or None: of a reference that is gone, and of _GONE (what a name not
# remembered is taken to have).
_alive: Callable[[weakref.ref[Item]], Item | None] = operator.call


class _Gone:
    pass


_GONE: weakref.ref[Item] = weakref.ref(_Gone())  # type: ignore[arg-type]  # (dead at once)
_entry = operator.attrgetter("entry")


@dataclass(frozen=True, slots=True)
class Variant:
    """What a planned ``get_partitions_by_names`` said about its arguments but the names."""

    table: TableRef
    tag: str
    versions: str  # the table's version hash, which its partitions are judged from
    entries: str  # what every partition entry's key starts with (Naming.partition_entries)
    columns: str  # the planned names' columns (keys.partition_columns): the variant's own
    # Names asked with these arguments -> their partition's item in process, as last found
    # (Variants.items): the next request naming them needs no key made or looked up.
    # Weak: an item L1 let go is not kept alive here.
    found: dict[bytes, weakref.ref[Item]] = field(default_factory=dict, compare=False)


class Variants:
    """The variants planned, by (method, the arguments' bytes without the names list, the
    user, when the cache is per user); bounded in bytes (a client chooses the arguments)."""

    def __init__(self, naming: Naming) -> None:
        self.naming = naming
        self.names_paths: dict[str, tuple[int, ...]] = {}
        self.memo: BoundedMemo[tuple[str, bytes, bytes], Variant] = BoundedMemo(
            VARIANT_ENTRIES, VARIANT_BYTES
        )
        # Names remembered in the variants' ``found`` (an upper bound: a variant the memo
        # let go took its names with it).
        self.found_names = 0

    def learn(self, method: str, args: bytes, who: bytes, pp: PartitionPlan) -> None:
        """A plan made for these arguments (``who``: as the planner took it)."""
        other = parts.without_field(args, pp.names_path)
        if other is None or len(other) > VARIANT_ARGS:
            return
        self.names_paths[method] = pp.names_path
        key = (method, other, who)
        entries = self.naming.partition_entries(pp.tag, pp.variant)
        versions = self.naming.versions(pp.tag)
        variant = Variant(pp.table, pp.tag, versions, entries, pp.columns)
        if self.memo.get(key) == variant:  # (compared but for its names: kept with them)
            return
        size = len(other) + len(who) + len(entries) + len(versions) + 2 * len(pp.tag) + 300
        self.memo.put(key, variant, size)

    def items(
        self,
        variant: Variant,
        names: list[bytes],
        peek: Callable[[str], Item | None],
        *,
        afresh: bool = False,
    ) -> list[Item] | None:
        """Each name's partition item in process: as remembered with the name (alive, but
        perhaps let go or kept anew since: judging it tells), else found by its entry key
        (``peek``) and remembered; every one by its key if ``afresh``. ``None`` where the
        planner would not plan the request per partition with this variant (a name that is
        not UTF-8, does not parse, is not certain, or is of other columns), for no names,
        and as soon as a name's partition is not held (a name new to the names memo is
        parsed only while the partitions before it are held: a request of partitions not in
        process is planned without parsing each name twice)."""
        if not names:
            return None
        found = variant.found
        if afresh:
            items: list[Item | None] = [None] * len(names)
        else:
            items = list(map(_alive, map(found.get, names, itertools.repeat(_GONE))))
            if all(items):  # (not ``None in``: that compares each item with None)
                return items  # type: ignore[return-value]  # (no None left)
        missing = [at for at, item in enumerate(items) if item is None]
        got = self.remember(variant, [names[at] for at in missing], peek)
        if got is None:
            return None
        for at, item in zip(missing, got, strict=True):
            items[at] = item
        return items  # type: ignore[return-value]  # (no None left)

    def remember(
        self, variant: Variant, names: list[bytes], peek: Callable[[str], Item | None]
    ) -> list[Item] | None:
        """Each name's partition item in process, found by its entry key (``peek``) and
        remembered with the name; ``None`` as :meth:`items` says (looked up in order, until
        one is not held)."""
        if self.found_names + len(names) > FOUND_NAMES:
            self.forget_names()
        prefix, columns, found = variant.entries, variant.columns, variant.found
        items = []
        for name in names:
            known = columns_and_tail(name)
            # (A name of other columns names another variant's partition, or none.)
            if known is None or known[0] != columns:
                return None
            item = peek(prefix + known[1])
            if item is None:
                return None
            if len(name) <= MEMO_LONGEST and (name in found or self.found_names < FOUND_NAMES):
                self.found_names += name not in found
                found[name] = weakref.ref(item)
            items.append(item)
        return items

    def forget_names(self) -> None:
        for variant in self.memo.values():
            variant.found.clear()
        self.found_names = 0

    def of(self, method: str, args: bytes, who: bytes) -> tuple[Variant, list[bytes]] | None:
        """The variant of a request and its names, as sent; ``None``: not known."""
        path = self.names_paths.get(method)
        if path is None:
            return None
        # The names field, the only one of its id (of a field sent twice the decoders keep
        # the last one), a list of strings (a set is skipped by the decoders): else the
        # planned way decides.
        if len(path) == 1:  # (get_partitions_by_names: one step, in C where it is built)
            got = names_list(args, path[0])
        else:
            try:
                found = parts.locate(args, path)
                got = None if found is None else without_strings(args, found)
                if got is not None and parts.locate(got[0], path):
                    return None
            except (ProtocolError, struct.error, IndexError):
                return None
        if got is None:
            return None
        other, names = got
        variant = self.memo.get((method, other, who))
        return None if variant is None else (variant, names)


def present(names: list[bytes], items: list[Item]) -> list[tuple[bytes, Payload]]:
    """Each name with its partition's bytes, for the partitions the metastore has."""
    pairs = zip(names, map(_entry, items), strict=True)
    return [(name, entry.payload) for name, entry in pairs if not entry.flags & ABSENT]


# A reply: (the reply, or None where it is refused; whether it holds every partition named).
Answer = tuple[bytes | None, bool]


def py_answer(
    found: dict[bytes, weakref.ref[Item]],
    names: list[bytes],
    mark: int,
    now: float,
    wall: float,
    head: bytes,
    before: bytes,
    closing: bytes,
    largest: int,
) -> Answer | list[int] | None:
    """:func:`answer_items` of the items remembered in ``found`` with ``names``; where
    some names are not remembered there (or their items are gone), the places of those
    names in ``names`` if the items that are remembered are :func:`.l1.current` (``None``
    if not)."""
    items = list(map(_alive, map(found.get, names, itertools.repeat(_GONE))))
    if not all(items):  # (not ``None in``: that compares each item with None)
        held = [item for item in items if item is not None]
        if held and not current(held, mark, now, wall):
            return None
        return [at for at, item in enumerate(items) if item is None]
    held = cast(list[Item], items)  # (no None left)
    return answer_items(names, held, mark, now, wall, head, before, closing, largest)


def answer_items(
    names: list[bytes],
    items: list[Item],
    mark: int,
    now: float,
    wall: float,
    head: bytes,
    before: bytes,
    closing: bytes,
    largest: int,
) -> Answer | None:
    """The reply to a request of ``names`` whose partitions' ``items`` are judged current
    (:func:`.l1.judged`, which marks them used): ``head``, ``before``
    (:func:`.partitions.result_framing`), the count of partitions the metastore has, those
    partitions in name order, ``closing``, as :func:`.partitions.reply` joins them (with
    whether every partition named is there); ``(None, whole)`` where the reply would be
    longer than ``largest``. ``None``: the items are not judged current (or one is named
    twice), nothing decided."""
    if not judged(items, mark, now, wall):
        return None
    pairs = present(names, items)
    whole = len(pairs) == len(items)
    if len(head) + len(before) + 4 + sum(len(p) for _, p in pairs) + len(closing) > largest:
        return None, whole
    return parts.joined(head, before, closing, pairs), whole


answer: Callable[
    [
        dict[bytes, weakref.ref[Item]],
        list[bytes],
        int,
        float,
        float,
        bytes,
        bytes,
        bytes,
        int,
    ],
    Answer | list[int] | None,
] = py_answer
try:  # C twin (see _assemble.c): the same answers, without a Python step per partition
    from proxy.cache._assemble import answer as _c_answer
    from proxy.cache._assemble import configure as _c_configure
except ImportError:  # pragma: no cover - only where the extension could not be built
    pass
else:
    _c_configure(Item, Entry, ABSENT)
    answer = _c_answer
