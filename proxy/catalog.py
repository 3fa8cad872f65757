"""The method catalog: one table that says what every metastore method is to the proxy.

For each method of the IDL (Hive 2.3, the Hive 3/4 additions and fb303) the table gives:

* its **kind**: a cacheable read, a read that is never cached, a write, or a call that
  changes the state of the connection it arrives on;
* its **scope**: for reads, what the reply depends on; for writes, what they change;
* its **targets**: where in the decoded arguments the database, table and partitions are.

Everything else in the proxy (keys, invalidation, retries, metrics labels) is derived from
this table; methods missing from it are passed through as unknown. It knows every method of
Hive 2.3, 3.1, 4.0 and 4.2 (tests/data/hms_methods); the Hive 3/4 methods the cache has no
part in are listed in :mod:`proxy.catalog_hive4`. Only methods whose arguments are decoded
(cacheable reads, writes with targets) need a declaration in the IDL. Paths are attribute paths
into the thriftpy2 argument object (``req.dbName``); ``[*]`` walks a list. Partition
references carry a prefix saying what the path holds: ``values:`` one partition's values,
``name:`` one partition name (``ds=1/h=2``), ``names:`` a list of names, ``objects:``
Partition objects (their values are used).

Why some scopes are wider than the obvious: the HMS itself changes more than a write names.
``update_*_column_statistics`` rewrites ``COLUMN_STATS_ACCURATE`` in the table or partition
parameters; ``alter_table`` may drop column statistics of columns it removes, rewrites its
partitions' parameters when it changes columns (cascade or not), and changes what
``get_tables_by_type``/``get_table_names_by_filter`` return. When in doubt, a write here
invalidates more, never less.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, Flag, auto
from typing import Any

from proxy import catalog_hive4 as hive4


class Kind(Enum):
    CACHEABLE_READ = "cacheable_read"
    READ = "read"  # never cached; safe to retry
    WRITE = "write"  # changes metadata or server state; never retried
    SESSION = "session"  # changes the state of the upstream connection itself


class Scope(Flag):
    NONE = 0
    CATALOG = auto()  # the list of databases (and catalogs)
    DATABASE = auto()  # a database object and the list of its tables
    TABLE = auto()  # a table object, its fields, schema and constraints
    PARTITION_SET = auto()  # which partitions a table has
    PARTITIONS = auto()  # partition objects: one, several, or all of a table's
    STATISTICS = auto()  # column statistics
    FUNCTIONS = auto()  # functions, catalog-wide
    PRIVILEGES = auto()  # grants and roles, which *_with_auth replies carry


EVERYTHING_OF_A_TABLE = Scope.TABLE | Scope.PARTITION_SET | Scope.PARTITIONS | Scope.STATISTICS


@dataclass(frozen=True, slots=True)
class Target:
    """Where one object's names are in the arguments (attribute paths, see module doc)."""

    db: str | None = None
    table: str | None = None
    tables: str | None = None  # a list of table names, instead of ``table``
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    kind: Kind
    scope: Scope = Scope.NONE
    targets: tuple[Target, ...] = ()
    negative: bool = False  # NoSuchObjectException replies may be cached
    per_partition: bool = False  # reply assembled per partition (get_partitions_by_names)
    wide: bool = False  # the reply spans databases (patterns), no single target
    renamed_to: str | None = None  # path to the object a rename turns the target into
    cascade: str | None = None  # path to a cascade flag (bool or EnvironmentContext)
    flushes: bool = False  # what it changes cannot be named: everything is invalidated
    optional: str | None = None  # path to the targets' list: absent or empty, nothing changed
    flush_if: tuple[str, ...] = ()  # paths to arguments that, when given, change unnamed things
    uncached_if: str | None = None  # path to a flag: when true, the reply is not cached

    @property
    def retryable(self) -> bool:
        """Safe to send again on a fresh connection when a pooled one turned out stale."""
        return self.kind in (Kind.CACHEABLE_READ, Kind.READ)

    def names_nothing(self, args: Any) -> bool:
        """Whether the list an ``optional`` write's targets are in is absent or empty: then
        there is nothing to invalidate. (Entries that do not say which database they are in
        are another matter: those flush.)"""
        return self.optional is not None and not any(resolve(self.optional, args))

    def flushes_with(self, args: Any) -> bool:
        """Whether an argument given names what it changes in a way the proxy cannot map."""
        return self.flushes or any(resolve(path, args) for path in self.flush_if)

    def uncached_with(self, args: Any) -> bool:
        return self.uncached_if is not None and any(
            v is True for v in resolve(self.uncached_if, args)
        )


