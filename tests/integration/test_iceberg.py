"""Iceberg through the proxy, with the real pyiceberg (0.12, its Hive catalog, a file warehouse).

pyiceberg commits with ``lock`` -> ``get_table`` -> ``alter_table_with_environment_context``
-> ``unlock`` and checks its base against that ``get_table`` only; a cached answer older than
another writer's commit loses that commit without an error (measured before the lock fence:
every time without the notification log). Here one writer commits straight to the metastore
and one through the proxy, in the window (the proxy's writer holds a table loaded before the
other commit, which the cache holds too) and both at once in threads; every commit that
returned must be in the table read straight from the metastore.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import ProxyFactory
from tests.rig.hms import MetastoreServer
from tests.rig.iceberg_java import (
    CONCURRENT,
    FENCE_ONLY,
    ROUNDS,
    SCHEMA,
    _names,
    append,
    at_once,
    catalog,
    in_the_window,
    new_table,
    tags,
    through,
)
from tests.rig.redis_server import RedisServer
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms


@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_create_append_and_load_through_the_proxy(
    store: str,
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    proxy = lock_proxy_factory(*(("--redis", own_redis.url) if store == "redis" else ()))
    via = through(proxy, tmp_path)
    namespace = f"ice_{next(_names)}_{int(time.time() * 1000) % 100000}"
    via.create_namespace(namespace)
    via.create_table(f"{namespace}.t", schema=SCHEMA)
    acked: list[str] = []
    for i in range(3):
        append(via, f"{namespace}.t", f"row-{i}", acked)
    assert tags(via, f"{namespace}.t") == sorted(acked)
    assert tags(catalog(lock_hms.uri, tmp_path), f"{namespace}.t") == sorted(acked)
    assert len(via.load_table(f"{namespace}.t").snapshots()) == 3
    assert proxy.metric("hmsproxy_lock_fences_total", event="opened") == 3


@pytest.mark.parametrize("notifications", ["on", "off"])
@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_a_writer_around_the_proxy_loses_no_commit(
    store: str,
    notifications: str,
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    args = ["--notifications", notifications, "--notification-poll", "0.5", *FENCE_ONLY]
    if store == "redis":
        args += ["--redis", own_redis.url]
    proxy = lock_proxy_factory(*args)
    direct, via = catalog(lock_hms.uri, tmp_path), through(proxy, tmp_path)
    ident = new_table(direct)
    acked: list[str] = []
    in_the_window(direct, via, ident, acked)
    gave_up = at_once(
        [
            ("direct", lambda: catalog(lock_hms.uri, tmp_path)),
            ("proxy", lambda: through(proxy, tmp_path)),
        ],
        ident,
        acked,
    )
    assert tags(direct, ident) == sorted(acked)
    assert gave_up <= CONCURRENT  # contention may exhaust retries; it must not lose commits
    assert proxy.metric("hmsproxy_lock_fences_total", event="opened") >= ROUNDS


def test_the_defaults_lose_no_commit(
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    proxy = lock_proxy_factory("--redis", own_redis.url, "--notification-poll", "0.5")
    direct, via = catalog(lock_hms.uri, tmp_path), through(proxy, tmp_path)
    ident = new_table(direct)
    acked: list[str] = []
    in_the_window(direct, via, ident, acked)
    assert tags(direct, ident) == sorted(acked)


def test_without_fences_or_the_metastores_check_commits_are_lost(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """The sibling that shows the tests above can fail: the same window, nothing to stop it."""
    proxy = lock_proxy_factory("--notifications", "off", "--lock-fence-seconds", "0", *FENCE_ONLY)
    direct, via = catalog(lock_hms.uri, tmp_path), through(proxy, tmp_path)
    ident = new_table(direct)
    acked: list[str] = []
    in_the_window(direct, via, ident, acked)
    assert len(tags(direct, ident)) < len(acked)  # acknowledged commits vanished


def test_the_metastore_refuses_a_commit_on_a_stale_base(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """Without fences, the check the proxy adds (HIVE-26882, in HMS 2.3.10) turns the lost
    commit into an error the writer sees."""
    proxy = lock_proxy_factory(
        "--notifications", "off", "--lock-fence-seconds", "0", "--cache-iceberg-tables", "on"
    )
    direct, via = catalog(lock_hms.uri, tmp_path), through(proxy, tmp_path)
    ident = new_table(direct)
    acked: list[str] = []
    stale = via.load_table(ident)
    append(direct, ident, "direct", acked)
    with pytest.raises(Exception, match="The table has been modified"):
        stale.append(pa.table({"tag": ["proxy"]}, schema=SCHEMA))
    assert tags(direct, ident) == ["direct"]


def test_two_proxies_on_one_redis_one_writer_each(
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    args = ("--redis", own_redis.url, *FENCE_ONLY)
    a, b = lock_proxy_factory(*args), lock_proxy_factory(*args)
    direct = catalog(lock_hms.uri, tmp_path)
    ident = new_table(direct)
    acked: list[str] = []
    at_once(
        [("a", lambda: through(a, tmp_path)), ("b", lambda: through(b, tmp_path))], ident, acked
    )
    assert tags(direct, ident) == sorted(acked)
    assert acked


HOLDER = """
import sys, time
import pyarrow as pa
from hive_metastore.ThriftHiveMetastore import Client
from pyiceberg.catalog.hive import HiveCatalog

