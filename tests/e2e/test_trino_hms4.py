"""A real Trino 476 through the proxy in front of a real Hive metastore 4.0.1 (issue 40, item 3):
Trino's Hive connector runs tests/e2e/test_trino.py's statement sequence (CREATE SCHEMA and a
partitioned table, INSERTs into new and existing partitions, pruned SELECTs, ``"t$partitions"``,
ANALYZE, ADD COLUMN, RENAME, DROP) through the proxy and straight at the metastore, and every
result is the same; the proxy answered some of Trino's reads from its cache.

One metastore (tests/rig/hive_metastore.py; it takes ``s3://`` locations through the rig's
stand-in file system, tests/rig/java/ObjectStoreStub.java), one proxy on the embedded store
following the metastore's notification log, one Trino with two catalogs:

* ``hive_direct``: straight at the 4.0.1 metastore;
* ``hive_proxy``: through the proxy.

Tables live on the moto S3 server, as in tests/e2e/test_trino.py (see tests/rig/trino.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import PATIENT
from tests.rig.hive_metastore import HiveMetastore
from tests.rig.proxy_process import ProxyProcess, uri
from tests.rig.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.rig.trino import POLL, TrinoServer, direct_run, hive_catalog, run, s3_files

pytestmark = [pytest.mark.hms, pytest.mark.maven, pytest.mark.trino]

VERSION = "4.0.1"


@pytest.fixture(scope="module")
def hms4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HiveMetastore]:
    with HiveMetastore(VERSION, tmp_path_factory.mktemp(f"hive-{VERSION}")) as server:
        print(f"Hive metastore {VERSION} started in {server.started_in:.1f} s")
        yield server


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, hms4: HiveMetastore, s3: S3Server
) -> Iterator[ProxyProcess]:
    """On the embedded store, following the notification log, listing the S3 server's files."""
    started = ProxyProcess(
        tmp_path_factory.mktemp("proxy"), hms4.uri, *PATIENT,
        "--s3-endpoint-url", s3.endpoint, "--s3-region", REGION,
        "--s3-access-key", ACCESS_KEY, "--s3-secret-key", SECRET_KEY,
        "--notification-poll", str(POLL),
    )  # fmt: skip
    try:
        yield started.start()
    finally:
        started.stop()


@pytest.fixture(scope="module")
def trino(
    tmp_path_factory: pytest.TempPathFactory,
    hms4: HiveMetastore,
    proxy: ProxyProcess,
    s3: S3Server,
) -> Iterator[TrinoServer]:
    files = s3_files(s3.endpoint, ACCESS_KEY, SECRET_KEY, REGION)
    # External tables may be written to (the sequence's RENAME uses one).
    writes = {"hive.non-managed-table-writes-enabled": "true"}
    catalogs = {
        "hive_direct": hive_catalog(hms4.uri, files, **writes),
        "hive_proxy": hive_catalog(uri(proxy), files, **writes),
    }
    # Two catalogs and small tables: a smaller heap than test_trino.py's five catalogs get.
    with TrinoServer(tmp_path_factory.mktemp("trino"), catalogs, heap="512M") as server:
        print(f"Trino started in {server.started_in:.1f} s")
        yield server


@pytest.fixture(scope="module")
def direct_results(trino: TrinoServer, s3: S3Server) -> list[Any]:
    return direct_run(trino, s3)  # ADD COLUMN, ANALYZE and RENAME take effect on 4.0.1 too


def test_statements_give_through_the_proxy_what_they_give_directly_on_hive_4(
    trino: TrinoServer, s3: S3Server, proxy: ProxyProcess, direct_results: list[Any]
) -> None:
    hits = proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit")
    assert run(trino, s3, "hive_proxy", "seq_proxy") == direct_results
    # The proxy did cache: some of Trino's reads were answered from it.
    assert proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit") > hits
