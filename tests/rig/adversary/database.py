"""The database the adversary works on: a few tables, some partitioned, each table and
partition with a counter ``v`` in its parameters; and how an object of it is named."""

from __future__ import annotations

from hmsclient.genthrift.hive_metastore import ttypes as t

from tests.rig.sample import client, partition, storage_descriptor, table

KEY = "ds"
VALUES = ("p0", "p1", "p2")
PARTITIONED = ("t0", "t1", "t2", "t3")
TABLES = (*PARTITIONED, "t4", "t5", "t6", "t7")

Obj = tuple[str, ...]  # (table,) or (table, partition name)


def pname(value: str) -> str:
    return f"{KEY}={value}"


def show(obj: Obj) -> str:
    return " ".join(obj)


def create(host: str, port: int, db: str) -> None:
    """The database, its tables and partitions, every counter at 0."""
    zero = {"v": "0"}
    with client(host, port) as c:
        c.create_database(t.Database(db, "adversary", None, {}))
        for name in TABLES:
            keys = (KEY,) if name in PARTITIONED else ()
            c.create_table(table(db, name, storage_descriptor(None), keys=keys, parameters=zero))
        for name in PARTITIONED:
            c.add_partitions(
                [partition(db, name, [v], storage_descriptor(None), zero) for v in VALUES]
            )
