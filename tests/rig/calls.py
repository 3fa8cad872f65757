"""Requests for every read in the catalog, built from the IDL with plausible arguments.

Arguments are filled by field name (``dbName`` and ``db_name`` are the database, and so on),
in two flavours: naming objects that exist (the sample objects) and naming ones that do not.
"""

from __future__ import annotations

from typing import Any

from proxy import catalog, idl
from proxy.catalog import Kind
from proxy.wire.binary import MessageType, encode_header
from tests.rig.sample import Sample

# Replies that legitimately differ between two calls made a moment apart.
VOLATILE = {"getCounters", "getStatusDetails"}

DB_FIELDS = {
    "db_name",
    "dbname",
    "dbName",
    "databaseName",
    "database",
    "db",
    "parent_db_name",
    "foreign_db_name",
    "source_db",
    "dest_db",
    "oldDbName",
}
TABLE_FIELDS = {
    "tbl_name",
    "table_name",
    "tableName",
    "tblName",
    "table",
    "parent_tbl_name",
    "foreign_tbl_name",
    "source_table_name",
    "dest_table_name",
}
# Per-method values where the generic rule would be wrong.
OVERRIDES: dict[str, dict[str, Any]] = {
    "get_database": {"name": "DB"},
    "get_table_names_by_filter": {"filter": 'hive_filter_field_params__EXTERNAL = "FALSE"'},
    "get_config_value": {"name": "hive.metastore.batch.retrieve.max", "defaultValue": "300"},
    "getMetaConf": {"key": "hive.metastore.batch.retrieve.max"},
    "get_table_meta": {"db_patterns": "DB", "tbl_patterns": "*", "tbl_types": []},
    "get_functions": {"pattern": "*"},
    "get_function": {"funcName": "fn"},
    "getCpuProfile": {"profileDurationInSec": 0},
    "get_num_partitions_by_filter": {"filter": 'ds = "2024-01-01"'},
    "partition_name_has_valid_characters": {"throw_exception": False},
}


def _value(method: str, name: str, ttype: int, arg: Any, missing: bool, sample: Sample) -> Any:
    db = "no_such_db" if missing else sample.db
    table = "no_such_table" if missing else sample.table
    override = OVERRIDES.get(method, {})
    if name in override:
        value = override[name]
        return db if value == "DB" else value
    if name in DB_FIELDS:
        return db
    if name in TABLE_FIELDS:
        return table
    if name in ("part_vals", "partVals", "partValues", "partitionVals"):
        values = ["1900-01-01", "zz"] if missing else list(sample.partition_values)
        return dict(zip(("ds", "region"), values, strict=True)) if ttype == 13 else values
    if name in ("part_name", "partName"):
        return "ds=1900-01-01/region=zz" if missing else sample.partition_name
    if name in ("names", "partNames", "part_names", "partitionnames"):
        return (
            ["ds=1900-01-01/region=zz"]
            if missing
            else [*sample.partition_names[:3], "ds=1900-01-01/region=zz"]
        )
    if name in ("colNames", "col_names"):
        return ["amount", "item"]
    if name == "col_name":
        return "amount"
    if name in ("tbl_names", "tblNames"):
        return ["no_such_table"] if missing else [sample.table, sample.unpartitioned]
    if name == "filter":
        return 'ds = "1900-01-01"' if missing else 'ds = "2024-01-01"'
    if name in ("pattern", "tableNamePattern", "db_patterns", "tbl_patterns"):
        return "*"
    if name in ("user_name", "userName", "user", "principal_name", "token_owner"):
        return "alice"
    if name in ("group_names", "groupNames"):
        return ["analysts"]
    if name == "tableType":
        return "MANAGED_TABLE"
    if name == "funcName":
        return "fn"
    if ttype == 11:
        return "x"
    if ttype == 18:
        return b"\x00\x01"
    if ttype in (3, 6, 8, 10):
        return -1 if name.startswith("max") else 0
    if ttype == 2:
        return False
    if ttype == 4:
        return 0.0
    if ttype in (14, 15):
        return []
    if ttype == 13:
        return {}
    if ttype == 12:
        return build(arg, method, missing, sample)
    raise AssertionError((method, name, ttype))


def build(cls: Any, method: str, missing: bool, sample: Sample) -> Any:
    values = {}
    for field in cls.thrift_spec.values():
        ttype, name = field[0], field[1]
        arg = field[2] if len(field) == 4 else None
        if ttype == 8 and arg is not None:  # an enum: its first value
            values[name] = min(arg._VALUES_TO_NAMES)
            continue
        values[name] = _value(method, name, ttype, arg, missing, sample)
    return cls(**values)


def read_request(method: str, seqid: int, sample: Sample, *, missing: bool) -> bytes:
    args = build(idl.args_class(method), method, missing, sample)
    return encode_header(method, MessageType.CALL, seqid) + idl.encode(args)


def reads() -> list[str]:
    """Every read of the catalog that the IDL declares (Hive 4-only reads the proxy never
    decodes are not declared: there is nothing to build their arguments from)."""
    declared = set(idl.method_names())
    return sorted(
        s.name
        for s in catalog.all_methods()
        if s.kind in (Kind.CACHEABLE_READ, Kind.READ) and s.name in declared
    )
