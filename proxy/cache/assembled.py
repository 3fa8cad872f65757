"""``get_partitions_by_names`` answered at once from partitions judged before, unplanned.

Engines ask for sets of one table's partitions that differ from request to request (a
query's pruned list, the next query's): such a request is new each time, and planning it
(its arguments decoded, 100 names parsed, 100 version fields, refs and keys, the look-up
grouped by hash) cost more than everything else its hit does. Here a request is answered
without a plan when every partition it names is in process and was judged current under
the store's version generation that still stands (``Item.current_under``: stamped by
:meth:`.partition_reads.PartitionReads.lookup` with the generation read before its versions,
so any change since has moved it):

1. The request's arguments but the names list are looked up among the variants planned
   before (:class:`Variant`: the table, and where its partitions' entries are kept for those
   arguments and that user), so the request's other arguments are never decoded.
2. The names are read from the bytes. Each name asked of the variant before is remembered
   with its partition's item in process (weakly: ``Variant.found``); any other is parsed (a
   memo) to its columns, which must be the variant's (the metastore matches a name whole),
   and its entry key, as the planner does, and its item found by that key.
3. Each item must be held, stamped with today's generation, unexpired, and named once
   (:meth:`.l1.L1.judged_items`; an item L1 let go or replaced is retired, its stamp never
   current again, so a remembered one that fails is looked up once more by key). Then the
   reply is the HMS's: the partitions it has, in name order.

Anything else takes the planned way, which decides again: a name of other columns, an
entry not in process or not judged since a change, two spellings of one partition, a name
that does not parse, text that is not UTF-8, invalidations pending, the versions in
process not trusted. A request is answered this way once only: the second time
the planned way keeps it whole (:meth:`.partition_reads.PartitionReads._keep_whole`), and
from then on it is one entry.
"""

from __future__ import annotations

import itertools
import operator
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.cache import partitions as parts
from proxy.cache.entry import ABSENT, Payload
from proxy.cache.keys import MEMO_LONGEST, Naming, TableRef, columns_and_tail
from proxy.cache.l1 import Item
from proxy.cache.plan import PartitionPlan
from proxy.memo import BoundedMemo
from proxy.wire.binary import TType
from proxy.wire.errors import ProtocolError
from proxy.wire.fields import only_field, read_strings

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
        variant = Variant(pp.table, pp.tag, entries, pp.columns)
        if self.memo.get(key) == variant:  # (compared but for its names: kept with them)
            return
        size = len(other) + len(who) + len(variant.entries) + 2 * len(variant.tag) + 300
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
        not UTF-8, does not parse, or is of other columns), for no names, and as soon as a
        name's partition is not held (a name new
        to the names memo is parsed only while the partitions before it are held: a
        request of partitions not in process is planned without parsing each name twice)."""
        if not names:
            return None
        found = variant.found
        if afresh:
            items: list[Item | None] = [None] * len(names)
        else:
            items = list(map(_alive, map(found.get, names, itertools.repeat(_GONE))))
            if all(items):  # (not ``None in``: that compares each item with None)
                return items  # type: ignore[return-value]  # (no None left)
        if self.found_names + items.count(None) > FOUND_NAMES:
            self.forget_names()
        prefix, columns = variant.entries, variant.columns
        for at, item in enumerate(items):
            if item is None:
                name = names[at]
                known = columns_and_tail(name)
                # (A name of other columns names another variant's partition, or none.)
                if known is None or known[0] != columns:
                    return None
                item = items[at] = peek(prefix + known[1])
                if item is None:
                    return None
                if len(name) <= MEMO_LONGEST and (name in found or self.found_names < FOUND_NAMES):
                    self.found_names += name not in found
                    found[name] = weakref.ref(item)
        return items  # type: ignore[return-value]  # (no None left)

    def forget_names(self) -> None:
        for variant in self.memo.values():
            variant.found.clear()
        self.found_names = 0

    def of(self, method: str, args: bytes, who: bytes) -> tuple[Variant, list[bytes]] | None:
        """The variant of a request and its names, as sent; ``None``: not known."""
        path = self.names_paths.get(method)
        if path is None:
            return None
        try:
            # The names field, the only one of its id (of a field sent twice the decoders
            # keep the last one): else the planned way decides.
            nested = len(path) > 1
            found = parts.locate(args, path) if nested else only_field(args, path[0])
            if found is None:
                return None
            start, value, end = found
            # A list of strings (a set is skipped by the decoders).
            if args[start] != TType.LIST or args[value] != TType.STRING:
                return None
            other = args[:start] + args[end:]
            if nested and parts.locate(other, path):
                return None
            variant = self.memo.get((method, other, who))
            if variant is None:
                return None
            (count,) = _I32.unpack_from(args, value + 1)
            return variant, read_strings(args, value + 5, count, end)
        except (ProtocolError, struct.error, IndexError):
            return None


def present(names: list[bytes], items: list[Item]) -> list[tuple[bytes, Payload]]:
    """Each name with its partition's bytes, for the partitions the metastore has."""
    pairs = zip(names, map(_entry, items), strict=True)
    return [(name, entry.payload) for name, entry in pairs if not entry.flags & ABSENT]
