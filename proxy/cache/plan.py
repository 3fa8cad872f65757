"""From a call to what the cache does with it (pure).

A cacheable read becomes a :class:`ReadPlan`: the key its reply is stored under, the version
fields it depends on, how long it may live. A write becomes a :class:`WritePlan`: the version
fields to bump (or epochs to replace) once it has reached the metastore. Both are derived
from the method catalog and the decoded arguments only; nothing here does I/O.

A plan can be ``None``: a read whose targets cannot be pinned down (a database name that is
not a string, say) is not cached, and a write whose targets cannot be pinned down flushes
everything. When in doubt, miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy import catalog
from proxy.cache.keys import (
    CATALOG_TAG,
    EPOCH,
    DatabaseRef,
    Naming,
    PartitionNameError,
    TableRef,
    digest,
    parse_partition_name,
    partition_columns,
    partition_field,
)

# Bump lives with the version names, below the stores (whose interface takes it); it is
# re-exported here, where write plans are made of it.
from proxy.cache.keys import Bump as Bump
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


def _one_string(values: list[Any]) -> str | None:
    strings = {v for v in values if isinstance(v, str)}
    return strings.pop() if len(strings) == 1 and len(values) >= 1 else None


def _all_text(values: list[Any]) -> bool:
    """Whether every value is text (thriftpy2 hands out bytes that are not UTF-8, which the
    metastore would read with replacement characters: no key of ours can name them)."""
    return all(isinstance(v, str) for v in values)


def _database(db: str, args: Any, path: str | None) -> DatabaseRef:
    """The database a write names at ``path``, with the catalog its ``_req`` struct names
    beside it (``catName``, ``catalogName``). Versions leave the catalog out (see
    :mod:`.keys`), but a dropped database's tables are asked of the metastore (see
    ``Invalidations.expand``), which must be asked about that catalog's."""
    ref = DatabaseRef.of(db)
    if path is None or db.startswith("@") or "." not in path:
        return ref
    holders = catalog.resolve(path.rsplit(".", 1)[0], args)
    names = {
        value
        for holder in holders
        for field_name in ("catName", "catalogName")
        if isinstance(value := getattr(holder, field_name, None), str) and value
    }
    return DatabaseRef(names.pop().lower(), ref.db) if len(names) == 1 else ref


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


def _partition_values(refs: Iterable[str], args: Any) -> list[tuple[str, ...]] | None:
    """Every partition the references name, as value tuples; ``None`` if one is unclear."""
    out: list[tuple[str, ...]] = []
    for ref in refs:
        kind, path = ref.split(":", 1)
        found = catalog.resolve(path, args)
        if kind == "values":
            # An empty list names no partition (fire_listener_event on an unpartitioned
            # table): the caller then treats the table's partitions as a whole.
            for v in found:
                if isinstance(v, list) and v:
                    if not _all_text(v):
                        return None
                    out.append(tuple(v))
        elif kind == "objects":
            for obj in found:
                values = getattr(obj, "values", None)
                if not isinstance(values, list) or not _all_text(values):
                    return None
                out.append(tuple(values))
        else:  # name / names
            names = [n for item in found for n in (item if isinstance(item, list) else [item])]
            for name in names:
                if not isinstance(name, str):
                    return None
                try:
                    out.append(parse_partition_name(name)[1])
                except PartitionNameError:
                    return None
    return out


class Planner:
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
            if db is None:
                return None
            database = DatabaseRef.of(db)
            primary = database.tag
            if scope & Scope.DATABASE:
                depend(database.tag, "db")
            if target.table:
                name = _one_string(catalog.resolve(target.table, args))
                if name is None:
                    return None
                table = TableRef.of(db, name)
                primary = table.tag
                parts = _partition_values(target.partitions, args)
                if scope & Scope.TABLE:
                    depend(table.tag, "table")
                if scope & Scope.PARTITION_SET:
                    depend(table.tag, "partset")
                fields: dict[tuple[str, ...], str] = {}
                if scope & Scope.PARTITIONS:
                    if target.partitions and parts is not None:
                        depend(table.tag, "pgen")
                        # Each partition's field, worked out once (a request names 100s);
                        # a ref for each name as asked (the refs, and so the fingerprints of
                        # entries stored by other versions of this proxy, as they were).
                        fields = {values: partition_field(values) for values in parts}
                        key = self.naming.versions(table.tag)
                        refs.extend(VersionRef(key, fields[values]) for values in parts)
                    else:  # the partitions as a whole (or names we cannot read: same thing)
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
                if not all(isinstance(n, str) for n in tables):
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
        if spec.flushes_with(args):
            return FLUSH  # what it changes cannot be named (see the catalog)
        if spec.kind is not Kind.WRITE or spec.scope == Scope.NONE:
            return WritePlan()
        if spec.name == "drop_catalog" or (spec.targets and args is None):
            return FLUSH
        if spec.names_nothing(args):
            return WritePlan()  # an optional list of targets, absent or empty
        scope = spec.scope
        inv = self.invalidation()
        for target in spec.targets:
            dbs = (
                {v for v in catalog.resolve(target.db, args) if isinstance(v, str)}
                if target.db
                else set()
            )
            if target.db and not dbs:
                return FLUSH
            names = (
                {v for v in catalog.resolve(target.table, args) if isinstance(v, str)}
                if target.table
                else set()
            )
            if target.table and not names:
                return FLUSH
            parts = _partition_values(target.partitions, args) if target.partitions else []
            cascade = bool(spec.cascade and _cascades(catalog.resolve(spec.cascade, args)))
            for db in dbs:
                database = _database(db, args, target.db)
                if scope & Scope.DATABASE:
                    inv.database(database)
                if not target.table and scope & Scope.TABLE:
                    inv.all_tables_of(database)  # tables change and we do not know which
                for name in names:
                    inv.table(TableRef.of(db, name), scope, parts, cascade=cascade)
        if spec.renamed_to is not None:
            old_tables = list(inv.tables)
            for new in catalog.resolve(spec.renamed_to, args):
                new_db, new_name = getattr(new, "dbName", None), getattr(new, "tableName", None)
                if not isinstance(new_db, str) or not isinstance(new_name, str):
                    return FLUSH
                table = TableRef.of(new_db, new_name)
                # By versions: alter_table('@spark#db', 't', Table{dbName: 'db', ...}) keeps
                # its name (the new table's catalog is in a field of its own).
                if table.tag not in {t.tag for t in old_tables}:
                    inv.rename(old_tables, table)
        inv.catalog_wide(scope | (Scope.TABLE if spec.renamed_to else Scope.NONE))
        built = inv.build()
        if spec.name.startswith(("alter_table", "drop_table")) and not built.flush_all:
            ends = tuple(dict.fromkeys(self.naming.versions(t.tag) for t in built.tables))
            built = replace(built, ends_locks=ends)
        return built


