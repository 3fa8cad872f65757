"""A real Spark session running SQL steps against a metastore URI, pausing where told.

python spark_steps.py URI WAREHOUSE STEP...
A step is a SQL statement, or ``wait:PATH``: print ``READY`` and wait until PATH exists.
Prints ``DONE`` at the end. Hive-format (TEXTFILE) tables are written through Hive's own
load path, which tells the metastore about every partition it writes into.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession


def main(uri: str, warehouse: str, steps: list[str]) -> None:
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("hms-cache-proxy-steps")
        .config("spark.sql.catalogImplementation", "hive")
        .config("spark.hadoop.hive.metastore.uris", uri)
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .enableHiveSupport()
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql("SET hive.exec.dynamic.partition.mode=nonstrict")
    for step in steps:
        if step.startswith("wait:"):
            print("READY", flush=True)
            while not Path(step[len("wait:") :]).exists():
                time.sleep(0.1)
        else:
            spark.sql(step)
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