def hold(*args, **kwargs):
    print("holding the lock", flush=True)
    time.sleep(3600)

Client.alter_table_with_environment_context = hold  # stop between the read and the alter
table = HiveCatalog("k", uri=sys.argv[1], warehouse=sys.argv[3]).load_table(sys.argv[2])
table.append(pa.table({"tag": ["killed"]}, schema=pa.schema([pa.field("tag", pa.string())])))
"""


def test_a_writer_killed_holding_a_lock(
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    """A pyiceberg writer dies (SIGKILL) between its read and its alter: the metastore keeps
    its lock until hive.txn.timeout (5 s in the rig), the next writer through the proxy waits
    for it and commits; the dead writer's fence ends at its deadline; nothing is stale."""
    proxy = lock_proxy_factory("--redis", own_redis.url, "--lock-fence-seconds", "8", *FENCE_ONLY)
    uri = f"thrift://127.0.0.1:{proxy.port}"
    direct = catalog(lock_hms.uri, tmp_path)
    ident = new_table(direct)
    acked: list[str] = []
    append(direct, ident, "before", acked)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, uri, ident, tmp_path.as_uri()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert "holding the lock" in line, line + holder.stdout.read()
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    started = time.monotonic()
    patient = through(
        proxy, tmp_path, **{"lock-check-min-wait-time": "0.5", "lock-check-max-wait-time": "2"}
    )
    append(patient, ident, "after", acked)
    assert time.monotonic() - started > 2  # it waited for the dead writer's lock to be reaped
    assert tags(direct, ident) == sorted(acked)  # "killed" never returned: not acknowledged
    # Both fences are gone (the dead writer's ended with the next commit's alter, as its
    # lock had been granted; at the latest it would have at its 8 s deadline).
    assert proxy.metric("hmsproxy_lock_fences_total", event="opened") == 2
    eventually(lambda: proxy.metric("hmsproxy_lock_fences_active") == 0, 20)
    assert tags(patient, ident) == sorted(acked)


def test_readers_see_a_commit_made_elsewhere_within_a_poll(
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    proxy = lock_proxy_factory("--redis", own_redis.url, "--notification-poll", "0.5")
    direct, via = catalog(lock_hms.uri, tmp_path), through(proxy, tmp_path)
    ident = new_table(direct)
    for _ in range(3):
        via.load_table(ident)
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") > 0
    acked: list[str] = []
    append(direct, ident, "elsewhere", acked)
    committed = time.monotonic()
    eventually(lambda: len(via.load_table(ident).snapshots()) == 1, 10)
    assert time.monotonic() - committed < 3  # one poll (0.5 s) and the reader's own loads


def test_without_the_log_iceberg_tables_are_not_served_from_the_cache(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    proxy = lock_proxy_factory("--notifications", "off")
    direct, via = catalog(lock_hms.uri, tmp_path), through(proxy, tmp_path)
    ident = new_table(direct)
    for _ in range(3):
        via.load_table(ident)
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 0
    acked: list[str] = []
    append(direct, ident, "elsewhere", acked)
    assert len(via.load_table(ident).snapshots()) == 1  # at once


def test_alters_that_are_not_commits_pass_with_the_check_on(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    """The metastore's check is added to commits only: a rename, or an alter that copies the
    table's parameters as they are (the table's metadata_location and an older previous one),
    must pass as it would directly."""
    from tests.rig.locking import Endpoint

    proxy = lock_proxy_factory("--notifications", "off")  # the defaults otherwise
    via = through(proxy, tmp_path)
    ident = new_table(via)
    acked: list[str] = []
    for i in range(2):  # now metadata_location and previous_metadata_location differ
        append(via, ident, f"row-{i}", acked)
    namespace, name = ident.split(".")
    at = Endpoint("127.0.0.1", proxy.port)
    table = at.table(namespace, name)
    assert table.parameters["previous_metadata_location"] != table.parameters["metadata_location"]
    at.set_parameter(namespace, name, "owner_note", "changed by hand")  # asserts it passed
    via.rename_table(ident, f"{namespace}.renamed")
    assert tags(catalog(lock_hms.uri, tmp_path), f"{namespace}.renamed") == sorted(acked)
    append(via, f"{namespace}.renamed", "after", acked)  # and commits still work
    assert tags(catalog(lock_hms.uri, tmp_path), f"{namespace}.renamed") == sorted(acked)
