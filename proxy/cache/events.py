"""From an HMS notification event to what it invalidates (pure).

Events come from the metastore's notification log (``get_next_notification``), written by
Hive's DbNotificationListener. Two message formats are read: ``json-0.2`` (Hive 2.x/3.x, plain
JSON) and Hive 4's ``gzip(json-2.0)`` (base64 of gzipped JSON); the keys are the same.
Objects inside messages (``tableObjAfterJson``...) are Thrift structs in TJSONProtocol, read
here only for the few fields that matter (names, partition values, columns).

Precision: partition events name their partitions, so only those partitions (and whole-list
replies) are invalidated. Where an event says too little (an unknown type, a message that
does not parse), the invalidation is widened, never narrowed.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from dataclasses import dataclass
from typing import Any

from proxy import catalog
from proxy.cache.keys import (
    DatabaseRef,
    PartitionNameError,
    TableRef,
    loose_partition_values,
    parse_partition_name,
)
from proxy.cache.plan import FLUSH, WritePlan
from proxy.cache.planner import Planner
from proxy.catalog import Scope

# Event types that change nothing this proxy caches.
SKIPPED = frozenset(
    {
        "OPEN_TXN",
        "COMMIT_TXN",
        "ABORT_TXN",
        "ALLOC_WRITE_ID_EVENT",
        "COMMIT_COMPACTION_EVENT",
        "CREATE_ISCHEMA",
        "ALTER_ISCHEMA",
        "DROP_ISCHEMA",
        "ADD_SCHEMA_VERSION",
        "ALTER_SCHEMA_VERSION",
        "DROP_SCHEMA_VERSION",
        "CREATE_DATACONNECTOR",
        "UPDATE_TXN_STATE",  # some vendors
    }
)
KNOWN = SKIPPED | {
    "CREATE_DATABASE", "ALTER_DATABASE", "DROP_DATABASE", "CREATE_TABLE", "ALTER_TABLE",
    "DROP_TABLE", "ADD_PARTITION", "ALTER_PARTITION", "DROP_PARTITION", "INSERT",
    "CREATE_FUNCTION", "DROP_FUNCTION", "CREATE_INDEX", "DROP_INDEX", "ALTER_INDEX",
    "ADD_PRIMARYKEY", "ADD_FOREIGNKEY", "ADD_UNIQUECONSTRAINT", "ADD_NOTNULLCONSTRAINT",
    "ADD_DEFAULTCONSTRAINT", "ADD_CHECKCONSTRAINT", "DROP_CONSTRAINT",
    "UPDATE_TBL_COL_STAT_EVENT", "DELETE_TBL_COL_STAT_EVENT", "UPDATE_PART_COL_STAT_EVENT",
    "UPDATE_PART_COL_STAT_EVENT_BATCH", "DELETE_PART_COL_STAT_EVENT", "ACID_WRITE_EVENT",
    "BATCH_ACID_WRITE_EVENT", "CREATE_CATALOG", "ALTER_CATALOG", "DROP_CATALOG", "RELOAD",
    "ALTER_DATACONNECTOR", "DROP_DATACONNECTOR",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Event:
    """The fields of a NotificationEvent the proxy uses."""

    event_id: int
    event_time: int
    event_type: str
    db: str | None
    table: str | None
    message: str
    message_format: str | None


def decode_message(event: Event) -> dict[str, Any] | None:
    """The event's JSON body, whatever its format; ``None`` if it cannot be read."""
    text = event.message
    try:
        if event.message_format and event.message_format.startswith("gzip"):
            text = gzip.decompress(base64.b64decode(text)).decode("utf-8")
        body = json.loads(text)
    except (ValueError, OSError, binascii.Error, EOFError):
        return None
    return body if isinstance(body, dict) else None