_TABLE: dict[str, MethodSpec] = {}


def _add(spec: MethodSpec) -> None:
    assert spec.name not in _TABLE, f"{spec.name} listed twice"
    _TABLE[spec.name] = spec


def _target(
    db: str | None, table: str | None, *partitions: str, tables: str | None = None
) -> Target:
    return Target(db, table, tables, partitions)


def cached(
    name: str,
    scope: Scope,
    db: str | None = None,
    table: str | None = None,
    *partitions: str,
    tables: str | None = None,
    negative: bool = False,
    per_partition: bool = False,
    wide: bool = False,
    uncached_if: str | None = None,
) -> None:
    targets = (_target(db, table, *partitions, tables=tables),) if db else ()
    _add(
        MethodSpec(
            name,
            Kind.CACHEABLE_READ,
            scope,
            targets,
            negative=negative,
            per_partition=per_partition,
            wide=wide,
            uncached_if=uncached_if,
        )
    )


def uncached(*names: str) -> None:
    for name in names:
        _add(MethodSpec(name, Kind.READ))


def write(
    name: str,
    scope: Scope,
    *targets: Target,
    renamed_to: str | None = None,
    cascade: str | None = None,
    optional: str | None = None,
    flush_if: tuple[str, ...] = (),
) -> None:
    _add(
        MethodSpec(
            name,
            Kind.WRITE,
            scope,
            targets,
            renamed_to=renamed_to,
            cascade=cascade,
            optional=optional,
            flush_if=flush_if,
        )
    )


def flushing(*names: str) -> None:
    """Writes of metadata the proxy cannot tell apart: each one flushes the cache."""
    for name in names:
        _add(MethodSpec(name, Kind.WRITE, flushes=True))


def state(*names: str) -> None:
    """Writes of server state the cache does not hold (transactions, locks, tokens)."""
    for name in names:
        _add(MethodSpec(name, Kind.WRITE))


def session(*names: str) -> None:
    for name in names:
        _add(MethodSpec(name, Kind.SESSION))


T = _target
C, D, TB = Scope.CATALOG, Scope.DATABASE, Scope.TABLE
PS, P, ST = Scope.PARTITION_SET, Scope.PARTITIONS, Scope.STATISTICS
WHOLE_LIST = PS | P  # a reply listing a table's partitions depends on which and on what
ALL_OF_DB = C | D | EVERYTHING_OF_A_TABLE | Scope.FUNCTIONS

# --- Session and server -------------------------------------------------------------------
# set_ugi binds an identity to the connection; setMetaConf changes that connection's
# configuration. Neither may leak to another client through a pooled connection.
session("set_ugi", "setMetaConf")
uncached(
    "getMetaConf",
    "get_config_value",
    "partition_name_has_valid_characters",
    "partition_name_to_spec",
    "partition_name_to_vals",
)
state("flushCache")
# fb303, which the HMS serves as well.
uncached(
    "getName",
    "getVersion",
    "getStatus",
    "getStatusDetails",
    "getCounters",
    "getCounter",
    "getOption",
    "getOptions",
    "getCpuProfile",
    "aliveSince",
)
state("setOption", "reinitialize", "shutdown")

