"""The listing API against a real HMS, real files, real Redis: what a walk of the directories
shows, cached when sealed, live when open, fresh after every kind of write; split plans."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from hmsclient.genthrift.hive_metastore import ttypes as t

from proxy.admin._gen import listing_pb2 as pb
from tests.conftest import ProxyFactory
from tests.rig.hms import MetastoreServer
from tests.rig.listing import Listings, alter_partition, create_table, files_of, walk, write
from tests.rig.proxy_process import REPO
from tests.rig.redis_server import RedisServer
from tests.rig.sample import client
from tests.rig.waiting import wait_for_follower

pytestmark = pytest.mark.hms

DB = "listing_it"
DAYS = ("2024-01-01", "2024-01-02")
_names = itertools.count()
MB = 1 << 20


def new_table(
    hms: MetastoreServer,
    tmp_path: Path,
    partitions: tuple[str, ...] = DAYS,
    parameters: dict[str, str] | None = None,
    **shape: Any,
) -> tuple[str, Path]:
    name = f"t{os.getpid()}_{next(_names)}"
    root = tmp_path / name
    root.mkdir()
    create_table(hms.host, hms.port, DB, name, root.as_uri(), partitions, parameters, **shape)
    return name, root


def test_listings_equal_a_walk_of_the_directories(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    proxy = proxy_factory("--seal-after", "0", "--notifications", "off")
    name, root = new_table(hms, tmp_path)
    for i, ds in enumerate(DAYS):
        part = root / f"ds={ds}"
        write(part, "part-00000.parquet", "part-00001.parquet", size=100 + i)
        write(part, "_SUCCESS", ".part-00000.parquet.crc", "_temporary/0/part-9", size=1)
        write(part, "bucket/part-00002.parquet", ".hive-staging/part-3", size=7)
    api = Listings(proxy)

    one = api.partition(DB, name, DAYS[0])
    assert files_of(one) == walk(root / f"ds={DAYS[0]}", recursive=False)
    assert {Path(f.path).name for f in one.files} == {"part-00000.parquet", "part-00001.parquet"}
    assert list(one.partition_values) == [DAYS[0]]
    deep = api.partition(DB, name, DAYS[0], recursive=True)
    assert files_of(deep) == walk(root / f"ds={DAYS[0]}", recursive=True)
    assert len(deep.files) == 3  # bucket/part-00002 too; nothing hidden

    whole = api.table(DB, name)
    assert [list(p.partition_values) for p in whole] == [[d] for d in DAYS]
    for listing, ds in zip(whole, DAYS, strict=True):
        assert files_of(listing) == walk(root / f"ds={ds}", recursive=False)
    only = api.table(DB, name, f'ds = "{DAYS[1]}"')
    assert [list(p.partition_values) for p in only] == [[DAYS[1]]]
    # Sealed (--seal-after 0): each directory came from storage once (recursive is another
    # listing), then from the cache.
    assert proxy.metric("hmsproxy_listing_files_total", source="storage") == 2 + 3 + 2
    assert proxy.metric("hmsproxy_listing_files_total", source="cache") == 2 + 2


def test_sealed_partitions_come_from_the_cache_and_open_ones_from_storage(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    # Just created, so altered less than an hour ago: open under the default rule; sealed
    # under --seal-after 0.
    open_proxy = proxy_factory()
    sealed_proxy = proxy_factory("--seal-after", "0")
    name, root = new_table(hms, tmp_path)
    # The follower applies the new table's events later, bumping its versions: a listing
    # cached before that is not found after it (CI saw it with both cores busy).
    wait_for_follower(hms, sealed_proxy)
    part = root / f"ds={DAYS[0]}"
    write(part, "a.parquet")

    live = Listings(open_proxy)
    first = live.partition(DB, name, DAYS[0])
    assert (first.sealed, first.from_cache) == (False, False)
    write(part, "b.parquet")
    second = live.partition(DB, name, DAYS[0])
    assert files_of(second) == walk(part, recursive=False)
    assert len(second.files) == 2 and not second.from_cache
    assert live.lookups("open") == 2 and live.lookups("hit") == 0

    cached = Listings(sealed_proxy)
    first = cached.partition(DB, name, DAYS[0])
    assert (first.sealed, first.from_cache) == (True, False)
    assert files_of(first) == walk(part, recursive=False)
    again = cached.partition(DB, name, DAYS[0])
    assert (again.sealed, again.from_cache) == (True, True)
    assert list(again.files) == list(first.files)
    # A file that appears in a sealed partition without the metastore hearing of it is not
    # seen until the listing expires: that is what sealed means.
    write(part, "c.parquet")
    assert cached.partition(DB, name, DAYS[0]).from_cache
    assert len(cached.partition(DB, name, DAYS[0]).files) == 2
    assert cached.lookups("miss") == 1 and cached.lookups("hit") == 3
    # A table listing finds the cached partition, and lists and stores the other.
    whole = cached.table(DB, name)
    assert [p.from_cache for p in whole] == [True, False]
    assert [p.from_cache for p in cached.table(DB, name)] == [True, True]
    assert sealed_proxy.metric("hmsproxy_listing_files_total", source="cache") >= 2 * 4


def test_a_transactional_tables_partitions_are_never_sealed(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    # HMS 2.3.10 takes transactional=true only on a managed, bucketed ORC table (its
    # TransactionalValidationListener; transactional_properties=insert_only is Hive 3's and
    # refused). Every partition is sealed under --seal-after 0, and with the marker.
    proxy = proxy_factory(
        "--seal-after", "0", "--seal-marker", "sealed=true", "--notifications", "off"
    )
    old = {"sealed": "true"}
    acid, acid_root = new_table(
        hms, tmp_path, DAYS, old, acid_shape=True, table_parameters={"TRANSACTIONAL": "TRUE"}
    )
    plain, plain_root = new_table(hms, tmp_path, DAYS, old, acid_shape=True)  # the control
    api = Listings(proxy)

    def commit(root: Path, n: int) -> None:
        """What an ACID write leaves: a new delta directory, and no metadata change."""
        write(root / f"ds={DAYS[0]}", f"delta_{n:07d}_{n:07d}_0000/bucket_00000")

    def listed(name: str) -> pb.FileListing:
        return api.partition(DB, name, DAYS[0], recursive=True)

    for root in (acid_root, plain_root):
        commit(root, 1)
    first = listed(acid)
    assert (first.sealed, first.from_cache, len(first.files)) == (False, False, 1)
    commit(acid_root, 2)
    second = listed(acid)
    assert (second.sealed, second.from_cache, len(second.files)) == (False, False, 2)
    assert files_of(second) == walk(acid_root / f"ds={DAYS[0]}", recursive=True)
    whole = api.table(DB, acid, recursive=True)
    assert [(p.sealed, p.from_cache) for p in whole] == [(False, False)] * len(DAYS)
    assert api.lookups("hit") == 0 and api.lookups("miss") == 0

    # The same table, not transactional: sealed, and the new delta unseen (from the cache).
    assert listed(plain).sealed
    commit(plain_root, 2)
    assert (listed(plain).from_cache, len(listed(plain).files)) == (True, 1)

    # Made transactional (ALTER TABLE ... SET TBLPROPERTIES): no partition changes, so its
    # cached listings are still current, yet the next listing is live.
    with client("127.0.0.1", proxy.port) as c:
        converted = c.get_table(DB, plain)
        converted.parameters["transactional"] = "true"
        c.alter_table(DB, plain, converted)
        assert c.get_table(DB, plain).parameters["transactional"] == "true"
    live = listed(plain)
    assert (live.sealed, live.from_cache, len(live.files)) == (False, False, 2)
    assert files_of(live) == walk(plain_root / f"ds={DAYS[0]}", recursive=True)


def test_writes_through_the_proxy_make_the_next_listing_fresh(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    # No follower: only the proxy's own write-through can invalidate.
    proxy = proxy_factory("--seal-after", "0", "--notifications", "off")
    name, root = new_table(hms, tmp_path)
    part = root / f"ds={DAYS[0]}"
    write(part, "a.parquet")
    api = Listings(proxy)

    def listed() -> tuple[int, bool]:
        api.partition(DB, name, DAYS[0])
        again = api.partition(DB, name, DAYS[0])
        return len(again.files), again.from_cache

    assert listed() == (1, True)
    write(part, "b.parquet")  # files land, then the writer tells the metastore:
    alter_partition("127.0.0.1", proxy.port, DB, name, DAYS[0], numFiles="2")
    fresh = api.partition(DB, name, DAYS[0])
    assert (len(fresh.files), fresh.from_cache) == (2, False)
    assert files_of(fresh) == walk(part, recursive=False)

    # An INSERT event (Hive with hive.metastore.dml.events) changes no metadata at all.
    assert listed() == (2, True)
    write(part, "c.parquet")
    with client("127.0.0.1", proxy.port) as c:
        c.fire_listener_event(
            t.FireEventRequest(
                successful=True,
                data=t.FireEventRequestData(
                    insertData=t.InsertEventRequestData(filesAdded=[str(part / "c.parquet")])
                ),
                dbName=DB,
                tableName=name,
                partitionVals=[DAYS[0]],
            )
        )
    assert api.partition(DB, name, DAYS[0]).from_cache is False
    assert len(api.partition(DB, name, DAYS[0]).files) == 3

    # Dropped and added again (INSERT OVERWRITE of an external table does this).
    assert listed() == (3, True)
    with client("127.0.0.1", proxy.port) as c:
        again = c.get_partition(DB, name, [DAYS[0]])
        c.drop_partition(DB, name, [DAYS[0]], False)  # external: the files stay
        (part / "a.parquet").unlink()
        c.add_partitions([again])
    fresh = api.partition(DB, name, DAYS[0])
    assert (len(fresh.files), fresh.from_cache) == (2, False)

    # The other partition was never touched: still cached throughout.
    api.partition(DB, name, DAYS[1])
    assert api.partition(DB, name, DAYS[1]).from_cache


def test_writes_at_the_metastore_reach_listings_through_the_notification_log(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    proxy = proxy_factory("--seal-after", "0", "--ttl-listings", "3600")
    name, root = new_table(hms, tmp_path)
    part = root / f"ds={DAYS[0]}"
    write(part, "a.parquet")
    api = Listings(proxy)
    wait_for_follower(hms, proxy)
    api.partition(DB, name, DAYS[0])
    assert api.partition(DB, name, DAYS[0]).from_cache

    write(part, "b.parquet")
    alter_partition(hms.host, hms.port, DB, name, DAYS[0], numFiles="2")  # behind its back
    wait_for_follower(hms, proxy)
    fresh = api.partition(DB, name, DAYS[0])
    assert (len(fresh.files), fresh.from_cache) == (2, False)
    assert files_of(fresh) == walk(part, recursive=False)


def test_the_sealed_rule_marker_parameter_and_marker_file(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    parameter_proxy = proxy_factory("--seal-marker", "sealed=true")
    by_parameter = Listings(parameter_proxy)
    name, root = new_table(hms, tmp_path)
    for ds in DAYS:
        write(root / f"ds={ds}", "a.parquet")
    alter_partition(hms.host, hms.port, DB, name, DAYS[0], sealed="true")
    # (The follower's invalidations of these writes come before the listings they would undo.)
    wait_for_follower(hms, parameter_proxy)
    by_parameter.partition(DB, name, DAYS[0])
    assert by_parameter.partition(DB, name, DAYS[0]).from_cache
    by_parameter.partition(DB, name, DAYS[1])
    unsealed = by_parameter.partition(DB, name, DAYS[1])
    assert (unsealed.sealed, unsealed.from_cache) == (False, False)

    file_proxy = proxy_factory("--seal-after", "0", "--seal-marker-file", "_SUCCESS")
    wait_for_follower(hms, file_proxy)
    by_file = Listings(file_proxy)
    first = by_file.partition(DB, name, DAYS[1])
    assert (first.sealed, first.from_cache) == (False, False)  # old enough, but no _SUCCESS
    assert not by_file.partition(DB, name, DAYS[1]).from_cache
    write(root / f"ds={DAYS[1]}", "_SUCCESS")
    committed = by_file.partition(DB, name, DAYS[1])
    assert (committed.sealed, committed.from_cache) == (True, False)
    assert by_file.partition(DB, name, DAYS[1]).from_cache
    assert by_file.lookups("open") == 2


def test_unpartitioned_tables_are_listed_live_and_bad_requests_are_refused(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    proxy = proxy_factory("--seal-after", "0")
    api = Listings(proxy)
    name, root = new_table(hms, tmp_path, partitions=())
    write(root, "a.orc")
    for expected in (1, 2):
        listing = api.partition(DB, name)
        assert (listing.sealed, listing.from_cache, len(listing.files)) == (False, False, expected)
        write(root, "b.orc")
    assert [len(p.files) for p in api.table(DB, name)] == [2]

    def refused(call: object) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as caught:
            call()  # type: ignore[operator]
        return caught.value.code()  # type: ignore[no-any-return]

    assert refused(lambda: api.partition(DB, name, "x")) == grpc.StatusCode.INVALID_ARGUMENT
    parted, _ = new_table(hms, tmp_path)
    assert refused(lambda: api.partition(DB, parted, "1999-01-01")) == grpc.StatusCode.NOT_FOUND
    assert refused(lambda: api.partition(DB, parted)) == grpc.StatusCode.INVALID_ARGUMENT
    assert refused(lambda: api.partition(DB, "no_such_table", "x")) == grpc.StatusCode.NOT_FOUND
    assert (
        refused(lambda: api.table(DB, parted, "nonsense ===")) == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert refused(lambda: api.splits(DB, parted, engine="hive")) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    # The proxy keeps serving after all that.
    assert api.partition(DB, name).files


def test_without_a_cache_every_listing_is_live(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    api = Listings(proxy_factory("--cache", "off", "--seal-after", "0"))
    name, root = new_table(hms, tmp_path)
    write(root / f"ds={DAYS[0]}", "a.parquet")
    for _ in range(2):
        listing = api.partition(DB, name, DAYS[0])
        assert (listing.sealed, listing.from_cache) == (True, False)


def test_proxies_sharing_redis_share_listings_and_their_invalidation(
    hms: MetastoreServer, own_redis: RedisServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    # A Redis operation may take a second here, not 50 ms: on a loaded machine a slower one
    # is answered live (fail open), and the hit asserted below would not be (CI saw it).
    args = ("--redis", own_redis.url, "--redis-timeout", "1")
    args += ("--seal-after", "0", "--notifications", "off")
    a, b = proxy_factory(*args), proxy_factory(*args)
    name, root = new_table(hms, tmp_path)
    part = root / f"ds={DAYS[0]}"
    write(part, "a.parquet")
    assert not Listings(a).partition(DB, name, DAYS[0]).from_cache
    assert Listings(b).partition(DB, name, DAYS[0]).from_cache  # filled by the other proxy
    write(part, "b.parquet")
    alter_partition("127.0.0.1", a.port, DB, name, DAYS[0], numFiles="2")  # through a
    fresh = Listings(b).partition(DB, name, DAYS[0])
    assert (len(fresh.files), fresh.from_cache) == (2, False)


def test_the_listing_api_takes_the_admin_token(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    proxy = proxy_factory("--admin-token-file", str(token))
    name, _root = new_table(hms, tmp_path)
    with pytest.raises(grpc.RpcError) as caught:
        Listings(proxy).partition(DB, name, DAYS[0])
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError):
        Listings(proxy, token="wrong").splits(DB, name)
    assert Listings(proxy, token="s3cret").partition(DB, name, DAYS[0]).location


def sparse(directory: Path, count: int, size: int) -> None:
    """``count`` files of ``size`` bytes that take no space (holes)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open(directory / f"part-{i:05d}", "wb") as f:
            f.truncate(size)


