"""A real Presto 0.287 (tests/rig/presto.py) through the proxy: its Hive connector
(``hive-hadoop2``, catalog from docs/engines.md's Presto snippet) gives through the proxy what
it gives straight at the metastore, for issue 40's Hive checks.

One Presto for the module (it takes about 20 s to start on two cores), with two catalogs:
``hive_direct`` straight at the metastore, ``hive_proxy`` through a proxy on the embedded store.
Tables live on the moto S3 server, as in tests/e2e/test_trino.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import PATIENT
from tests.e2e.conftest import BUCKET
from tests.rig.hms import MetastoreServer
from tests.rig.presto import PrestoServer, hive_catalog, s3_files
from tests.rig.proxy_process import ProxyProcess
from tests.rig.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.rig.trino import results

pytestmark = [pytest.mark.hms, pytest.mark.maven, pytest.mark.presto]


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, hms: MetastoreServer, s3: S3Server
) -> Iterator[ProxyProcess]:
    listing = (
        "--s3-endpoint-url", s3.endpoint, "--s3-region", REGION,
        "--s3-access-key", ACCESS_KEY, "--s3-secret-key", SECRET_KEY,
    )  # fmt: skip
    started = ProxyProcess(tmp_path_factory.mktemp("proxy"), hms.uri, *PATIENT, *listing)
    try:
        yield started.start()
    finally:
        started.stop()


@pytest.fixture(scope="module")
def presto(
    tmp_path_factory: pytest.TempPathFactory,
    hms: MetastoreServer,
    proxy: ProxyProcess,
    s3: S3Server,
) -> Iterator[PrestoServer]:
    files = s3_files(s3.endpoint, ACCESS_KEY, SECRET_KEY)
    # Presto's default ("legacy") Hive security refuses ADD COLUMN and DROP TABLE unless told.
    allow = {"hive.allow-add-column": "true", "hive.allow-drop-table": "true"}
    catalogs = {
        "hive_direct": hive_catalog(hms.uri, files, **allow),
        "hive_proxy": hive_catalog(f"thrift://127.0.0.1:{proxy.port}", files, **allow),
    }
    with PrestoServer(tmp_path_factory.mktemp("presto"), catalogs) as server:
        print(f"Presto started in {server.started_in:.1f} s")
        yield server


def statements(catalog: str, schema: str) -> list[str]:
    """Issue 40's Hive checks as one sequence in ``catalog.schema``."""
    s = f"{catalog}.{schema}"
    return [
        f"CREATE SCHEMA {s} WITH (location = 's3://{BUCKET}/{catalog}/{schema}')",
        f"CREATE TABLE {s}.events (id bigint, name varchar, ds varchar)"
        " WITH (partitioned_by = ARRAY['ds'])",
        # Two new partitions, then one existing and one new.
        f"INSERT INTO {s}.events VALUES (1, 'a', '2024-01-01'), (2, 'b', '2024-01-02')",
        f"INSERT INTO {s}.events VALUES (3, 'c', '2024-01-01'), (4, 'd', '2024-01-03')",
        f"SELECT id, name FROM {s}.events WHERE ds = '2024-01-01' ORDER BY id",
        f'SELECT ds FROM {s}."events$partitions" ORDER BY ds',
        f"ANALYZE {s}.events",
        f"SHOW STATS FOR {s}.events",
        f"ALTER TABLE {s}.events ADD COLUMN note varchar",
        f"INSERT INTO {s}.events VALUES (5, 'e', 'new', '2024-01-02')",
        f"SELECT * FROM {s}.events ORDER BY id",
        f"DESCRIBE {s}.events",
        f"DROP TABLE {s}.events",
        f"SHOW TABLES FROM {s}",
        f"DROP SCHEMA {s}",
        f"SHOW SCHEMAS FROM {catalog} LIKE '{schema}'",
    ]


def run(presto: PrestoServer, catalog: str, schema: str) -> list[Any]:
    return results(presto, statements(catalog, schema), catalog, schema)


def test_statements_give_through_the_proxy_what_they_give_directly(
    presto: PrestoServer, proxy: ProxyProcess
) -> None:
    direct = run(presto, "hive_direct", "seq_direct")
    # What is compared is worth comparing: the pruned scan read its partition's two files
    # only, and the statements after ADD COLUMN see the new column.
    by_sql = dict(direct)
    pruned = "SELECT id, name FROM C.S.events WHERE ds = '2024-01-01' ORDER BY id"
    assert by_sql[pruned] == repr((["id", "name"], [[1, "a"], [3, "c"]], 2))
    assert "[5, 'e', 'new', '2024-01-02']" in by_sql["SELECT * FROM C.S.events ORDER BY id"]
    hits = proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit")
    assert run(presto, "hive_proxy", "seq_proxy") == direct
    # The proxy did cache: some of Presto's reads were answered from it.
    assert proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit") > hits
