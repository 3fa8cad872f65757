"""What the cache does with a call, as values (pure).

A cacheable read becomes a :class:`ReadPlan`: the key its reply is stored under, the version
fields it depends on, how long it may live. A write becomes a :class:`WritePlan`: the version
fields to bump (or epochs to replace) once it has reached the metastore. :mod:`.planner` makes
the first and :mod:`.invalidation` the second, from the method catalog and the decoded
arguments; the read-through, the write path and the stores take the plans from here, without
depending on how they were made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Bump lives with the version names, below the stores (whose interface takes it); it is
# re-exported here, where write plans are made of it.
from proxy.cache.keys import Bump as Bump
from proxy.cache.keys import DatabaseRef, TableRef


@dataclass(frozen=True, slots=True)
class VersionRef:
    key: str  # the version hash
    field: str


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """get_partitions_by_names: cached per partition, assembled per request."""

    table: TableRef
    tag: str
    names: tuple[str, ...]  # distinct requested names, in request order
    values: tuple[tuple[str, ...], ...]  # parsed from ``names``
    # What else shapes a partition's bytes: the method, other arguments, identity, and the
    # names' columns (the metastore matches a name whole).
    variant: str
    names_path: tuple[int, ...]  # field ids leading to the names list in the arguments
    columns: str = ""  # the names' columns, as keys.partition_columns writes them
    fields: tuple[str, ...] = ()  # the version field of each partition, as ``values``
    entry_keys: tuple[str, ...] = ()  # where each partition is stored, as ``values``
    # Every version field a look-up reads (the plan's and each partition's), by hash: the
    # same on every hit, so worked out once, here (see :func:`group`).
    wanted: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # ``wanted`` as the store's look-up takes it, made once.
    wanted_fields: dict[str, tuple[str, ...]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wanted_fields", dict(self.wanted))


@dataclass(frozen=True, slots=True)
class ReadPlan:
    method: str
    key: str
    tag: str
    refs: tuple[VersionRef, ...]
    ttl: float
    negative_ttl: float | None  # NoSuchObjectException may be cached for this long
    table: TableRef | None = None
    partitions: PartitionPlan | None = None
    # The version fields ``refs`` read, by hash (see :func:`group`): asked of the store on
    # every look-up, so worked out once per plan.
    grouped: dict[str, list[str]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grouped", group(self.refs))

    def approx_size(self) -> int:
        """Bytes this plan keeps alive, roughly (for the plan memo's budget)."""
        size = 400 + len(self.key) + 150 * len(self.refs)
        for key, fields in self.grouped.items():  # (refs by hash: a few; fields: hundreds)
            size += len(key) * len(fields) + sum(map(len, fields))
        if self.table is not None:
            size += len(self.table.db) + len(self.table.table) + 100
        pp = self.partitions
        if pp is not None:  # per partition: its name, values, field, entry key and refs
            n = len(pp.names)
            size += 2 * sum(map(len, pp.names)) + n * 600
            size += sum(map(len, pp.entry_keys)) + sum(map(len, pp.fields))
        return size


@dataclass(frozen=True, slots=True)
class WritePlan:
    bumps: tuple[Bump, ...] = ()
    databases_dropped: tuple[DatabaseRef, ...] = ()  # every table of these, too
    flush_all: bool = False
    tables: tuple[TableRef, ...] = field(default=())  # for listings (sealed partitions)
    # Version keys whose granted lock fences this write ends (an alter or drop of the table:
    # see proxy.cache.locks).
    ends_locks: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.bumps or self.databases_dropped or self.flush_all)


FLUSH = WritePlan(flush_all=True)


def group(refs: Sequence[VersionRef]) -> dict[str, list[str]]:
    """The version fields ``refs`` read, by hash (one HMGET each), each once, in order."""
    out: dict[str, dict[str, None]] = {}
    for ref in refs:
        out.setdefault(ref.key, {})[ref.field] = None  # an ordered set: linear, not quadratic
    return {key: list(fields) for key, fields in out.items()}
