"""A real Spark session against a metastore URI; prints what it saw as one JSON line.

One Spark session per process: python -m tests.e2e.spark_job URI WAREHOUSE DATABASE
"""

from __future__ import annotations

import json
import sys

from tests.rig.spark import session


def main(uri: str, warehouse: str, db: str) -> None:
    spark = session(uri, warehouse, f"hms-cache-proxy-e2e-{db}")
    spark.sql(f"CREATE DATABASE {db}")
    spark.sql(
        f"CREATE TABLE {db}.events (id INT, name STRING) "
        "PARTITIONED BY (ds STRING) STORED AS PARQUET"
    )
    spark.sql(
        f"INSERT INTO {db}.events PARTITION (ds) VALUES "
        "(1, 'a', '2024-01-01'), (2, 'b', '2024-01-02'), "
        "(3, 'c', '2024-01-02'), (4, 'd', '2024-01-03')"
    )
    partitions = [r[0] for r in spark.sql(f"SHOW PARTITIONS {db}.events").collect()]
    selected = spark.sql(
        f"SELECT id, name, ds FROM {db}.events WHERE ds = '2024-01-02' ORDER BY id"
    ).collect()
    databases = sorted(r[0] for r in spark.sql("SHOW DATABASES").collect())
    tables = [r.tableName for r in spark.sql(f"SHOW TABLES IN {db}").collect()]
    print(
        "RESULT "
        + json.dumps(
            {
                "partitions": partitions,
                "selected": [list(r) for r in selected],
                "has_database": db in databases,
                "tables": tables,
            }
        ),
        flush=True,
    )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