class Invalidation:
    """Collects the bumps of one write (or one notification event) into a WritePlan."""

    def __init__(self, naming: Naming) -> None:
        self.naming = naming
        self._bumps: dict[tuple[str, str], Bump] = {}
        self._dropped: list[DatabaseRef] = []
        self.tables: list[TableRef] = []
        self._flush = False

    def bump(self, tag: str, name: str, label: str) -> None:
        key = self.naming.versions(tag)
        self._bumps.setdefault((key, name), Bump(key, name, label))

    def flush(self) -> None:
        self._flush = True

    def database(self, database: DatabaseRef) -> None:
        """A database object or its list of tables changed."""
        self.bump(database.tag, "db", "database")

    def all_tables_of(self, database: DatabaseRef) -> None:
        """Every table of the database changed (or is gone), names unknown here."""
        self._dropped.append(database)
        self.bump(database.tag, EPOCH, "database")

    def table(
        self,
        table: TableRef,
        scope: Scope,
        parts: list[tuple[str, ...]] | None,
        *,
        cascade: bool = False,
    ) -> None:
        """``scope`` of ``table`` changed; ``parts``: the partitions named (None: unknown)."""
        if table not in self.tables:
            self.tables.append(table)
        tag = table.tag
        every = catalog.EVERYTHING_OF_A_TABLE
        if scope & every == every:  # created or dropped: nothing of the old table survives
            self.bump(tag, EPOCH, "table")
            return
        if scope & Scope.TABLE:
            self.bump(tag, "table", "table")
        if scope & Scope.PARTITION_SET:
            self.bump(tag, "partset", "partition_set")
        if scope & Scope.PARTITIONS or (scope & Scope.STATISTICS and parts):
            self.bump(tag, "parts", "partitions")
            if parts:
                for values in parts:
                    self.bump(tag, partition_field(values), "partitions")
            else:
                self.bump(tag, "pgen", "partitions")
        if scope & Scope.STATISTICS and not parts:
            self.bump(tag, "stats", "statistics")
        if cascade:
            self.bump(tag, "parts", "partitions")
            self.bump(tag, "pgen", "partitions")

    def rename(self, old: list[TableRef], new: TableRef) -> None:
        """A rename: the old names are gone, the new one is a new table."""
        for table in old:
            self.bump(table.tag, EPOCH, "table")
            self.bump(table.database.tag, "db", "database")
        self.bump(new.tag, EPOCH, "table")
        self.bump(new.database.tag, "db", "database")
        self.tables.append(new)

    def catalog_wide(self, scope: Scope) -> None:
        """The catalog-level versions ``scope`` touches."""
        if scope & Scope.CATALOG:
            self.bump(CATALOG_TAG, "catalog", "catalog")
        if scope & (Scope.DATABASE | Scope.TABLE):
            self.bump(CATALOG_TAG, "tables", "catalog")
        if scope & Scope.FUNCTIONS:
            self.bump(CATALOG_TAG, "functions", "functions")
        if scope & Scope.PRIVILEGES:
            self.bump(CATALOG_TAG, "privileges", "privileges")

    def build(self) -> WritePlan:
        if self._flush:
            return FLUSH
        return WritePlan(
            tuple(self._bumps.values()), tuple(self._dropped), False, tuple(self.tables)
        )


def _cascades(found: list[Any]) -> bool:
    for value in found:
        if value is True:
            return True
        props = getattr(value, "properties", None)
        if isinstance(props, dict) and str(props.get("CASCADE", "")).lower() == "true":
            return True
    return False
