"""A real Spark session running SQL steps against a metastore URI, pausing where told.

python -m tests.e2e.spark_steps URI WAREHOUSE STEP...
A step is a SQL statement, or ``wait:PATH``: print ``READY`` and wait until PATH exists.
Prints ``DONE`` at the end. Hive-format (TEXTFILE) tables are written through Hive's own
load path, which tells the metastore about every partition it writes into.
"""

from __future__ import annotations

import sys

from tests.rig.spark import session, wait_for_go


def main(uri: str, warehouse: str, steps: list[str]) -> None:
    spark = session(uri, warehouse, "hms-cache-proxy-steps")
    for step in steps:
        if step.startswith("wait:"):
            wait_for_go(step[len("wait:") :])
        else:
            spark.sql(step)
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
