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
2. The names are read from the bytes; each is parsed (a memo) to its values, version field
   and entry key, as the planner does.
3. Each entry's in-process copy must be there, stamped with today's generation, unexpired.
   Then the reply is the HMS's: the partitions it has, in name order.

Anything else takes the planned way, which decides again: a name never planned for this
variant, an entry not in process or not judged since a change, two spellings of one
partition, a name that does not parse, text that is not UTF-8, invalidations pending, the
versions in process not trusted. A request is answered this way once only: the second time
the planned way keeps it whole (:meth:`.partition_reads.PartitionReads._keep_whole`), and
from then on it is one entry.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from proxy.cache import partitions as parts
from proxy.cache.entry import ABSENT, Entry, Payload
from proxy.cache.keys import Naming, TableRef, entry_tail, known_tails
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


@dataclass(frozen=True, slots=True)
class Variant:
    """What a planned ``get_partitions_by_names`` said about its arguments but the names."""

    table: TableRef
    tag: str
    entries: str  # what every partition entry's key starts with (Naming.partition_entries)


class Variants:
    """The variants planned, by (method, the arguments' bytes without the names list, the
    user, when the cache is per user); bounded in bytes (a client chooses the arguments)."""

    def __init__(self, naming: Naming) -> None:
        self.naming = naming
        self.names_paths: dict[str, tuple[int, ...]] = {}
        self.memo: BoundedMemo[tuple[str, bytes, bytes], Variant] = BoundedMemo(
            VARIANT_ENTRIES, VARIANT_BYTES
        )

    def learn(self, method: str, args: bytes, who: bytes, pp: PartitionPlan) -> None:
        """A plan made for these arguments (``who``: as the planner took it)."""
        other = parts.without_field(args, pp.names_path)
        if other is None or len(other) > VARIANT_ARGS:
            return
        self.names_paths[method] = pp.names_path
        variant = Variant(pp.table, pp.tag, self.naming.partition_entries(pp.tag, pp.variant))
        size = len(other) + len(who) + len(variant.entries) + 2 * len(variant.tag) + 300
        self.memo.put((method, other, who), variant, size)

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


def gather(
    variant: Variant, names: list[bytes], held: Callable[[str], bool]
) -> tuple[list[bytes], list[str]] | None:
    """The distinct names, and each one's partition entry key; ``None`` where the planner
    would not plan the request per partition (a name that is not UTF-8 or does not parse,
    two spellings of one partition), for no names at all, and as soon as a name not seen
    here before names a partition whose key is not ``held`` in process (a request of new
    partitions is planned without parsing each name twice)."""
    distinct = list(dict.fromkeys(names))
    if not distinct:
        return None
    tails = known_tails(distinct)
    prefix = variant.entries
    if None in tails:
        for at, tail in enumerate(tails):
            if tail is None:
                tail = entry_tail(distinct[at])
                if tail is None or not held(prefix + tail):
                    return None
                tails[at] = tail
    keys = [prefix + tail for tail in tails]  # type: ignore[operator]  # (no None left)
    if len(set(keys)) != len(keys):  # (one key: one partition's values)
        return None  # two spellings of one partition: the planner lets the HMS decide
    return distinct, keys


def present(names: list[bytes], entries: list[Entry]) -> list[tuple[bytes, Payload]]:
    """Each name with its partition's bytes, for the partitions the metastore has."""
    pairs = zip(names, entries, strict=True)
    return [(name, entry.payload) for name, entry in pairs if not entry.flags & ABSENT]
