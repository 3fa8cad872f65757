"""A small, known set of metastore objects, created straight at the HMS with ``hmsclient``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hmsclient import hmsclient
from hmsclient.genthrift.hive_metastore import ttypes as t

DB = "proxy_it"
PARTITIONED = "sales"
UNPARTITIONED = "dim"
DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")
REGIONS = ("eu", "us")
COLUMNS = (("item", "string"), ("amount", "bigint"))


@dataclass(frozen=True)
class Sample:
    db: str = DB
    table: str = PARTITIONED
    unpartitioned: str = UNPARTITIONED
    partition_values: tuple[str, ...] = (DAYS[0], REGIONS[0])
    partition_name: str = f"ds={DAYS[0]}/region={REGIONS[0]}"
    partition_names: tuple[str, ...] = tuple(f"ds={d}/region={r}" for d in DAYS for r in REGIONS)


# How a table's files are stored: (input format, output format, serde, serde parameters).
PARQUET = (
    "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
    "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
    "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe",
    {"serialization.format": "1"},
)
# What HMS 2.3.10's TransactionalValidationListener accepts for transactional=true: ORC (an
# ACID input and output format), bucketed (see ``bucketed``), in a managed table.
ORC = (
    "org.apache.hadoop.hive.ql.io.orc.OrcInputFormat",
    "org.apache.hadoop.hive.ql.io.orc.OrcOutputFormat",
    "org.apache.hadoop.hive.ql.io.orc.OrcSerde",
    {},
)
TEXT = (
    "org.apache.hadoop.mapred.TextInputFormat",
    "org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat",
    "org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe",
    {},
)

# The builders below take ``types``: hmsclient's ``ttypes`` (the default), or the proxy's
# thriftpy2 module (``idl.module()``), whose classes take the same arguments.


def storage_descriptor(
    location: str | None,
    columns: Sequence[tuple[str, str]] = COLUMNS,
    types: Any = t,
    stored_as: tuple[str, str, str, dict[str, str]] = PARQUET,
) -> Any:
    """A storage descriptor with ``(name, type)`` columns, stored as ``stored_as``."""
    input_format, output_format, serde, serde_parameters = stored_as
    return types.StorageDescriptor(
        cols=[types.FieldSchema(name, kind, None) for name, kind in columns],
        location=location,
        inputFormat=input_format,
        outputFormat=output_format,
        compressed=False,
        numBuckets=-1,
        serdeInfo=types.SerDeInfo(None, serde, dict(serde_parameters)),
        bucketCols=[],
        sortCols=[],
        parameters={},
    )


def bucketed(sd: Any, column: str, buckets: int) -> Any:
    """``sd`` clustered by ``column`` into ``buckets`` buckets."""
    sd.numBuckets = buckets
    sd.bucketCols = [column]
    return sd


def table(
    db: str,
    name: str,
    sd: Any,
    *,
    keys: Sequence[str] = (),
    parameters: dict[str, str] | None = None,
    table_type: str = "MANAGED_TABLE",
    owner: str = "rig",
    types: Any = t,
) -> Any:
    """A table partitioned by the string columns ``keys`` (none: unpartitioned)."""
    return types.Table(
        tableName=name,
        dbName=db,
        owner=owner,
        sd=sd,
        partitionKeys=[types.FieldSchema(key, "string", None) for key in keys],
        parameters=dict(parameters or {}),
        tableType=table_type,
    )


def partition(
    db: str,
    table_name: str,
    values: Sequence[str],
    sd: Any,
    parameters: dict[str, str] | None = None,
    types: Any = t,
) -> Any:
    return types.Partition(
        values=list(values),
        dbName=db,
        tableName=table_name,
        sd=sd,
        parameters=dict(parameters or {}),
    )


def client(
    host: str, port: int, *, framed: bool = False, timeout: float | None = None
) -> hmsclient.HMSClient:
    """An hmsclient; on the framed transport if the server wants it (hmsclient's default is
    not); with ``timeout`` (seconds), a call that gets no answer raises instead of hanging."""
    if not framed and timeout is None:
        return hmsclient.HMSClient(host=host, port=port)
    from thrift.protocol.TBinaryProtocol import TBinaryProtocol
    from thrift.transport.TSocket import TSocket
    from thrift.transport.TTransport import TBufferedTransport, TFramedTransport

    sock = TSocket(host, port)
    if timeout is not None:
        sock.setTimeout(timeout * 1000)
    transport = TFramedTransport(sock) if framed else TBufferedTransport(sock)
    return hmsclient.HMSClient(iprot=TBinaryProtocol(transport))


def create(host: str, port: int, warehouse: str, *, framed: bool = False, db: str = DB) -> Sample:
    """The sample objects in database ``db`` (made if it does not exist yet)."""
    sample = Sample(db=db)
    with client(host, port, framed=framed) as c:
        if db in c.get_all_databases():
            return sample
        c.create_database(t.Database(db, "test objects", f"{warehouse}/{db}.db", {}))
        c.create_table(
            table(
                db,
                PARTITIONED,
                storage_descriptor(f"{warehouse}/{db}.db/{PARTITIONED}"),
                keys=("ds", "region"),
                parameters={"EXTERNAL": "FALSE"},
            )
        )
        c.create_table(
            table(db, UNPARTITIONED, storage_descriptor(f"{warehouse}/{db}.db/{UNPARTITIONED}"))
        )
        parts = [
            partition(
                db,
                PARTITIONED,
                [d, r],
                storage_descriptor(f"{warehouse}/{db}.db/{PARTITIONED}/ds={d}/region={r}"),
                {"numRows": "10"},
            )
            for d in DAYS
            for r in REGIONS
        ]
        c.add_partitions(parts)
        stats = t.ColumnStatisticsObj(
            "amount",
            "bigint",
            t.ColumnStatisticsData(longStats=t.LongColumnStatsData(1, 99, 0, 10)),
        )
        c.update_table_column_statistics(
            t.ColumnStatistics(t.ColumnStatisticsDesc(True, db, UNPARTITIONED), [stats])
        )
        c.update_partition_column_statistics(
            t.ColumnStatistics(
                t.ColumnStatisticsDesc(False, db, PARTITIONED, sample.partition_name), [stats]
            )
        )
        c.create_function(
            t.Function(
                "fn", db, "org.example.Fn", "rig", t.PrincipalType.USER, 0, t.FunctionType.JAVA, []
            )
        )
    return sample


SLOW_TABLE = "slowread_table"


def create_slow_table(host: str, port: int, db: str = DB) -> str:
    """A table the rig's HMS takes three seconds to read (see CallerLog.java)."""
    with hmsclient.HMSClient(host=host, port=port) as c:
        if db not in c.get_all_databases():
            c.create_database(t.Database(db, "", None, {}))
        if SLOW_TABLE not in c.get_all_tables(db):
            c.create_table(table(db, SLOW_TABLE, storage_descriptor(None)))
    return SLOW_TABLE
