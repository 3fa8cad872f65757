"""A table with very many partitions in the rig's Hive Metastore 2.3.10, made fast.

Through Thrift the rig's metastore on Derby adds about 80 partitions a second (add_partitions
in batches of 1,000: 5,000 took 63 s here), so 100,000 would take 21 minutes. Instead the
table and one partition are made through Thrift, the metastore is stopped, BulkPartitions.java
clones that partition straight in the Derby database (and advances DataNucleus's id
sequences past the clones), and the metastore is started again.

The table is partitioned by ``ds`` (a string) alone; partition ``i`` is ``ds=<i, 8 digits>``,
so names sort as numbers do. Its locations are under the table's but no folders are made.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from hmsclient.genthrift.hive_metastore import ttypes as t

from tests.rig import java
from tests.rig.hms import MetastoreServer
from tests.rig.sample import TEXT, client, partition, storage_descriptor, table

KEY = "ds"
DIGITS = 8
COLUMNS = (("id", "bigint"), ("item", "string"), ("amount", "double"))


@dataclass(frozen=True)
class BulkTable:
    """What :func:`make_partitioned_table` made: partitions ``name(0)`` to
    ``name(partitions - 1)``."""

    db: str
    table: str
    partitions: int

    @staticmethod
    def value(i: int) -> str:
        return f"{i:0{DIGITS}d}"

    @staticmethod
    def name(i: int) -> str:
        return f"{KEY}={BulkTable.value(i)}"


def make_partitioned_table(
    server: MetastoreServer, db: str, table_name: str, partitions: int, *, timeout: float = 900
) -> BulkTable:
    """``db.table_name`` with ``partitions`` partitions in ``server``, which is running on
    entry and on return (restarted in between: same port, same Derby folder). A table made
    before, in a Derby folder kept across runs, is taken as it is if it has ``partitions``
    partitions, and cloned if it has only the template (the cloning is one transaction: a
    run that failed left nothing else); any other number is an error. Plain metastores
    only: the Thrift calls here speak neither SASL nor TLS."""
    if partitions < 1 or partitions >= 10**DIGITS:
        raise ValueError(f"partitions: 1 to {10**DIGITS - 1}, not {partitions}")
    if server.kerberos is not None or server.keystore is not None:
        raise ValueError("a Kerberized or TLS metastore: not supported here")
    made = BulkTable(db, table_name, partitions)
    with client(server.host, server.port, framed=server.framed) as c:
        if db not in c.get_all_databases():
            c.create_database(t.Database(db, "", f"{server.warehouse.as_uri()}/{db}.db", {}))
        if table_name not in c.get_all_tables(db):
            location = f"{server.warehouse.as_uri()}/{db}.db/{table_name}"
            sd = storage_descriptor(location, COLUMNS, stored_as=TEXT)
            c.create_table(table(db, table_name, sd, keys=[KEY]))
            # The template: the table's columns, so it shares the table's column descriptor
            # (Hive's own partitions do), and so do its clones.
            sd = storage_descriptor(f"{location}/{made.name(0)}", COLUMNS, stored_as=TEXT)
            c.add_partitions([partition(db, table_name, [made.value(0)], sd, {"numRows": "10"})])
        # An empty filter counts them all (Hive 2.3's direct SQL, with no predicate).
        have = c.get_num_partitions_by_filter(db, table_name, "")
    if have == partitions:
        return made
    if have != 1:
        raise ValueError(f"{db}.{table_name} exists with {have} partitions, not {partitions}")
    # Stopped, so that Derby is not open in two processes (embedded: one at a time).
    server.stop()
    done = subprocess.run(
        [
            "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            # No syncs of Derby's log and checkpoints: only an OS crash mid-run could cost
            # the folder (a few seconds in 20 here).
            "-Dderby.system.durability=test",
            f"-Dderby.stream.error.file={server.workdir / 'derby-bulk.log'}",
            "-cp",
            java.classpath(java.compiled_helpers()),
            "hmsproxy.rig.BulkPartitions",
            str(server.workdir / "metastore_db"),
            db,
            table_name,
            str(partitions),
            str(DIGITS),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=server.workdir,
    )
    if done.returncode != 0:
        raise RuntimeError(f"BulkPartitions failed ({done.returncode}):\n{done.stderr}")
    server.start()
    return made
