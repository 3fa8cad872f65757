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
from proxy.cache.entry import Entry
from proxy.cache.keys import Naming, TableRef, partition_of_name
from proxy.cache.plan import PartitionPlan
from proxy.memo import BoundedMemo
from proxy.wire.binary import MessageType, TType, encode_header
from proxy.wire.errors import ProtocolError

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
            found = parts.locate(args, path)
            if found is None:
                return None
            start, value, end = found
            other = args[:start] + args[end:]
            variant = self.memo.get((method, other, who))
            # A list, and the only field of its id (a set is skipped by the decoders, and of
            # a field sent twice they keep the last one): else the planned way decides.
            if variant is None or args[start] != TType.LIST or parts.locate(other, path):
                return None
            return variant, _strings(args, value, end)
        except (ProtocolError, struct.error, IndexError):
            return None


def _strings(buf: bytes, at: int, end: int) -> list[bytes]:
    """The list of strings at ``buf[at:end]`` (a list field's value), as bytes."""
    if buf[at] != TType.STRING:
        raise ProtocolError("not a list of strings")
    (count,) = _I32.unpack_from(buf, at + 1)
    pos, out = at + 5, []
    for _ in range(count):
        (size,) = _I32.unpack_from(buf, pos)
        if size < 0 or pos + 4 + size > end:
            raise ProtocolError("a string past its list")
        out.append(buf[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def gather(
    variant: Variant, names: list[bytes], judged: Callable[[str], Entry | None]
) -> list[tuple[bytes, Entry]] | None:
    """Each distinct name with its partition's entry, as ``judged`` gives it by entry key;
    ``None`` at the first that it does not give, and where the planner would not plan the
    request per partition (a name that is not UTF-8 or does not parse, two spellings of
    one partition)."""
    out, seen = [], set()
    for name in dict.fromkeys(names):
        known = partition_of_name(name)
        if known is None:
            return None
        values, field = known
        if values in seen:
            return None  # two spellings of one partition: the planner lets the HMS decide
        seen.add(values)
        entry = judged(variant.entries + field[2:])
        if entry is None:
            return None
        out.append((name, entry))
    return out


def reply_of(method: str, seqid: int, present: list[tuple[bytes, bytes | memoryview]]) -> bytes:
    """The HMS's reply for these partitions: in name order (see :mod:`.partitions`; UTF-8
    keeps the order of the code points it encodes, which is how names compare)."""
    present.sort(key=lambda pair: pair[0])
    body = parts.assemble(method, [data for _, data in present])
    return encode_header(method, MessageType.REPLY, seqid) + body