def _tjson(value: Any) -> dict[str, Any] | None:
    """A TJSONProtocol struct (``{"1": {"str": ...}, ...}``), given as a string or parsed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _tjson_string(struct: dict[str, Any] | None, fid: int) -> str | None:
    field = (struct or {}).get(str(fid))
    return (
        field.get("str") if isinstance(field, dict) and isinstance(field.get("str"), str) else None
    )


def _tjson_string_list(struct: dict[str, Any] | None, fid: int) -> list[str] | None:
    field = (struct or {}).get(str(fid))
    items = field.get("lst") if isinstance(field, dict) else None
    if not isinstance(items, list) or len(items) < 2 or items[0] != "str":
        return None
    values = items[2:]
    return values if all(isinstance(v, str) for v in values) else None


def _table_name(struct: dict[str, Any] | None) -> tuple[str, str] | None:
    name, db = _tjson_string(struct, 1), _tjson_string(struct, 2)
    return (db, name) if name and db else None


def _columns(struct: dict[str, Any] | None) -> Any:
    sd = (struct or {}).get("7", {}).get("rec", {})
    return sd.get("1") if isinstance(sd, dict) else None


def _values_of_maps(maps: Any) -> list[tuple[str, ...]] | None:
    if not isinstance(maps, list):
        return None
    out = []
    for item in maps:
        if not isinstance(item, dict) or not all(isinstance(v, str) for v in item.values()):
            return None
        out.append(tuple(item.values()))  # in partition-key order: Hive writes them so
    return out


def _partition_values(body: dict[str, Any]) -> list[tuple[str, ...]] | None:
    """The partitions an event names, as value tuples; ``None`` if it does not say, or if
    one is a partition whose name the database matches loosely (``ds=1 `` is found by
    ``ds=1`` too: reads of either may hold it, see :mod:`.keys`)."""
    out = _named(body)
    if out is None or any(loose_partition_values(values) for values in out):
        return None
    return out


def _named(body: dict[str, Any]) -> list[tuple[str, ...]] | None:
    """The partitions an event names, as value tuples; ``None`` if it does not say."""
    listed = body.get("partitionListJson")
    if isinstance(listed, list) and listed:
        out = []
        for item in listed:
            values = _tjson_string_list(_tjson(item), 1)
            if values is None:
                return _values_of_maps(body.get("partitions"))
            out.append(tuple(values))
        return out
    if "partitions" in body:
        return _values_of_maps(body.get("partitions"))
    out = []
    for key in ("keyValues", "partKeyVals"):
        if isinstance(body.get(key), dict) and body[key]:
            found = _values_of_maps([body[key]])
            if found is None:
                return None
            out += found
    for key in ("partitionObjBeforeJson", "partitionObjAfterJson", "ptnObjJson"):
        values = _tjson_string_list(_tjson(body.get(key)), 1)
        if values is not None:
            out.append(tuple(values))
    if isinstance(body.get("partVals"), list):
        out.append(tuple(str(v) for v in body["partVals"]))
    name = body.get("partName") or body.get("partition")
    if isinstance(name, str) and name:
        try:
            out.append(parse_partition_name(name)[1])
        except PartitionNameError:
            return None
    return list(dict.fromkeys(out)) or None


def invalidation_for(event: Event, planner: Planner) -> WritePlan | None:
    """What ``event`` invalidates; ``None`` when it changes nothing cached."""
    kind = event.event_type.upper()
    if kind in SKIPPED:
        return None
    body = decode_message(event) or {}
    db = event.db or body.get("db")
    table = event.table or body.get("table")
    inv = planner.invalidation()
    if kind in ("CREATE_FUNCTION", "DROP_FUNCTION"):
        inv.catalog_wide(Scope.FUNCTIONS)
        return inv.build()
    if kind in ("CREATE_CATALOG", "ALTER_CATALOG"):
        inv.catalog_wide(Scope.CATALOG)
        return inv.build()
    if kind in ("DROP_CATALOG", "DROP_DATABASE", "ALTER_DATACONNECTOR", "DROP_DATACONNECTOR"):
        # Every table of it goes, and the log does not list them: forget everything.
        return FLUSH
    if not isinstance(db, str) or not db:
        return FLUSH
    database = DatabaseRef.of(db)
    if kind in ("CREATE_DATABASE", "ALTER_DATABASE"):
        inv.database(database)
        inv.catalog_wide(Scope.CATALOG | Scope.DATABASE)
        return inv.build()
    if kind in ("CREATE_INDEX", "DROP_INDEX", "ALTER_INDEX"):  # an index is a table of its db
        inv.database(database)
        inv.all_tables_of(database)
        inv.catalog_wide(Scope.DATABASE)
        return inv.build()
    if not isinstance(table, str) or not table:
        inv.all_tables_of(database)
        inv.database(database)
        inv.catalog_wide(Scope.DATABASE | Scope.TABLE)
        return inv.build()
    ref = TableRef.of(db, table)
    everything = catalog.EVERYTHING_OF_A_TABLE
    if kind in ("CREATE_TABLE", "DROP_TABLE"):
        inv.database(database)
        inv.table(ref, everything, None)
        inv.catalog_wide(Scope.DATABASE | Scope.TABLE)
    elif kind == "ALTER_TABLE":
        before, after = (
            _tjson(body.get("tableObjBeforeJson")),
            _tjson(body.get("tableObjAfterJson")),
        )
        old, new = _table_name(before), _table_name(after)
        if old and new and TableRef.of(*old) != TableRef.of(*new):
            inv.rename([TableRef.of(*old)], TableRef.of(*new))
        else:
            # No cascade flag in the message: partitions change if the columns did (or if
            # the message does not let us tell).
            cols_before, cols_after = _columns(before), _columns(after)
            cascade = cols_before is None or cols_before != cols_after
            inv.table(ref, Scope.TABLE | Scope.STATISTICS, None, cascade=cascade)
        inv.database(database)
        inv.catalog_wide(Scope.TABLE)
    elif kind in ("ADD_PARTITION", "DROP_PARTITION", "ALTER_PARTITION"):
        parts = _partition_values(body)
        scope = Scope.PARTITIONS | Scope.STATISTICS
        if kind != "ALTER_PARTITION" or (parts and len(parts) > 1):  # a rename moves it
            scope |= Scope.PARTITION_SET
        inv.table(ref, scope, parts)
    elif kind in (
        "INSERT",
        "UPDATE_PART_COL_STAT_EVENT",
        "DELETE_PART_COL_STAT_EVENT",
        "UPDATE_PART_COL_STAT_EVENT_BATCH",
        "ACID_WRITE_EVENT",
        "BATCH_ACID_WRITE_EVENT",
    ):
        parts = _partition_values(body)
        if parts:
            inv.table(ref, Scope.PARTITIONS | Scope.STATISTICS, parts)
        else:  # an unpartitioned table, or partitions not named
            inv.table(ref, Scope.TABLE | Scope.PARTITIONS | Scope.STATISTICS, None)
    elif kind in ("UPDATE_TBL_COL_STAT_EVENT", "DELETE_TBL_COL_STAT_EVENT"):
        inv.table(ref, Scope.TABLE | Scope.STATISTICS, None)
    elif kind.startswith("ADD_") or kind == "DROP_CONSTRAINT":
        inv.table(ref, Scope.TABLE, None)
    else:  # RELOAD, and anything this version does not know: all of the table
        inv.database(database)
        inv.table(
            ref, Scope.TABLE | Scope.PARTITION_SET | Scope.PARTITIONS | Scope.STATISTICS, None
        )
        inv.catalog_wide(Scope.TABLE)
    return inv.build()
