"""Raw Thrift lock calls and table reads for the lock-fence tests, over one connection each.

Java Iceberg and Trino send ``lock``, the read inside it, the ``alter_table`` and ``unlock`` on
different pooled connections; these helpers open a new connection for every call unless one
is given, so tests do the same.
"""

from __future__ import annotations

from typing import Any

from proxy import idl
from tests.rig import raw

EXCLUSIVE, SHARED_READ = 3, 1
LEVEL_DB, LEVEL_TABLE, LEVEL_PARTITION = 1, 2, 3
ACQUIRED, WAITING = 1, 2
OPERATION_UPDATE = 3  # DataOperationType.UPDATE


class Endpoint:
    """Somewhere to send calls: a metastore or a proxy, by host and port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def call(self, method: str, **args: Any) -> Any:
        """Call ``method`` on a new connection; its decoded result."""
        return decode(method, self.raw(method, **args))

    def raw(self, method: str, **args: Any) -> bytes:
        reply = raw.call(self.host, self.port, idl.encode_call(method, 7, **args))
        assert reply != raw.CLOSED, f"{method}: connection closed without a reply"
        return reply

    # -- locks -----------------------------------------------------------------------------

    def lock(
        self,
        db: str,
        table: str | None = None,
        *,
        partition: str | None = None,
        kind: int = EXCLUSIVE,
        txnid: int | None = None,
    ) -> Any:
        level = LEVEL_PARTITION if partition else LEVEL_TABLE if table else LEVEL_DB
        m = idl.module()
        component = m.LockComponent(
            type=kind,
            level=level,
            dbname=db,
            tablename=table,
            partitionname=partition,
            operationType=OPERATION_UPDATE,
        )
        request = m.LockRequest(
            component=[component], txnid=txnid, user="rig", hostname="localhost"
        )
        return self.call("lock", rqst=request).success

    def check_lock(self, lockid: int) -> Any:
        return self.call("check_lock", rqst=idl.module().CheckLockRequest(lockid=lockid)).success

    def unlock(self, lockid: int) -> Any:
        return self.call("unlock", rqst=idl.module().UnlockRequest(lockid=lockid))

    # -- tables ----------------------------------------------------------------------------

    def table(self, db: str, table: str) -> Any:
        return self.call("get_table", dbname=db, tbl_name=table).success

    def table_reply(self, db: str, table: str) -> bytes:
        return raw.without_seqid(self.raw("get_table", dbname=db, tbl_name=table))

    def set_parameter(self, db: str, table: str, key: str, value: str) -> None:
        """A read-modify-write of the table's parameters, as Iceberg's commit is."""
        current = self.table(db, table)
        current.parameters[key] = value
        result = self.call(
            "alter_table_with_environment_context",
            dbname=db,
            tbl_name=table,
            new_tbl=current,
            environment_context=idl.module().EnvironmentContext(properties={}),
        )
        assert result.o1 is None and result.o2 is None, result


def decode(method: str, reply: bytes) -> Any:
    return idl.decode_result(method, reply[12 + len(method) :])


def create_table(hms: Endpoint, warehouse: str, db: str, *tables: str) -> None:
    from tests.rig.sample import partition, storage_descriptor, table

    m = idl.module()
    if db not in (hms.call("get_all_databases").success or []):
        hms.call("create_database", database=m.Database(db, "", f"{warehouse}/{db}.db", {}))
    for name in tables:
        location = f"{warehouse}/{db}.db/{name}"
        sd = storage_descriptor(location, types=m)
        hms.call(
            "create_table",
            tbl=table(db, name, sd, keys=("ds",), parameters={"round": "0"}, types=m),
        )
        hms.call(
            "add_partitions",
            new_parts=[
                partition(
                    db, name, [day], storage_descriptor(f"{location}/ds={day}", types=m), types=m
                )
                for day in ("2024-01-01", "2024-01-02")
            ],
        )
