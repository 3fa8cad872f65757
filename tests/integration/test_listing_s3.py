"""Listings of ``s3://`` (and ``s3a://``) partitions, against a local S3-compatible server
(moto's server mode, not AWS), reached through a relay that can slow it down."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.conftest import ProxyFactory
from tests.rig.faults import FaultyRelay
from tests.rig.hms import MetastoreServer
from tests.rig.listing import Listings, create_table
from tests.rig.proxy_process import ProxyProcess
from tests.rig.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.rig.sample import client
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

DB = "listing_s3"
BUCKET = "warehouse"
DAYS = ("2024-01-01", "2024-01-02")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture
def relay(s3: S3Server) -> Iterator[FaultyRelay]:
    r = FaultyRelay("127.0.0.1", s3.port).start()
    try:
        yield r
    finally:
        r.stop()


def s3_table(hms: MetastoreServer, s3: S3Server, name: str, scheme: str = "s3") -> None:
    """A table whose partitions live at ``<scheme>://warehouse/<name>/ds=...``."""
    objects = s3.client()
    for ds in DAYS:
        for leaf, body in (
            ("part-00000.parquet", b"x" * 123),
            ("part-00001.parquet", b"y" * 45),
            ("_SUCCESS", b""),
            (".part-00000.parquet.crc", b"c"),
            ("nested/part-00002.parquet", b"z" * 6),
        ):
            objects.put_object(Bucket=BUCKET, Key=f"{name}/ds={ds}/{leaf}", Body=body)
    create_table(hms.host, hms.port, DB, name, f"{scheme}://{BUCKET}/{name}", DAYS)


def s3_proxy(proxy_factory: ProxyFactory, endpoint_port: int, *args: str) -> ProxyProcess:
    return proxy_factory(
        "--seal-after",
        "0",
        "--notifications",
        "off",
        "--s3-endpoint-url",
        f"http://127.0.0.1:{endpoint_port}",
        "--s3-access-key",
        ACCESS_KEY,
        "--s3-secret-key",
        SECRET_KEY,
        "--s3-region",
        REGION,
        *args,
    )


def test_s3_listings_match_the_bucket_and_are_cached_when_sealed(
    hms: MetastoreServer, s3: S3Server, proxy_factory: ProxyFactory
) -> None:
    proxy = s3_proxy(proxy_factory, s3.port)
    api = Listings(proxy)
    s3_table(hms, s3, "events_s3a", scheme="s3a")
    listing = api.partition(DB, "events_s3a", DAYS[0])
    objects = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"events_s3a/ds={DAYS[0]}/")
    visible = {
        (f"s3a://{BUCKET}/{o['Key']}", o["Size"], int(o["LastModified"].timestamp() * 1000))
        for o in objects["Contents"]
        if "/" not in o["Key"].rsplit(f"ds={DAYS[0]}/", 1)[1]
        and not o["Key"].rsplit("/", 1)[1].startswith(("_", "."))
    }
    assert {(f.path, f.size, f.modification_time_ms) for f in listing.files} == visible
    assert len(visible) == 2 and not listing.from_cache and listing.sealed
    deep = api.partition(DB, "events_s3a", DAYS[0], recursive=True)
    assert sorted(f.path.rsplit("/", 1)[1] for f in deep.files) == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert api.partition(DB, "events_s3a", DAYS[0]).from_cache
    assert [p.from_cache for p in api.table(DB, "events_s3a")] == [True, False]
    assert api.splits(DB, "events_s3a").files == 4


def test_a_listing_in_flight_when_its_partition_changes_is_not_stored(
    hms: MetastoreServer,
    s3: S3Server,
    relay: FaultyRelay,
    proxy_factory: ProxyFactory,
) -> None:
    proxy = s3_proxy(proxy_factory, relay.port)
    api = Listings(proxy)
    s3_table(hms, s3, "events_slow")
    relay.hold_answers()  # S3's answers wait at the relay until the write is done
    got: list[object] = []
    lister = threading.Thread(target=lambda: got.append(api.partition(DB, "events_slow", DAYS[0])))
    lister.start()
    eventually(lambda: relay.held, what="the listing to wait on S3's answer")
    with client("127.0.0.1", proxy.port) as c:  # a writer changes the partition meanwhile
        part = c.get_partition(DB, "events_slow", [DAYS[0]])
        part.parameters["numFiles"] = "3"
        c.alter_partition(DB, "events_slow", part)
    relay.release_answers()
    lister.join(60)
    assert got and not lister.is_alive()
    assert proxy.metric("hmsproxy_listing_stale_fills_total") == 1
    assert proxy.metric("hmsproxy_listing_lookups_total", result="miss") == 1
    # Not stored: the next call lists again (and stores that one).
    assert not api.partition(DB, "events_slow", DAYS[0]).from_cache
    assert api.partition(DB, "events_slow", DAYS[0]).from_cache
    assert proxy.metric("hmsproxy_listing_stale_fills_total") == 1