# --- Catalogs and databases ---------------------------------------------------------------
cached("get_all_databases", C, wide=True)
cached("get_databases", C, wide=True)
cached("get_databases_req", C, wide=True)
cached("get_catalogs", C, wide=True)
cached("get_catalog", C, wide=True)
cached("get_database", D, "name", negative=True)
cached("get_database_req", D, "request.name", negative=True)
write("create_catalog", C)
write("alter_catalog", C)
write("drop_catalog", ALL_OF_DB)
write("create_database", C | D, T("database.name", None))
write("create_database_req", C | D, T("createDatabaseRequest.databaseName", None))
write("alter_database", C | D, T("dbname", None))
write("alter_database_req", C | D, T("alterDbReq.oldDbName", None))
write("drop_database", ALL_OF_DB, T("name", None))
write("drop_database_req", ALL_OF_DB, T("req.name", None))
# A REMOTE database (Hive 4) lists the tables of its data connector, which these create,
# repoint or remove. Which databases use a connector the proxy cannot tell, and the versions of
# a database's table list and tables are its own (no catalog-wide one covers them): flush.
flushing("create_dataconnector_req", "alter_dataconnector_req", "drop_dataconnector_req")

# --- Tables ---------------------------------------------------------------------------------
cached("get_all_tables", D, "db_name")
cached("get_tables", D, "db_name")
cached("get_tables_by_type", D, "db_name")
cached("get_table_names_by_filter", D, "dbname")
cached("get_tables_ext", D, "req.database")
cached("get_materialized_views_for_rewriting", D, "db_name")
cached("get_table_meta", C | D | TB, wide=True)
# Table objects of every database, keyed on nothing narrower than the catalog-wide version: a
# lock on one of those tables (proxy.cache.locks) could not fence it, and a cached copy would
# answer a read inside the lock. When in doubt, miss: never cached.
uncached("get_all_materialized_view_objects_for_rewriting")
cached("get_table", TB, "dbname", "tbl_name", negative=True)
cached("get_table_req", TB, "req.dbName", "req.tblName", negative=True)
cached("get_table_objects_by_name", TB, "dbname", tables="tbl_names")
cached("get_table_objects_by_name_req", D | TB, "req.dbName", tables="req.tblNames")
cached("get_fields", TB, "db_name", "table_name")
cached("get_fields_with_environment_context", TB, "db_name", "table_name")
cached("get_fields_req", TB, "req.dbName", "req.tblName")
cached("get_schema", TB, "db_name", "table_name")
cached("get_schema_with_environment_context", TB, "db_name", "table_name")
cached("get_schema_req", TB, "req.dbName", "req.tblName")
cached("get_primary_keys", TB, "request.db_name", "request.tbl_name")
cached("get_unique_constraints", TB, "request.db_name", "request.tbl_name")
cached("get_not_null_constraints", TB, "request.db_name", "request.tbl_name")
cached("get_default_constraints", TB, "request.db_name", "request.tbl_name")
cached("get_check_constraints", TB, "request.db_name", "request.tbl_name")
cached("get_all_table_constraints", TB, "request.dbName", "request.tblName")
# Foreign keys can be asked for by the referenced table alone: no single table to key on.
uncached("get_foreign_keys")

