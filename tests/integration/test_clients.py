"""Independent Python clients work through the proxy as they do against the HMS."""

from __future__ import annotations

import pytest
from hmsclient import hmsclient
from hmsclient.genthrift.hive_metastore import ttypes as t
from pymetastore.metastore import HMS

from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import Sample

pytestmark = pytest.mark.hms


def _hmsclient_view(port: int, sample: Sample) -> dict[str, object]:
    with hmsclient.HMSClient(host="127.0.0.1", port=port) as c:
        missing = None
        try:
            c.get_table(sample.db, "no_such_table")
        except t.NoSuchObjectException as exc:
            missing = exc.message
        return {
            "databases": c.get_all_databases(),
            "tables": sorted(c.get_all_tables(sample.db)),
            "table": c.get_table(sample.db, sample.table),
            "names": c.get_partition_names(sample.db, sample.table, -1),
            "by_names": c.get_partitions_by_names(
                sample.db, sample.table, list(sample.partition_names)
            ),
            "filtered": c.get_partitions_by_filter(sample.db, sample.table, 'region = "us"', -1),
            "stats": c.get_table_statistics_req(
                t.TableStatsRequest(sample.db, sample.unpartitioned, ["amount"])
            ),
            "missing": missing,
        }


def test_hmsclient_sees_the_same_metastore(
    hms: MetastoreServer, proxy: ProxyProcess, sample: Sample
) -> None:
    direct = _hmsclient_view(hms.port, sample)
    through = _hmsclient_view(proxy.port, sample)
    assert through == direct
    assert direct["missing"] and len(direct["names"]) == 6  # type: ignore[arg-type]


def _pymetastore_view(port: int, sample: Sample) -> dict[str, object]:
    with HMS.create(host="127.0.0.1", port=port) as hms:
        table = hms.get_table(sample.db, sample.table)
        return {
            "databases": hms.list_databases(),
            "tables": sorted(hms.list_tables(sample.db)),
            "columns": [c.name for c in table.columns],
            "partition_keys": [c.name for c in table.partition_columns],
            "partitions": sorted(hms.list_partitions(sample.db, sample.table)),
            # pymetastore's get_partition(s) asserts Hive 3's catName, which a 2.3 server
            # leaves unset: it fails the same way directly, so it is left out here.
        }


def test_pymetastore_sees_the_same_metastore(
    hms: MetastoreServer, proxy: ProxyProcess, sample: Sample
) -> None:
    direct = _pymetastore_view(hms.port, sample)
    assert _pymetastore_view(proxy.port, sample) == direct
    assert direct["partition_keys"] == ["ds", "region"]


def test_a_write_through_the_proxy_is_real(
    hms: MetastoreServer, proxy: ProxyProcess, sample: Sample
) -> None:
    with hmsclient.HMSClient(host="127.0.0.1", port=proxy.port) as c:
        c.create_database(
            t.Database("proxy_written", "", f"{hms.warehouse.as_uri()}/proxy_written.db", {})
        )
    with hmsclient.HMSClient(host="127.0.0.1", port=hms.port) as c:
        assert c.get_database("proxy_written").name == "proxy_written"
        c.drop_database("proxy_written", True, True)
