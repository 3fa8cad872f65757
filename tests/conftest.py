"""Fixtures: a real Hive Metastore (one per test session), real Redis servers, the proxy; a
Kerberos realm and Kerberized metastores (one each per test session, started when a test
first asks)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.rig import kdc, machine
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess, proxies_started
from tests.rig.redis_server import RedisCluster, RedisServer
from tests.rig.sample import Sample, create

# The fixtures that start a Hive Metastore (Java) or need one: a test that asks for any of
# them must carry the ``hms`` marker, so that ``-m "not hms"`` runs without Java (checked at
# collection, below).
HMS_FIXTURES = frozenset(
    {
        "hms",
        "own_hms",
        "sample",
        "proxy_factory",
        "proxy",
        "lock_hms",
        "lock_proxy_factory",
        "kerberos_hms",
        "privacy_hms",
    }
)

# The realm's principals: the metastore's and the proxy's services (keytabs), and two users
# (keytabs too, so kinit needs no typing; the passwords are for tests that want them).
SERVICES = ("hive/localhost", "proxy/localhost")
USERS = {"alice": "alice-pw", "bob": "bob-pw"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if HMS_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("hms") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests use a Hive Metastore fixture but lack the hms marker "
            "(pytestmark = pytest.mark.hms):\n  " + "\n  ".join(unmarked)
        )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Tests marked ``whole_machine`` run with no other test beside them (see
    tests.rig.machine: the suite runs in two processes). Around the whole of each test,
    the fixtures it starts and stops included (metastores, Redis clusters), and outside
    pytest-timeout's clock: a test's wait for its turn is not its own time."""
    with machine.turn(item.get_closest_marker("whole_machine") is not None):
        yield


@pytest.fixture(scope="session")
def hms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreServer]:
    with MetastoreServer(tmp_path_factory.mktemp("hms")) as server:
        yield server


@pytest.fixture(scope="session")
def sample(hms: MetastoreServer) -> Sample:
    return create(hms.host, hms.port, hms.warehouse.as_uri())


ProxyFactory = Callable[..., ProxyProcess]


# Redis operations of the tests' proxies may take a second, not the default 50 ms: on a loaded
# machine (CI with both cores busy) a slower one is answered from the metastore, as it should
# be, and a test asserting a hit fails. A test of the timeout itself gives its own, which
# wins (argparse: the last one given).
PATIENT = ("--redis-timeout", "1")


@pytest.fixture
def proxy_factory(tmp_path: Path, hms: MetastoreServer) -> Iterator[ProxyFactory]:
    with proxies_started(tmp_path) as started:

        def make(
            *args: str, upstream: str | None = None, env: dict[str, str] | None = None
        ) -> ProxyProcess:
            proc = ProxyProcess(tmp_path, upstream or hms.uri, *PATIENT, *args, env=env)
            started.append(proc.start())
            return proc

        yield make


@pytest.fixture(scope="session")
def lock_hms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreServer]:
    """A metastore that can grant locks, as Iceberg's commits need (the session's ``hms``
    cannot: see MetastoreServer). A lock not heartbeated dies after 5 s here (Hive: 300 s)."""
    with MetastoreServer(tmp_path_factory.mktemp("lock-hms"), locks=True, txn_timeout=5) as server:
        yield server


@pytest.fixture
def lock_proxy_factory(tmp_path: Path, lock_hms: MetastoreServer) -> Iterator[ProxyFactory]:
    """Proxies in front of ``lock_hms``."""
    with proxies_started(tmp_path) as started:

        def make(*args: str, env: dict[str, str] | None = None) -> ProxyProcess:
            proc = ProxyProcess(tmp_path, lock_hms.uri, *PATIENT, *args, env=env)
            started.append(proc.start())
            return proc

        yield make


@pytest.fixture
def proxy(proxy_factory: ProxyFactory) -> ProxyProcess:
    return proxy_factory()


@pytest.fixture
def own_hms(tmp_path: Path) -> Iterator[MetastoreServer]:
    """A metastore of this test's own (for tests that kill, stop or restart it; started
    again, it has the same port and Derby folder)."""
    with MetastoreServer(tmp_path / "own-hms") as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own (for tests that flush, fill or stop it; stopped, it can
    be started again on the same port)."""
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def realm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kdc.Realm]:
    """A fresh MIT realm (HMSPROXY.TEST) with ``SERVICES`` and ``USERS``. Its ``env`` is set
    in os.environ for the rest of the session, so that python-gssapi in the test process
    finds the realm (and child processes inherit it); nothing outside its folder is used."""
    missing = kdc.missing_commands()
    if missing:
        pytest.fail(kdc.MISSING.format(", ".join(missing)), pytrace=False)
    with kdc.Realm(tmp_path_factory.mktemp("realm")) as made:
        for service in SERVICES:
            made.add_service(service)
        for user, password in USERS.items():
            made.add_user(user, password)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in made.env.items():
                patch.setenv(key, value)
            yield made


@pytest.fixture(scope="session")
def kerberos_hms(
    tmp_path_factory: pytest.TempPathFactory, realm: kdc.Realm
) -> Iterator[MetastoreServer]:
    """A metastore in secure mode (SASL GSSAPI as hive/localhost, QOP ``auth``), with
    impersonation rights for ``proxy``; its URI says localhost."""
    with MetastoreServer(tmp_path_factory.mktemp("kerberos-hms"), kerberos=realm) as server:
        yield server


@pytest.fixture(scope="session")
def privacy_hms(
    tmp_path_factory: pytest.TempPathFactory, realm: kdc.Realm
) -> Iterator[MetastoreServer]:
    """As ``kerberos_hms``, with hadoop.rpc.protection=privacy: it offers only ``auth-conf``
    (every frame sealed), so a client or proxy that cannot encrypt is refused."""
    with MetastoreServer(
        tmp_path_factory.mktemp("privacy-hms"), kerberos=realm, protection="privacy"
    ) as server:
        yield server