_CREATED = D | EVERYTHING_OF_A_TABLE  # table lists of the database, and the table itself
write("create_table", _CREATED, T("tbl.dbName", "tbl.tableName"))
write("create_table_with_environment_context", _CREATED, T("tbl.dbName", "tbl.tableName"))
write("create_table_with_constraints", _CREATED, T("tbl.dbName", "tbl.tableName"))
write("create_table_req", _CREATED, T("request.table.dbName", "request.table.tableName"))
write("drop_table", _CREATED, T("dbname", "name"))
write("drop_table_with_environment_context", _CREATED, T("dbname", "name"))
write("drop_table_req", _CREATED, T("dropTableReq.dbName", "dropTableReq.tableName"))
# The partitions too: when the columns change, the HMS rewrites every partition's statistics
# parameters (and drops their column statistics) with or without cascade
# (HiveAlterHandler.alterTable), and a request does not say whether they changed.
_ALTERED = D | TB | ST | P
write("alter_table", _ALTERED, T("dbname", "tbl_name"), renamed_to="new_tbl")
write(
    "alter_table_with_environment_context",
    _ALTERED,
    T("dbname", "tbl_name"),
    renamed_to="new_tbl",
    cascade="environment_context",
)
write(
    "alter_table_with_cascade",
    _ALTERED,
    T("dbname", "tbl_name"),
    renamed_to="new_tbl",
    cascade="cascade",
)
write(
    "alter_table_req",
    _ALTERED,
    T("req.dbName", "req.tableName"),
    renamed_to="req.table",
    cascade="req.environmentContext",
)
write("truncate_table", TB | P | ST, T("dbName", "tableName", "names:partNames"))
write("truncate_table_req", TB | P | ST, T("req.dbName", "req.tableName", "names:req.partNames"))
write(
    "add_primary_key", TB, T("req.primaryKeyCols[*].table_db", "req.primaryKeyCols[*].table_name")
)
write(
    "add_foreign_key",
    TB,
    T("req.foreignKeyCols[*].fktable_db", "req.foreignKeyCols[*].fktable_name"),
)
write(
    "add_unique_constraint",
    TB,
    T("req.uniqueConstraintCols[*].table_db", "req.uniqueConstraintCols[*].table_name"),
)
write(
    "add_not_null_constraint",
    TB,
    T("req.notNullConstraintCols[*].table_db", "req.notNullConstraintCols[*].table_name"),
)
write(
    "add_default_constraint",
    TB,
    T("req.defaultConstraintCols[*].table_db", "req.defaultConstraintCols[*].table_name"),
)
write(
    "add_check_constraint",
    TB,
    T("req.checkConstraintCols[*].table_db", "req.checkConstraintCols[*].table_name"),
)
write("drop_constraint", TB, T("req.dbname", "req.tablename"))
# A materialized view's creation metadata (what it was built from) is its Table.16.
write("update_creation_metadata", TB, T("dbname", "tbl_name"))

# --- Partitions ---------------------------------------------------------------------------
cached("get_partition_names", PS, "db_name", "tbl_name")
cached("get_partition_names_ps", PS, "db_name", "tbl_name")
cached("get_partition_names_ps_req", PS, "req.dbName", "req.tblName")
cached("get_partition_names_req", PS, "req.dbName", "req.tblName")
cached("fetch_partition_names_req", PS, "partitionReq.dbName", "partitionReq.tblName")
cached("get_partition_values", PS, "request.dbName", "request.tblName")
cached("get_num_partitions_by_filter", PS, "db_name", "tbl_name")
cached("get_partition", P, "db_name", "tbl_name", "values:part_vals")
cached("get_partition_by_name", P, "db_name", "tbl_name", "name:part_name")
cached("get_partition_req", P, "req.dbName", "req.tblName", "values:req.partVals")
cached("get_partition_with_auth", P | Scope.PRIVILEGES, "db_name", "tbl_name", "values:part_vals")
cached("get_partitions_by_names", P, "db_name", "tbl_name", "names:names", per_partition=True)
cached(
    "get_partitions_by_names_req",
    P,
    "req.db_name",
    "req.tbl_name",
    "names:req.names",
    per_partition=True,
    # File metadata (Hive 4, which Impala's catalogd serves) is read from the file system:
    # files change with no metastore write, so such replies are never cached.
    uncached_if="req.getFileMetadata",
)
cached("get_partitions", WHOLE_LIST, "db_name", "tbl_name")
cached("get_partitions_pspec", WHOLE_LIST, "db_name", "tbl_name")
cached("get_partitions_ps", WHOLE_LIST, "db_name", "tbl_name")
cached("get_partitions_by_filter", WHOLE_LIST, "db_name", "tbl_name")
cached("get_part_specs_by_filter", WHOLE_LIST, "db_name", "tbl_name")
cached("get_partitions_by_filter_req", WHOLE_LIST, "req.dbName", "req.tblName")
cached("get_partitions_by_expr", WHOLE_LIST, "req.dbName", "req.tblName")
cached("get_partitions_spec_by_expr", WHOLE_LIST, "req.dbName", "req.tblName")
cached("get_partitions_req", WHOLE_LIST, "req.dbName", "req.tblName")
_WITH_AUTH = WHOLE_LIST | Scope.PRIVILEGES
cached("get_partitions_with_auth", _WITH_AUTH, "db_name", "tbl_name")
cached("get_partitions_ps_with_auth", _WITH_AUTH, "db_name", "tbl_name")
cached("get_partitions_ps_with_auth_req", _WITH_AUTH, "req.dbName", "req.tblName")
cached("get_partitions_with_specs", _WITH_AUTH, "request.dbName", "request.tblName")
uncached("isPartitionMarkedForEvent")

