"""Fixtures of the integration tests against the real Hive metastores 3.1.3 and 4.0.1
(tests/rig/hive_metastore.py), shared by test_real_metastores.py and
test_real_metastores_engines.py: one metastore per version for each module, and the proxies
in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import PATIENT
from tests.rig.hive_metastore import VERSIONS, HiveMetastore
from tests.rig.proxy_process import ProxyProcess, proxies_started


@pytest.fixture(scope="module", params=VERSIONS)
def real(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HiveMetastore]:
    """One real metastore per version for the module; a lock not heartbeated dies after 5 s."""
    version = str(request.param)
    with HiveMetastore(version, tmp_path_factory.mktemp(f"hive-{version}"), txn_timeout=5) as m:
        yield m


@pytest.fixture
def proxies(tmp_path: Path, real: HiveMetastore) -> Iterator[Callable[..., ProxyProcess]]:
    with proxies_started(tmp_path) as started:

        def make(*args: str) -> ProxyProcess:
            proc = ProxyProcess(tmp_path, real.uri, *PATIENT, *args)
            started.append(proc.start())
            return proc

        yield make
