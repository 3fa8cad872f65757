"""A metastore that speaks the framed transport, behind a proxy clients reach unframed.

Hive can run its Thrift server framed (hive.metastore.thrift.framed.transport.enabled); the
proxy is then configured with --upstream-transport framed. Engines keep their default.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ProxyFactory
from tests.rig import calls, raw
from tests.rig.hms import MetastoreServer
from tests.rig.sample import Sample, create

pytestmark = pytest.mark.hms

READS = [
    "get_all_databases",
    "get_database",
    "get_table",
    "get_partition_names",
    "get_partitions",
    "get_partitions_by_names",
    "get_partitions_by_filter",
    "get_table_statistics_req",
    "get_fields",
]


@pytest.fixture(scope="module")
def framed_hms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreServer]:
    with MetastoreServer(tmp_path_factory.mktemp("framed-hms"), framed=True) as server:
        yield server


@pytest.mark.parametrize("client_transport", ["buffered", "framed"])
def test_reads_are_byte_identical_across_transports(
    framed_hms: MetastoreServer, proxy_factory: ProxyFactory, client_transport: str
) -> None:
    sample: Sample = create(
        framed_hms.host, framed_hms.port, framed_hms.warehouse.as_uri(), framed=True
    )
    proxy = proxy_factory(
        "--upstream-transport",
        "framed",
        "--client-transport",
        client_transport,
        upstream=framed_hms.uri,
    )
    with raw.RawConnection("127.0.0.1", proxy.port, framed=client_transport == "framed") as conn:
        for i, method in enumerate(READS):
            for missing in (False, True):
                request = calls.read_request(method, i, sample, missing=missing)
                direct = raw.call(framed_hms.host, framed_hms.port, request, framed=True)
                assert direct != raw.CLOSED
                assert conn.call(request) == direct, (method, missing)