_ADDED = PS | P  # a new partition: the set changes, and a cached "absent" must go
write("add_partition", _ADDED, T("new_part.dbName", "new_part.tableName", "objects:new_part"))
write(
    "add_partition_with_environment_context",
    _ADDED,
    T("new_part.dbName", "new_part.tableName", "objects:new_part"),
)
write(
    "add_partitions",
    _ADDED,
    T("new_parts[*].dbName", "new_parts[*].tableName", "objects:new_parts[*]"),
)
write("add_partitions_pspec", _ADDED, T("new_parts[*].dbName", "new_parts[*].tableName"))
write(
    "add_partitions_req",
    _ADDED,
    T("request.dbName", "request.tblName", "objects:request.parts[*]"),
)
write("append_partition", _ADDED, T("db_name", "tbl_name", "values:part_vals"))
write(
    "append_partition_with_environment_context",
    _ADDED,
    T("db_name", "tbl_name", "values:part_vals"),
)
write("append_partition_by_name", _ADDED, T("db_name", "tbl_name", "name:part_name"))
write(
    "append_partition_by_name_with_environment_context",
    _ADDED,
    T("db_name", "tbl_name", "name:part_name"),
)
write(
    "append_partition_req",
    _ADDED,
    T(
        "appendPartitionsReq.dbName",
        "appendPartitionsReq.tableName",
        "name:appendPartitionsReq.name",
        "values:appendPartitionsReq.partVals",
    ),
)
write(
    "add_dynamic_partitions",
    _ADDED,
    T("rqst.dbname", "rqst.tablename", "names:rqst.partitionnames"),
)
# A dropped partition also takes its statistics with it.
_DROPPED = PS | P | ST
write("drop_partition", _DROPPED, T("db_name", "tbl_name", "values:part_vals"))
write(
    "drop_partition_with_environment_context",
    _DROPPED,
    T("db_name", "tbl_name", "values:part_vals"),
)
write("drop_partition_by_name", _DROPPED, T("db_name", "tbl_name", "name:part_name"))
write(
    "drop_partition_by_name_with_environment_context",
    _DROPPED,
    T("db_name", "tbl_name", "name:part_name"),
)
write(
    "drop_partition_req",
    _DROPPED,
    T(
        "dropPartitionReq.dbName",
        "dropPartitionReq.tblName",
        "name:dropPartitionReq.partName",
        "values:dropPartitionReq.partVals",
    ),
)
write("drop_partitions_req", _DROPPED, T("req.dbName", "req.tblName", "names:req.parts.names"))
write("alter_partition", P, T("db_name", "tbl_name", "objects:new_part"))
write("alter_partition_with_environment_context", P, T("db_name", "tbl_name", "objects:new_part"))
write("alter_partitions", P, T("db_name", "tbl_name", "objects:new_parts[*]"))
write(
    "alter_partitions_with_environment_context", P, T("db_name", "tbl_name", "objects:new_parts[*]")
)
write("alter_partitions_req", P, T("req.dbName", "req.tableName", "objects:req.partitions[*]"))
write(
    "rename_partition", _DROPPED, T("db_name", "tbl_name", "values:part_vals", "objects:new_part")
)
write(
    "rename_partition_req",
    _DROPPED,
    T("req.dbName", "req.tableName", "values:req.partVals", "objects:req.newPart"),
)
write(
    "exchange_partition",
    _DROPPED,
    T("source_db", "source_table_name"),
    T("dest_db", "dest_table_name"),
)
write(
    "exchange_partitions",
    _DROPPED,
    T("source_db", "source_table_name"),
    T("dest_db", "dest_table_name"),
)
state("markPartitionForEvent")
# An INSERT event: files changed, metadata did not; cached file listings of the partition
# (and its statistics, which describe the files) are no longer right.
write(
    "fire_listener_event",
    P | ST,
    T("rqst.dbName", "rqst.tableName", "values:rqst.partitionVals"),
)

