"""A real Spark session (pyspark, local[1], Hive support) works through the proxy.

The same job runs twice, once against the HMS directly and once through the proxy (each in a
database of its own): CREATE DATABASE, CREATE TABLE ... PARTITIONED BY, a dynamic-partition
INSERT, SHOW PARTITIONS and a SELECT with a partition predicate must give the same results.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy import idl
from tests.rig import raw, spark
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.spark import run_job
from tests.rig.waiting import wait_for_follower

pytestmark = pytest.mark.hms


@pytest.mark.spark
def test_spark_sees_the_same_through_the_proxy(hms: MetastoreServer, proxy: ProxyProcess) -> None:
    direct = run_job(hms.uri, hms.warehouse, "spark_direct")
    through = run_job(f"thrift://127.0.0.1:{proxy.port}", hms.warehouse, "spark_proxied")
    assert through == direct
    assert direct["partitions"] == ["ds=2024-01-01", "ds=2024-01-02", "ds=2024-01-03"]
    assert direct["selected"] == [[2, "b", "2024-01-02"], [3, "c", "2024-01-02"]]
    assert direct["tables"] == ["events"]
    # Spark's own calls went through the proxy: DDL, the pruned read, the dynamic partitions.
    for method in (
        "create_database",
        "create_table_with_environment_context",
        "get_partitions_by_filter",
        "add_partitions_req",
    ):
        seen = sum(
            proxy.metric("hmsproxy_requests_total", method=method, outcome=o)
            for o in ("ok", "user_error")
        )
        assert seen >= 1, method


@pytest.mark.spark
def test_dynamic_partition_insert_keeps_untouched_partitions_cached(
    hms: MetastoreServer, proxy: ProxyProcess, tmp_path: Path
) -> None:
    db = "spark_dynamic"
    go = tmp_path / "go"
    uri = f"thrift://127.0.0.1:{proxy.port}"
    with spark.running("spark_dynamic_job", uri, hms.warehouse.as_uri(), db, str(go)) as job:
        spark.wait_ready(job)
        names = [f"ds=2024-03-0{i}" for i in range(1, 9)]
        by_names = idl.encode_call(
            "get_partitions_by_names", 1, db_name=db, tbl_name="events", names=names
        )
        # The notification follower also sees these writes (they went through this proxy,
        # so it invalidates them a second time): let it catch up before filling the cache.
        wait_for_follower(hms, proxy)
        raw.call("127.0.0.1", proxy.port, by_names)  # the cache now holds all eight
        go.touch()
        assert "DONE" in spark.finish(job, timeout=300)
        wait_for_follower(hms, proxy)
    everything = idl.encode_call(
        "get_partitions_by_names", 2, db_name=db, tbl_name="events", names=[*names, "ds=2024-03-09"]
    )
    hits = proxy.metric("hmsproxy_cache_partitions_total", result="hit")
    misses = proxy.metric("hmsproxy_cache_partitions_total", result="miss")
    through = raw.call("127.0.0.1", proxy.port, everything)
    # The four touched partitions are fresh. (Compared as values: the HMS writes a partition's
    # parameter map in an order that depends on which partitions are requested together, and
    # these four come from a smaller request than this one.)
    assert raw.same_result(
        "get_partitions_by_names", through, raw.call(hms.host, hms.port, everything)
    )
    # The five untouched partitions were still cached; only the four the INSERT wrote (three
    # altered, one new) had to be fetched.
    assert proxy.metric("hmsproxy_cache_partitions_total", result="hit") - hits == 5
    assert proxy.metric("hmsproxy_cache_partitions_total", result="miss") - misses == 4