def test_split_plans_reproduce_the_worked_examples(
    hms: MetastoreServer, proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    proxy = proxy_factory()
    api = Listings(proxy)
    # 105 files of 50 MB: files take turns, so the first 105 splits (of the 200 of at most
    # 32 MB) halve every file, and the halves then fit whole: 210, as Trino 476 makes
    # (tests/e2e/test_trino.py).
    big, root = new_table(hms, tmp_path, partitions=("2021-01-01",))
    sparse(root / "ds=2021-01-01", 105, 50 * MB)
    plan = api.splits(DB, big)
    assert (plan.engine, plan.splits, plan.files, plan.partitions) == ("trino", 210, 105, 1)
    assert plan.small_files == 0
    # Spark packs 50 MB files two to a 128 MB task (50 + 4 MB open cost, twice, is 108 MB).
    assert api.splits(DB, big, engine="spark").splits == 53

    # 10,080 files of 500 KB over 12 days: one split per file.
    days = tuple(f"2021-01-{d:02d}" for d in range(1, 13))
    small, root = new_table(hms, tmp_path, partitions=days)
    for ds in days:
        sparse(root / f"ds={ds}", 840, 500 * 1024)
    plan = api.splits(DB, small)
    assert (plan.splits, plan.files, plan.partitions) == (10_080, 10_080, 12)
    assert plan.small_files == 10_080
    assert [b.files for b in plan.histogram if b.label == "< 1 MB"] == [10_080]
    # Each day's 410 MB compacts into 4 files: 48 files, 4 initial splits each.
    assert (plan.compacted_files, plan.compacted_splits) == (48, 48 * 4)
    within = api.splits(DB, small, partition_filter="ds >= '2021-01-03'")
    assert (within.splits, within.partitions) == (8_400, 10)

    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "splits",
            f"{DB}.{small}",
            "--where",
            "ds >= '2021-01-03'",
            "--admin",
            f"127.0.0.1:{proxy.admin_port}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "trino would make 8,400 splits" in shown.stdout
    assert "small files (under 32.0 MiB): 8,400 (100%)" in shown.stdout
    ls = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "ls",
            f"{DB}.{big}",
            "--partition",
            "ds=2021-01-01",
            "--admin",
            f"127.0.0.1:{proxy.admin_port}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert ls.returncode == 0, ls.stderr
    assert "105 files" in ls.stdout and "part-00104" in ls.stdout