# --- Column statistics --------------------------------------------------------------------
cached("get_table_column_statistics", TB | ST, "db_name", "tbl_name")
cached("get_table_statistics_req", TB | ST, "request.dbName", "request.tblName")
# Partition statistics also depend on the table: altering its columns drops statistics.
cached(
    "get_partition_column_statistics",
    TB | P | ST,
    "db_name",
    "tbl_name",
    "name:part_name",
)
cached(
    "get_partitions_statistics_req",
    TB | P | ST,
    "request.dbName",
    "request.tblName",
    "names:request.partNames",
)
cached(
    "get_aggr_stats_for",
    TB | P | ST,
    "request.dbName",
    "request.tblName",
    "names:request.partNames",
)
write(
    "update_table_column_statistics",
    TB | ST,
    T("stats_obj.statsDesc.dbName", "stats_obj.statsDesc.tableName"),
)
write(
    "update_partition_column_statistics",
    P | ST,
    T(
        "stats_obj.statsDesc.dbName",
        "stats_obj.statsDesc.tableName",
        "name:stats_obj.statsDesc.partName",
    ),
)
write(
    "update_table_column_statistics_req",
    TB | ST,
    T("req.colStats[*].statsDesc.dbName", "req.colStats[*].statsDesc.tableName"),
)
write(
    "update_partition_column_statistics_req",
    P | ST,
    T(
        "req.colStats[*].statsDesc.dbName",
        "req.colStats[*].statsDesc.tableName",
        "names:req.colStats[*].statsDesc.partName",
    ),
)
write(
    "set_aggr_stats_for",
    TB | P | ST,
    T(
        "request.colStats[*].statsDesc.dbName",
        "request.colStats[*].statsDesc.tableName",
        "names:request.colStats[*].statsDesc.partName",
    ),
)
write("delete_table_column_statistics", TB | ST, T("db_name", "tbl_name"))
write("delete_partition_column_statistics", P | ST, T("db_name", "tbl_name", "name:part_name"))
write(
    "delete_column_statistics_req",
    TB | P | ST,
    T("req.db_name", "req.tbl_name", "names:req.part_names"),
)

# --- Functions ------------------------------------------------------------------------------
cached("get_function", Scope.FUNCTIONS, wide=True)
cached("get_functions", Scope.FUNCTIONS, wide=True)
cached("get_all_functions", Scope.FUNCTIONS, wide=True)
cached("get_functions_req", Scope.FUNCTIONS, wide=True)
write("create_function", Scope.FUNCTIONS)
write("alter_function", Scope.FUNCTIONS)
write("drop_function", Scope.FUNCTIONS)

# --- Privileges and roles -----------------------------------------------------------------
# Replies depend on who asks and change with grants; never cached. Grants change what the
# cached *_with_auth replies carry.
uncached(
    "get_privilege_set",
    "list_privileges",
    "list_roles",
    "get_role_names",
    "get_principals_in_role",
    "get_role_grants_for_principal",
)
for _name in (
    "grant_privileges",
    "revoke_privileges",
    "grant_revoke_privileges",
    "create_role",
    "drop_role",
    "grant_role",
    "revoke_role",
    "grant_revoke_role",
    "refresh_privileges",  # revokes every grant on an object, then grants anew
):
    write(_name, Scope.PRIVILEGES)

# --- Transactions, locks, compaction, tokens, notifications: server state, never cached -----
state(
    "open_txns",
    "abort_txn",
    "abort_txns",
    "lock",
    "check_lock",  # may acquire the lock it checks
    "unlock",
    "heartbeat",
    "heartbeat_txn_range",
    "compact",
    "compact2",
    "allocate_table_write_ids",
    "get_delegation_token",  # creates a token
    "renew_delegation_token",
    "cancel_delegation_token",
    "add_token",
    "remove_token",
    "add_master_key",
    "update_master_key",
    "remove_master_key",
)
uncached(
    "get_open_txns",
    "get_open_txns_info",
    "show_locks",
    "show_compact",
    "get_valid_write_ids",
    "get_all_write_event_info",
    "get_token",
    "get_all_token_identifiers",
    "get_master_keys",
    "get_current_notificationEventId",
    "get_next_notification",
    "get_notification_events_count",
)

