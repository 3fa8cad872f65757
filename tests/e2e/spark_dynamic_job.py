"""Spark's dynamic-partition INSERT, in two phases with a pause between them.

python -m tests.e2e.spark_dynamic_job URI WAREHOUSE DATABASE GO_FILE
Phase 1 creates a Hive-format partitioned table with 8 partitions, prints READY and waits
for GO_FILE to exist; phase 2 inserts most rows into a new partition and one row into each
of three old ones, prints DONE.
"""

from __future__ import annotations

import sys

from tests.rig.spark import session, wait_for_go


def main(uri: str, warehouse: str, db: str, go: str) -> None:
    spark = session(uri, warehouse, "hms-cache-proxy-dynamic")
    spark.sql(f"CREATE DATABASE {db}")
    # TEXTFILE: Spark writes through Hive's loadDynamicPartitions, which alters existing
    # partitions (their file statistics) and adds new ones in the metastore.
    spark.sql(
        f"CREATE TABLE {db}.events (id INT, v STRING) PARTITIONED BY (ds STRING) STORED AS TEXTFILE"
    )
    rows = ", ".join(f"({i}, 'x', '2024-03-0{i}')" for i in range(1, 9))
    spark.sql(f"INSERT INTO {db}.events PARTITION (ds) VALUES {rows}")
    wait_for_go(go)
    many = ", ".join(f"({100 + i}, 'new', '2024-03-09')" for i in range(50))
    few = "(201, 'old', '2024-03-02'), (203, 'old', '2024-03-03'), (205, 'old', '2024-03-05')"
    spark.sql(f"INSERT INTO {db}.events PARTITION (ds) VALUES {many}, {few}")
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
