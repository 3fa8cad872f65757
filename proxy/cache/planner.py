"""From a call to its plan (pure): the :class:`Planner` the cache engine asks.

A cacheable read's plan (:class:`.plan.ReadPlan`) is made here: the key its reply is stored
under, the version fields it depends on, how long it may live (:class:`Ttls`). A write's
(:class:`.plan.WritePlan`) is made by :mod:`.invalidation`, which the planner hands it to. Both
are derived from the method catalog and the decoded arguments only; nothing here does I/O.

A plan can be ``None``: a read whose targets cannot be pinned down (a database name that is
not a string, say, or one spelled so that the proxy cannot be certain which object the
metastore resolves it to: ``'t '``, a partition name ending with a blank, see :mod:`.keys`)
is not cached, and a write whose targets cannot be pinned down flushes everything, or
invalidates more than it names. When in doubt, miss.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from proxy import catalog
from proxy.cache.invalidation import Invalidation, plan_write
from proxy.cache.keys import (
    CATALOG_TAG,
    EPOCH,
    DatabaseRef,
    Naming,
    PartitionNameError,
    TableRef,
    certain_identifier,
    database_part,
    digest,
    parse_partition_name,
    partition_columns,
    partition_field,
)
from proxy.cache.named_partitions import partition_values
from proxy.cache.plan import PartitionPlan, ReadPlan, VersionRef, WritePlan, group
from proxy.catalog import Kind, MethodSpec, Scope


@dataclass(frozen=True, slots=True)
class Ttls:
    """Seconds an entry may live, per scope: the bound on staleness for writers that bypass
    the proxy. An entry depending on several scopes lives as long as the shortest."""

    catalog: float = 60.0
    database: float = 60.0
    table: float = 60.0
    partitions: float = 60.0
    statistics: float = 60.0
    functions: float = 300.0
    negative: float = 15.0

    def for_scope(self, scope: Scope) -> float:
        ttl = []
        if scope & (Scope.CATALOG | Scope.PRIVILEGES):
            ttl.append(self.catalog)
        if scope & Scope.DATABASE:
            ttl.append(self.database)
        if scope & Scope.TABLE:
            ttl.append(self.table)
        if scope & (Scope.PARTITION_SET | Scope.PARTITIONS):
            ttl.append(self.partitions)
        if scope & Scope.STATISTICS:
            ttl.append(self.statistics)
        if scope & Scope.FUNCTIONS:
            ttl.append(self.functions)
        return min(ttl) if ttl else min(self.catalog, self.table)

    @property
    def longest(self) -> float:
        return max(
            self.catalog,
            self.database,
            self.table,
            self.partitions,
            self.statistics,
            self.functions,
            self.negative,
        )


def _one_string(values: list[Any]) -> str | None:
    strings = {v for v in values if isinstance(v, str)}
    return strings.pop() if len(strings) == 1 and len(values) >= 1 else None


def _names_capabilities(args: Any) -> bool:
    """Whether the request names processor capabilities (``processorCapabilities``, Hive 4's
    ``_req`` structs): the metastore then passes what it returns through its metadata
    transformer, which rewrites partitions by the table's type, ``transactional`` and
    ``OBJCAPABILITIES`` parameters (it drops their bucketing for a processor without
    ``HIVEBUCKET2``, say: MetastoreDefaultTransformer.transformPartitions)."""
    spec = getattr(args, "thrift_spec", None) or {}
    for item in (args, *(getattr(args, entry[1], None) for entry in spec.values())):
        capabilities = getattr(item, "processorCapabilities", None)
        if isinstance(capabilities, list) and capabilities:
            return True
    return False


class Planner:
    """Plans the calls of one cache (its naming, TTLs and whether entries are per user):
    reads here, writes by :mod:`.invalidation` (one object for the engine to ask)."""

    def __init__(self, naming: Naming, ttls: Ttls, *, per_user: bool) -> None:
        self.naming = naming
        self.ttls = ttls
        self.per_user = per_user

    def who(self, identity: bytes | None) -> bytes:
        """The user a read's entries are kept for: the caller's, when the cache is per
        user; nobody's otherwise."""
        return (identity or b"anonymous") if self.per_user else b""

    # -- reads -----------------------------------------------------------------------------

    def read(
        self, spec: MethodSpec, args: Any, args_bytes: bytes, identity: bytes | None
    ) -> ReadPlan | None:
        assert spec.kind is Kind.CACHEABLE_READ
        if spec.uncached_with(args):
            return None
        refs: list[VersionRef] = []
        tags: list[str] = []

        def depend(tag: str, name: str) -> None:
            key = self.naming.versions(tag)
            if tag not in tags:
                tags.append(tag)
                refs.append(VersionRef(key, EPOCH))
            refs.append(VersionRef(key, name))

        scope = spec.scope
        who = self.who(identity)
        primary = CATALOG_TAG
        table: TableRef | None = None
        partition_plan: PartitionPlan | None = None
        if spec.wide:
            if scope & Scope.CATALOG:
                depend(CATALOG_TAG, "catalog")
            if scope & (Scope.DATABASE | Scope.TABLE):
                depend(CATALOG_TAG, "tables")
        else:
            target = spec.targets[0]
            db = _one_string(catalog.resolve(target.db, args)) if target.db else None
            if db is None or not certain_identifier(database_part(db)):
                return None
            database = DatabaseRef.of(db)
            primary = database.tag
            if scope & Scope.DATABASE:
                depend(database.tag, "db")
            if target.table:
                name = _one_string(catalog.resolve(target.table, args))
                if name is None or not certain_identifier(name):
                    return None
                table = TableRef.of(db, name)
                primary = table.tag
                parts = partition_values(target.partitions, args, read=True)
                if target.partitions and parts is None:
                    return None  # a name not pinned down to one partition: not cached
                if scope & Scope.TABLE:
                    depend(table.tag, "table")
                if scope & Scope.PARTITION_SET:
                    depend(table.tag, "partset")
                fields: dict[tuple[str, ...], str] = {}
                if scope & Scope.PARTITIONS:
                    if target.partitions and parts is not None:  # (None: returned above)
                        depend(table.tag, "pgen")
                        # Each partition's field, worked out once (a request names 100s);
                        # a ref for each name as asked (the refs, and so the fingerprints of
                        # entries stored by other versions of this proxy, as they were).
                        fields = {values: partition_field(values) for values in parts}
                        key = self.naming.versions(table.tag)
                        refs.extend(VersionRef(key, fields[values]) for values in parts)
                    else:  # the partitions as a whole
                        depend(table.tag, "parts")
                        depend(table.tag, "partset")
                if scope & Scope.STATISTICS and not target.partitions:
                    depend(table.tag, "stats")
                transformed = bool(scope & Scope.PARTITIONS) and _names_capabilities(args)
                if transformed:
                    # Partitions as Hive 4's metadata transformer rewrites them for these
                    # capabilities, from the table's type and parameters: the reply depends on
                    # the table object too, and no partition's bytes stand on their own.
                    depend(table.tag, "table")
                if spec.per_partition and parts and fields and not transformed:
                    partition_plan = self._partition_plan(
                        spec, args, args_bytes, table, who, fields
                    )
            elif target.tables:
                names = catalog.resolve(target.tables, args)
                tables = [n for item in names for n in (item if isinstance(item, list) else [item])]
                if not all(isinstance(n, str) and certain_identifier(n) for n in tables):
                    return None
                if not tables and not scope & Scope.DATABASE:
                    return None
                for name in tables:
                    ref = TableRef.of(db, name)
                    depend(ref.tag, "table")
        if scope & Scope.FUNCTIONS:
            depend(CATALOG_TAG, "functions")
        if scope & Scope.PRIVILEGES:
            depend(CATALOG_TAG, "privileges")
        if partition_plan is not None:
            key = self.naming.versions(partition_plan.tag)
            read = (EPOCH, "pgen", "partset", *partition_plan.fields)
            grouped = group([*refs, *(VersionRef(key, f) for f in read)])
            wanted = tuple((k, tuple(fs)) for k, fs in grouped.items())
            partition_plan = replace(partition_plan, wanted=wanted)
        return ReadPlan(
            method=spec.name,
            key=self.naming.entry(primary, spec.name, args_bytes, who),
            tag=primary,
            refs=tuple(refs),
            ttl=self.ttls.for_scope(scope),
            negative_ttl=self.ttls.negative if spec.negative else None,
            table=table,
            partitions=partition_plan,
        )

    def _partition_plan(
        self,
        spec: MethodSpec,
        args: Any,
        args_bytes: bytes,
        table: TableRef,
        who: bytes,
        fields: dict[tuple[str, ...], str],
    ) -> PartitionPlan | None:
        """``fields``: each requested partition's version field, by its values."""
        from proxy.cache import partitions as parts  # the byte-level half of the plan

        ref = next(r for r in spec.targets[0].partitions if r.startswith("names:"))
        path = ref.split(":", 1)[1]
        found = catalog.resolve(path, args)
        names = found[0] if found and isinstance(found[0], list) else None
        if not names or not all(isinstance(n, str) for n in names):
            return None
        distinct = list(dict.fromkeys(names))
        try:
            parsed = [parse_partition_name(n) for n in distinct]
        except PartitionNameError:
            return None
        values = tuple(v for _, v in parsed)
        if len(set(values)) != len(values):
            return None  # two spellings of one partition: let the HMS sort that out
        # The metastore matches a name whole, its columns too: ``zz=d01`` names none of a
        # table partitioned by ``ds``. A partition's entries are kept by its values, so
        # each set of columns has entries of its own (its variant): one never answers, nor
        # fills, another's. Names of several sets: the HMS sorts that out.
        if len({c for c, _ in parsed}) != 1:
            return None
        columns = partition_columns(parsed[0][0])
        names_path = parts.field_path(spec.name, path)
        other = parts.without_field(args_bytes, names_path)
        if other is None:
            return None
        tag = table.tag
        variant = digest(spec.name, other, who, columns)
        ordered = tuple(fields[v] for v in values)
        entry = self.naming.partition_entries(tag, variant)
        return PartitionPlan(
            table=table,
            tag=tag,
            names=tuple(distinct),
            values=values,
            variant=variant,
            names_path=names_path,
            columns=columns,
            fields=ordered,
            entry_keys=tuple(entry + f[2:] for f in ordered),
        )

    # -- writes ----------------------------------------------------------------------------

    def invalidation(self) -> Invalidation:
        return Invalidation(self.naming)

    def write(self, spec: MethodSpec, args: Any | None) -> WritePlan:
        """What a write that reached the metastore invalidates (success or not)."""
        return plan_write(self.naming, spec, args)
