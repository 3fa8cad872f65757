"""Old clients through the proxy to HMS 4.0.1 (simulated: tests/rig/hms4.py in front of the
real HMS 2.3.10, refusing get_table and get_table_objects_by_name as 4.0.1 does).

The simulation is shown faithful first (its refusal is 4.0.1's bytes, on a connection that
stays open; real clients pointed at it fail). Then, through the proxy: the bridged replies
are byte for byte what 2.3.10's own get_table / get_table_objects_by_name send (the same
Table bytes its _req forms carry), found or missing, cached and invalidated like any other;
and pyiceberg works end to end. The same runs against the real 4.0.1, with Spark, in
tests/integration/test_real_metastores*.py; this simulation stays for runs without the Maven
parts (``-m "not maven"``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.hive import HiveCatalog
from thrift.Thrift import TApplicationException

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.hms4 import REFUSAL_7, Hms401
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import Sample, client

pytestmark = pytest.mark.hms

M = idl.module()


def result(method: str, reply: bytes) -> object:
    """The decoded result of a raw reply to ``method`` (its header is 12 bytes and the name)."""
    return idl.decode_result(method, reply[12 + len(method) :])


@pytest.fixture
def hms401(hms: MetastoreServer) -> Iterator[Hms401]:
    with Hms401(hms.host, hms.port) as relay:
        yield relay


@pytest.fixture
def bridged(proxy_factory: ProxyFactory, hms401: Hms401) -> ProxyProcess:
    return proxy_factory(upstream=hms401.uri)


def test_the_simulation_refuses_as_hms_401_does_and_keeps_the_connection(
    hms401: Hms401, sample: Sample
) -> None:
    with raw.RawConnection("127.0.0.1", hms401.port) as conn:
        call = idl.encode_call("get_table", 7, dbname=sample.db, tbl_name=sample.table)
        assert conn.call(call) == REFUSAL_7
        databases = conn.call(idl.encode_call("get_all_databases", 8))
        assert sample.db in result("get_all_databases", databases).success  # type: ignore
    # A Hive 2.3-style client fails against it, as Spark and pyiceberg do against 4.0.1.
    refused = pytest.raises(TApplicationException, match="Invalid method name: 'get_table'")
    with client("127.0.0.1", hms401.port) as c, refused:
        c.get_table(sample.db, sample.table)


def test_bridged_replies_are_hive_23s_own_replies_byte_for_byte(
    hms: MetastoreServer, hms401: Hms401, bridged: ProxyProcess, sample: Sample
) -> None:
    requests = [
        idl.encode_call("get_table", 11, dbname=sample.db, tbl_name=sample.table),
        idl.encode_call("get_table", 12, dbname=sample.db, tbl_name="no_such_table"),
        idl.encode_call(
            "get_table_objects_by_name",
            13,
            dbname=sample.db,
            tbl_names=[sample.unpartitioned, "no_such_table", sample.table],
        ),
        idl.encode_call("get_table_objects_by_name", 14, dbname="no_such_db", tbl_names=["t"]),
    ]
    with raw.RawConnection("127.0.0.1", bridged.port) as conn:
        for request in requests:
            direct = raw.call(hms.host, hms.port, request)  # 2.3.10 still has both methods
            assert conn.call(request) == direct
            assert conn.call(request) == direct  # from the cache, with this seqid
    # Each removed method was refused once; then the proxy sent the _req forms only.
    assert dict(hms401.refused) == {"get_table": 1, "get_table_objects_by_name": 1}
    assert hms401.forwarded["get_table_req"] == 2
    # (A missing database is UnknownDBException, a declared exception: never cached.)
    assert hms401.forwarded["get_table_objects_by_name_req"] == 3
    assert bridged.metric("hmsproxy_bridged_calls_total", method="get_table") == 2
    assert bridged.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 1


def test_a_catalog_in_the_database_name_goes_as_cat_name(
    hms401: Hms401, bridged: ProxyProcess, sample: Sample
) -> None:
    request = idl.encode_call("get_table", 3, dbname=f"@hive#{sample.db}", tbl_name=sample.table)
    found = result("get_table", raw.call("127.0.0.1", bridged.port, request))
    assert found.success.tableName == sample.table  # type: ignore[attr-defined]


def test_a_write_through_the_proxy_invalidates_a_bridged_entry(
    bridged: ProxyProcess, sample: Sample
) -> None:
    with client("127.0.0.1", bridged.port) as c:
        before = c.get_table(sample.db, sample.unpartitioned)
        c.get_table(sample.db, sample.unpartitioned)  # cached now
        before.parameters = {**(before.parameters or {}), "bridge_probe": str(time.time())}
        c.alter_table(sample.db, sample.unpartitioned, before)
        after = c.get_table(sample.db, sample.unpartitioned)
        assert after.parameters["bridge_probe"] == before.parameters["bridge_probe"]
    assert bridged.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 1


# -- real clients ----------------------------------------------------------------------------


# Spark's built-in Hive 2.3 client against 4.0.1 runs against the real 4.0.1
# (tests/integration/test_real_metastores_engines.py), not this simulation.


def test_pyiceberg_runs_against_hms_401_through_the_proxy_only(
    lock_hms: MetastoreServer, tmp_path: Path
) -> None:
    """pyiceberg 0.12 (get_table in load, commit and rename; get_table_objects_by_name in
    list_tables), on a metastore that grants the locks its commits take."""
    schema = pa.schema([pa.field("tag", pa.string())])
    warehouse = lock_hms.warehouse.as_uri()
    with Hms401(lock_hms.host, lock_hms.port) as relay:
        direct = HiveCatalog("direct", uri=relay.uri, warehouse=warehouse)
        direct.create_namespace("ice401")  # a database call: 4.0.1 has it
        with pytest.raises(Exception, match="Invalid method name"):
            direct.create_table("ice401.refused", schema=schema)
        refused_directly = sum(relay.refused.values())
        relay.refused.clear()
        assert refused_directly >= 1
        proxy = ProxyProcess(tmp_path, relay.uri).start()
        try:
            through = HiveCatalog(
                "through", uri=f"thrift://127.0.0.1:{proxy.port}", warehouse=warehouse
            )
            table = through.create_table("ice401.events", schema=schema)
            for tag in ("a", "b"):
                table.append(pa.table({"tag": [tag]}, schema=schema))
            loaded = through.load_table("ice401.events")
            assert sorted(loaded.scan().to_arrow().column("tag").to_pylist()) == ["a", "b"]
            assert ("ice401", "events") in through.list_tables("ice401")
            assert relay.refused["get_table"] == 1
            assert relay.refused["get_table_objects_by_name"] == 1
            assert proxy.metric("hmsproxy_bridged_calls_total", method="get_table") >= 3
        finally:
            proxy.stop()
