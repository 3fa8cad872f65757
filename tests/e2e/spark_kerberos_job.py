"""A real Spark session that reaches its metastore over SASL GSSAPI (Kerberos), as the user
whose ticket cache the environment names; prints what it saw as one JSON line.

    python -m tests.e2e.spark_kerberos_job URI WAREHOUSE DATABASE PRINCIPAL [PROTECTION]

PRINCIPAL is the service the client asks for: ``hive/_HOST@REALM`` straight to a Kerberized
metastore, ``proxy/_HOST@REALM`` through the proxy. The environment comes from
``tests.rig.spark.kerberos_env`` (KRB5CCNAME, HADOOP_CONF_DIR, KRB5_CONFIG).
"""

from __future__ import annotations

import json
import os
import sys

from tests.rig.spark import kerberos_conf, session


def main(uri: str, warehouse: str, db: str, principal: str, protection: str | None = None) -> None:
    conf = kerberos_conf(principal, os.environ["KRB5_CONFIG"], protection)
    spark = session(uri, warehouse, f"hms-cache-proxy-kerberos-{db}", conf)
    spark.sql(f"CREATE DATABASE {db}")
    spark.sql(
        f"CREATE TABLE {db}.events (id INT, name STRING) "
        "PARTITIONED BY (ds STRING) STORED AS PARQUET"
    )
    spark.sql(
        f"INSERT INTO {db}.events PARTITION (ds) VALUES "
        "(1, 'a', '2024-01-01'), (2, 'b', '2024-01-02'), (3, 'c', '2024-01-02')"
    )
    partitions = [r[0] for r in spark.sql(f"SHOW PARTITIONS {db}.events").collect()]
    count = spark.sql(f"SELECT count(*) FROM {db}.events WHERE ds = '2024-01-02'").collect()
    user = spark.sparkContext._jvm.org.apache.hadoop.security.UserGroupInformation
    print(
        "RESULT "
        + json.dumps(
            {
                "partitions": partitions,
                "count": count[0][0],
                # Who the client logged in as (from the ticket cache), and how.
                "user": user.getCurrentUser().getUserName(),
                "authentication": str(user.getCurrentUser().getAuthenticationMethod()),
            }
        ),
        flush=True,
    )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
