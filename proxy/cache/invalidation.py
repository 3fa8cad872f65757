"""From a write to what it invalidates (pure).

A write that reached the metastore (whatever its answer) becomes a :class:`.plan.WritePlan`:
the version fields to bump, or epochs to replace, for everything it may have changed.
:func:`plan_write` reads that from the method catalog and the decoded arguments;
:class:`Invalidation` collects the bumps, for a write here and for a notification event or an
admin request elsewhere (see :mod:`.events`). Where a write's targets cannot be pinned down, it
flushes everything: when in doubt, miss.

Names are taken as the metastore takes them (:func:`.keys.hms_identifier`: ``'T '`` is the
table ``t``). A name that is not :func:`.keys.certain_identifier` once trimmed (beyond
ASCII, where Python's lower case need not be Java's) invalidates every table of its
database, a database name of that kind everything; a partition the database may match
loosely (a name ending with a blank) all of its table's partitions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy import catalog
from proxy.cache.keys import (
    CATALOG_TAG,
    EPOCH,
    Bump,
    DatabaseRef,
    Naming,
    TableRef,
    certain_identifier,
    database_part,
    java_trim,
    partition_field,
)
from proxy.cache.named_partitions import partition_values
from proxy.cache.plan import FLUSH, WritePlan
from proxy.catalog import Kind, MethodSpec, Scope


def plan_write(naming: Naming, spec: MethodSpec, args: Any | None) -> WritePlan:
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
    inv = Invalidation(naming)
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
        parts = partition_values(target.partitions, args) if target.partitions else []
        cascade = bool(spec.cascade and _cascades(catalog.resolve(spec.cascade, args)))
        for db in dbs:
            if not certain_identifier(java_trim(database_part(db))):
                return FLUSH  # which database the metastore takes it for: not certain
            database = _database(db, args, target.db)
            if scope & Scope.DATABASE:
                inv.database(database)
            if not target.table and scope & Scope.TABLE:
                inv.all_tables_of(database)  # tables change and we do not know which
            for name in names:
                if certain_identifier(java_trim(name)):
                    inv.table(TableRef.of(db, name), scope, parts, cascade=cascade)
                else:  # which table: not certain (see the module's docstring)
                    inv.database(database)
                    inv.all_tables_of(database)
    if spec.renamed_to is not None:
        old_tables = list(inv.tables)
        for new in catalog.resolve(spec.renamed_to, args):
            new_db, new_name = getattr(new, "dbName", None), getattr(new, "tableName", None)
            if not isinstance(new_db, str) or not isinstance(new_name, str):
                return FLUSH
            if not certain_identifier(java_trim(database_part(new_db))):
                return FLUSH
            table = TableRef.of(new_db, new_name)
            if not certain_identifier(java_trim(new_name)):
                inv.all_tables_of(table.database)  # (and the rename below, for the old name)
            # By versions: alter_table('@spark#db', 't', Table{dbName: 'db', ...}) keeps
            # its name (the new table's catalog is in a field of its own).
            if table.tag not in {t.tag for t in old_tables}:
                inv.rename(old_tables, table)
    inv.catalog_wide(scope | (Scope.TABLE if spec.renamed_to else Scope.NONE))
    built = inv.build()
    if spec.name.startswith(("alter_table", "drop_table")) and not built.flush_all:
        ends = tuple(dict.fromkeys(naming.versions(t.tag) for t in built.tables))
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


def _cascades(found: list[Any]) -> bool:
    for value in found:
        if value is True:
            return True
        props = getattr(value, "properties", None)
        if isinstance(props, dict) and str(props.get("CASCADE", "")).lower() == "true":
            return True
    return False
