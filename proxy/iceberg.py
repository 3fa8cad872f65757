"""Iceberg tables on the HMS, as far as the proxy treats them differently (pure).

An Iceberg table's HMS object is a pointer: its ``metadata_location`` parameter names the
table's current metadata file, and a commit is an ``alter_table`` that moves the pointer.
Two things follow.

* **Reading.** A cached table object is a cached pointer, and a pointer older than a commit
  made around the proxy hides that commit from readers for as long as it is served. With
  the notification log followed, that is one poll (as for every table); without it, it
  would be a TTL, so by default Iceberg table objects are then not served from the cache at
  all (``--cache-iceberg-tables auto``). They have no HMS partitions, so little is lost: a
  load reads the metadata file from storage anyway, which costs more than the
  ``get_table``.
* **Committing.** HIVE-26882 (in HMS 2.3.10, 3.2, 4.0) lets an ``alter_table`` carry
  ``expected_parameter_key``/``expected_parameter_value`` in its EnvironmentContext: the HMS
  then applies it only if the parameter still has that value, in the same transaction.
  Java Iceberg sends them only in its lock-free mode and pyiceberg never does; the proxy
  adds them to an Iceberg commit (``--iceberg-expected-location``): an alter that moves the
  table's ``metadata_location`` (the proxy asks the metastore for the current one: one
  ``get_table`` per Iceberg alter) is checked against its ``previous_metadata_location``, so
  a commit on a stale base fails at the HMS with a ``MetaException`` instead of silently
  replacing another writer's commit. An alter that keeps ``metadata_location`` (a rename, a
  property change) is forwarded as it came. An HMS without HIVE-26882 ignores the two keys:
  the commit is applied as before, and only the lock fences (``proxy.cache.locks``) protect
  it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy import idl
from proxy.wire.binary import TType
from proxy.wire.errors import ProtocolError
from proxy.wire.fields import field_spans, find

TABLE_TYPE = "table_type"
METADATA_LOCATION = "metadata_location"
PREVIOUS_METADATA_LOCATION = "previous_metadata_location"
EXPECTED_KEY = "expected_parameter_key"
EXPECTED_VALUE = "expected_parameter_value"

# Reads whose replies carry table objects, and where the tables are in the result.
TABLE_OBJECT_READS: dict[str, Callable[[Any], list[Any]]] = {
    "get_table": lambda s: [s],
    "get_table_req": lambda s: [getattr(s, "table", None)],
    "get_table_objects_by_name": lambda s: list(s or ()),
    "get_table_objects_by_name_req": lambda s: list(getattr(s, "tables", None) or ()),
}


def is_iceberg_table(table: Any) -> bool:
    params = getattr(table, "parameters", None)
    if not isinstance(params, dict):
        return False
    value = params.get(TABLE_TYPE)
    return isinstance(value, str) and value.upper() == "ICEBERG"


def reply_has_iceberg_table(method: str, body: bytes) -> bool:
    """Whether the result of a table-object read holds an Iceberg table (decoded only when
    its bytes mention ``table_type`` at all)."""
    tables_of = TABLE_OBJECT_READS.get(method)
    if tables_of is None or TABLE_TYPE.encode() not in body:
        return False
    try:
        result = idl.decode_result(method, body)
    except ProtocolError:
        return True  # cannot tell: treat it as one (when in doubt, miss)
    return any(is_iceberg_table(t) for t in tables_of(getattr(result, "success", None)))


# Commits the proxy may add the check to (what Java Iceberg, Trino and pyiceberg send).
GUARDED = frozenset({"alter_table_with_environment_context"})
_ENV_CONTEXT_FIELD = 4  # alter_table_with_environment_context_args.environment_context


@dataclass(frozen=True, slots=True)
class Commit:
    """An alter of an Iceberg table that may be a commit: it names a metadata file and the
    one before it."""

    db: str
    table: str
    location: str  # metadata_location as the alter sets it
    previous: str  # previous_metadata_location: the base a commit was built on


def commit_shape(method: str, args: Any) -> Commit | None:
    """What :func:`with_expected_location` needs, if the alter could be a commit.

    The request alone cannot tell a commit from an alter that copies the table's parameters
    as they are (a rename, a property change): both carry a ``metadata_location`` and a
    different ``previous_metadata_location``. A commit moves ``metadata_location``; the
    other keeps the table's current one. So the caller asks the metastore for the current
    one and adds the check only when the alter moves it (see ``proxy.handler.writes``)."""
    if method not in GUARDED:
        return None
    table = getattr(args, "new_tbl", None)
    if table is None or not is_iceberg_table(table):
        return None
    params = table.parameters
    location, previous = params.get(METADATA_LOCATION), params.get(PREVIOUS_METADATA_LOCATION)
    if not isinstance(location, str) or not isinstance(previous, str) or not previous:
        return None
    if location == previous:
        return None
    context = getattr(args, "environment_context", None)
    if EXPECTED_KEY in (getattr(context, "properties", None) or {}):
        return None  # the client asked for its own check (Iceberg's lock-free mode)
    db, name = getattr(args, "dbname", None), getattr(args, "tbl_name", None)
    if not isinstance(db, str) or not isinstance(name, str):
        return None
    new_db, new_name = (
        getattr(table, "dbName", None) or db,
        getattr(table, "tableName", None) or name,
    )
    if str(new_db).lower() != db.lower() or str(new_name).lower() != name.lower():
        return None  # a rename is not a commit
    return Commit(db, name, location, previous)


def with_expected_location(args: Any, body: bytes, previous: str) -> bytes | None:
    """The arguments with the metastore's compare-and-set added, or ``None`` to forward them
    unchanged. Only field 4 (the EnvironmentContext) changes; every other byte, fields this
    proxy's IDL does not know included, stays as the client sent it."""
    context = getattr(args, "environment_context", None)
    properties = dict(getattr(context, "properties", None) or {})
    properties[EXPECTED_KEY] = METADATA_LOCATION
    properties[EXPECTED_VALUE] = previous
    encoded = idl.encode(idl.module().EnvironmentContext(properties=properties))
    field = bytes((TType.STRUCT,)) + _ENV_CONTEXT_FIELD.to_bytes(2, "big") + encoded
    try:
        spans, stop = field_spans(body)
    except (ProtocolError, IndexError, ValueError):
        return None
    span = find(spans, _ENV_CONTEXT_FIELD)
    if span is not None:
        if span.ttype != TType.STRUCT:
            return None
        return body[: span.start] + field + body[span.end :]
    return body[: stop - 1] + field + body[stop - 1 :]


def current_location(body: bytes) -> str | None:
    """``metadata_location`` of the table in a ``get_table_req`` result, if it has one."""
    try:
        result = idl.decode_result("get_table_req", body)
    except ProtocolError:
        return None
    table = getattr(getattr(result, "success", None), "table", None)
    params = getattr(table, "parameters", None) or {}
    location = params.get(METADATA_LOCATION)
    return location if isinstance(location, str) else None