# An ACID write (Hive 3+): files of a table or partition changed, metadata did not, as with
# fire_listener_event's INSERT; cached listings and statistics of them are no longer right.
write(
    "add_write_notification_log",
    P | ST,
    T("rqst.db", "rqst.table", "values:rqst.partitionVals"),
)
write(
    "add_write_notification_log_in_batch",
    P | ST,
    T("rqst.db", "rqst.table", "values:rqst.requestList[*].partitionVals"),
)
# An engine's commit changes nothing the cache holds: tables, partitions and statistics a
# transaction changes are changed by their own calls during it (alter_*, update_*_statistics*,
# which invalidate), and reads of a snapshot carry their validWriteIdList in their key. A
# replicated transaction's commit names the writes it brings (writeEventInfos): those tables'
# and partitions' files changed. Two more fields change metadata (Hive's CommitTxnFunction):
# replLastIdInfo writes repl.last.id into database, table and partition parameters (at the
# end of a REPL LOAD), keyValue a table's parameter, naming the table by id only: either one
# flushes. With none of the three a commit invalidates nothing. Never retried, like every
# write; its lock fences are settled in proxy.cache.locks.
write(
    "commit_txn",
    P | ST,
    T(
        "rqst.writeEventInfos[*].database",
        "rqst.writeEventInfos[*].table",
        "name:rqst.writeEventInfos[*].partition",
    ),
    optional="rqst.writeEventInfos",
    flush_if=("rqst.replLastIdInfo", "rqst.keyValue"),
)
# An ACID write's row counts (Hive 4, sent by the writer after each INSERT, UPDATE or DELETE,
# once per partition written): the HMS adds them to the counters of the materialized views
# that use the table (MV_TABLES_USED), which only get_materialization_invalidation_info
# reads, uncached. Nothing the cache holds changes.
state("update_transaction_statistics")

# --- Hive 3 and 4: reads forwarded every time, and server state (see proxy.catalog_hive4) ---
uncached(*hive4.TXN_READS, *hive4.SERVER_READS, *hive4.STORE_READS, *hive4.DRY_RUNS)
# CLAIMS read like look-ups but take something each time: state, so never retried.
state(*hive4.CLAIMS, *hive4.COMPACTION, *hive4.TXN_STATE, *hive4.SERVER_STATE)
state(*hive4.STORE_WRITES)

# --- File metadata, indexes (Hive 2.x), types: rare, passed through -----------------------
uncached("get_file_metadata", "get_file_metadata_by_expr", "cache_file_metadata")
state("put_file_metadata", "clear_file_metadata")
uncached("get_index_by_name", "get_index_names", "get_indexes", "get_type", "get_type_all")
# An index is stored as a table of its database.
write("add_index", D | TB, T("new_index.dbName", None))
write("alter_index", D | TB, T("dbname", None))
write("drop_index_by_name", D | TB, T("db_name", None))
state("create_type", "drop_type")


# ---------------------------------------------------------------------------------------------


def lookup(name: str) -> MethodSpec | None:
    """The catalog entry for ``name``; ``None`` for methods the proxy does not know."""
    return _TABLE.get(name)


def all_methods() -> Iterator[MethodSpec]:
    return iter(_TABLE.values())


def resolve(path: str, args: Any) -> list[Any]:
    """Every value ``path`` reaches in ``args``; ``[*]`` fans out over lists, None stops."""
    values = [args]
    for step in path.split("."):
        fan_out = step.endswith("[*]")
        attr = step.removesuffix("[*]")
        next_values: list[Any] = []
        for value in values:
            item = getattr(value, attr, None)
            if item is None:
                continue
            if fan_out:
                next_values.extend(v for v in item if v is not None)
            else:
                next_values.append(item)
        values = next_values
    return values
