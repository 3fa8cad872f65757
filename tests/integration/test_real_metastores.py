"""The proxy in front of real Hive standalone metastores 3.1.3 and 4.0.1 (rig: hive_metastore.py).

Against each version: every read through the proxy is the metastore's own reply byte for byte,
first call and cached; on 4.0.1, which removed ``get_table`` and ``get_table_objects_by_name``,
old clients get through the proxy exactly the old reply shape around the Table bytes the real
4.0.1's ``_req`` forms send. Writes through the proxy are read back at once; writes straight at
the metastore (one by one, and ten at once) are seen through its real notification log within
a poll, on the embedded store and on Redis. pyiceberg commits through the proxy while another
writer commits around it, and no acknowledged commit is lost.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from hmsclient.genthrift.hive_metastore import ttypes as t
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TType

from proxy import idl
from proxy.wire.binary import MessageType, encode_header
from tests.rig import calls, raw
from tests.rig.calls import VOLATILE
from tests.rig.hive_metastore import HiveMetastore, removed
from tests.rig.hms4 import REFUSAL_7
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client, create, storage_descriptor, table
from tests.rig.waiting import eventually
from tests.rig.workload import alter_together

pytestmark = [pytest.mark.hms, pytest.mark.maven]

POLL = "0.3"


@pytest.fixture(scope="module")
def real_sample(real: HiveMetastore) -> Sample:
    return create(real.host, real.port, real.warehouse.as_uri())


# -- the bridge's expected bytes, cut from the real metastore's own _req replies ------------------


def _inner(reply: bytes, method: str, field_type: int) -> bytes:
    """The bytes of field 1 (of ``field_type``) of the struct in field 0 of a REPLY to
    ``method``: GetTableResult.table, GetTablesResult.tables."""
    body = reply[12 + len(method) :]
    assert reply[3] == MessageType.REPLY and body[:3] == b"\x0c\x00\x00", reply[:80]
    assert body[3:6] == bytes([field_type]) + b"\x00\x01", body[:10]
    cursor = raw.Cursor(body[6:])
    TBinaryProtocol(cursor).skip(field_type)
    return body[6 : 6 + cursor.pos]


def old_reply(real: HiveMetastore, method: str, request: bytes) -> bytes:
    """What an old client must get for ``request`` (get_table or get_table_objects_by_name):
    the metastore's own reply, or on 4.0.1 the reply of the ``_req`` form around the same
    Table bytes (a declared exception is the same struct under the same id in both)."""
    if not removed(real, method):
        return raw.call(real.host, real.port, request)
    seqid = raw.seqid_of(request)
    args = idl.decode_args(method, request[12 + len(method) :])
    if method == "get_table":
        req = M.GetTableRequest(dbName=args.dbname, tblName=args.tbl_name)
        kind = TType.STRUCT
    else:
        req = M.GetTablesRequest(dbName=args.dbname, tblNames=args.tbl_names)
        kind = TType.LIST
    new = raw.call(real.host, real.port, idl.encode_call(f"{method}_req", seqid, req=req))
    header = encode_header(method, MessageType.REPLY, seqid)
    if new[12 + len(method) + 4 : 12 + len(method) + 7] != b"\x0c\x00\x00":
        return header + new[12 + len(method) + 4 :]  # an exception: same ids, same bytes
    return header + bytes([kind]) + b"\x00\x00" + _inner(new, f"{method}_req", kind) + b"\x00"


M = idl.module()


# -- (a) byte identity ----------------------------------------------------------------------------


def test_every_read_is_byte_identical_first_call_and_cached(
    real: HiveMetastore, real_sample: Sample, proxies: Callable[..., ProxyProcess]
) -> None:
    requests = {
        (method, missing): calls.read_request(method, 1000 + i, real_sample, missing=missing)
        for i, method in enumerate(calls.reads())
        for missing in (False, True)
    }
    direct = {
        key: old_reply(real, key[0], r)
        if removed(real, key[0])
        else raw.call(real.host, real.port, r)
        for key, r in requests.items()
    }
    proxy = proxies()
    mismatched = []
    with raw.RawConnection("127.0.0.1", proxy.port) as conn:
        for key, request in requests.items():
            for _ in range(2):  # the second from the cache where the method is cached
                if direct[key] == raw.CLOSED:
                    reply = raw.call("127.0.0.1", proxy.port, request)
                else:
                    reply = conn.call(request)
                expected = direct[key]
                if key[0] in VOLATILE:
                    cut = 12 + len(key[0])
                    reply, expected = reply[:cut], expected[:cut]
                if reply != expected:
                    mismatched.append(key)
    assert mismatched == []
    closed = sorted(k for k, v in direct.items() if v == raw.CLOSED)
    assert len(closed) < 10, closed
    # The core reads were answered with values, and the second round came from the cache.
    for method in ("get_table", "get_partitions", "get_partitions_by_names"):
        assert direct[(method, False)][3] == MessageType.REPLY, method
        assert proxy.metric("hmsproxy_cache_lookups_total", method=method, result="hit") >= 1
    if real.version >= "4.0.1":
        assert proxy.metric("hmsproxy_bridged_calls_total", method="get_table") >= 1


def test_old_clients_get_tables_through_the_proxy(
    real: HiveMetastore, real_sample: Sample, proxies: Callable[..., ProxyProcess]
) -> None:
    """hmsclient (a Hive 2.x client) through the proxy: on 3.1.3 its calls pass as they are;
    the real 4.0.1 refuses them straight, and the proxy bridges them."""
    s = real_sample
    with client(real.host, real.port) as direct:
        if removed(real, "get_table"):
            with pytest.raises(TApplicationException, match="Invalid method name: 'get_table'"):
                direct.get_table(s.db, s.table)
            with pytest.raises(TApplicationException, match="Invalid method name"):
                direct.get_table_objects_by_name(s.db, [s.table])
        else:
            assert direct.get_table(s.db, s.table).tableName == s.table
    if removed(real, "get_table"):  # the simulation's refusal (tests/rig/hms4.py) is 4.0.1's
        with raw.RawConnection(real.host, real.port) as conn:
            call = idl.encode_call("get_table", 7, dbname=s.db, tbl_name=s.table)
            assert conn.call(call) == REFUSAL_7
            assert conn.call(idl.encode_call("get_all_databases", 8))[3] == MessageType.REPLY
    proxy = proxies()
    with client("127.0.0.1", proxy.port) as old:
        assert old.get_table(s.db, s.table).tableName == s.table
        found = old.get_table_objects_by_name(s.db, [s.unpartitioned, "no_such", s.table])
        assert sorted(x.tableName for x in found) == sorted([s.table, s.unpartitioned])
        with pytest.raises(t.NoSuchObjectException):
            old.get_table(s.db, "no_such_table")
    # A @catalog#db name (as Hive 3+ clients send) names the table too.
    request = idl.encode_call("get_table", 3, dbname=f"@hive#{s.db}", tbl_name=s.table)
    reply = raw.call("127.0.0.1", proxy.port, request)
    assert idl.decode_result("get_table", reply[21:]).success.tableName == s.table
    bridged = proxy.metric("hmsproxy_bridged_calls_total", method="get_table")
    assert bridged >= 1 if removed(real, "get_table") else bridged == 0


# -- (b) coherence ---------------------------------------------------------------------------------


def table_reads(s: Sample) -> list[tuple[str, bytes]]:
    table = {"db_name": s.db, "tbl_name": s.table}
    calls: list[tuple[str, dict[str, object]]] = [
        ("get_table", {"dbname": s.db, "tbl_name": s.table}),
        ("get_table_req", {"req": M.GetTableRequest(dbName=s.db, tblName=s.table)}),
        ("get_partition_names", {**table, "max_parts": -1}),
        ("get_partitions", {**table, "max_parts": -1}),
        ("get_partitions_by_names", {**table, "names": list(s.partition_names)}),
        ("get_partition", {**table, "part_vals": list(s.partition_values)}),
    ]
    return [(m, idl.encode_call(m, 1, **a)) for m, a in calls]


def fresh(real: HiveMetastore, proxy: ProxyProcess, s: Sample) -> bool:
    return all(
        raw.same_result(m, raw.call("127.0.0.1", proxy.port, r), old_reply(real, m, r))
        for m, r in table_reads(s)
    )


def get_table(real: HiveMetastore, c: object, db: str, name: str) -> t.Table:
    """The table, by get_table_req (every version has it; 4.0.1 has no get_table)."""
    return c.get_table_req(t.GetTableRequest(dbName=db, tblName=name)).table  # type: ignore[attr-defined]


def bypass_writes(real: HiveMetastore, s: Sample) -> Iterator[Callable[[], None]]:
    day = f"2030-01-{int(time.time() * 10) % 28 + 1:02d}"

    def add() -> None:
        with client(real.host, real.port) as c:
            part = c.get_partition_by_name(s.db, s.table, s.partition_name)
            part.values, part.sd.location = [day, "eu"], None
            c.add_partitions([part])

    def alter_partition() -> None:
        with client(real.host, real.port) as c:
            part = c.get_partition_by_name(s.db, s.table, s.partition_name)
            part.parameters["bypass"] = str(time.time())
            c.alter_partition(s.db, s.table, part)

    def alter_table() -> None:
        with client(real.host, real.port) as c:
            tbl = get_table(real, c, s.db, s.table)
            tbl.parameters["bypass"] = str(time.time())
            c.alter_table(s.db, s.table, tbl)

    def drop() -> None:
        with client(real.host, real.port) as c:
            c.drop_partition(s.db, s.table, [day, "eu"], True)

    yield from (add, alter_partition, alter_table, drop)


def test_a_write_through_the_proxy_is_read_back_at_once(
    real: HiveMetastore, real_sample: Sample, proxies: Callable[..., ProxyProcess]
) -> None:
    s = real_sample
    proxy = proxies("--ttl-table", "600")
    with client("127.0.0.1", proxy.port) as c:
        for i in range(3):
            before = c.get_table(s.db, s.unpartitioned)  # bridged on 4.0.1
            c.get_table(s.db, s.unpartitioned)  # cached now
            before.parameters["through"] = f"{i}-{uuid.uuid4().hex}"
            c.alter_table(s.db, s.unpartitioned, before)
            assert (
                c.get_table(s.db, s.unpartitioned).parameters["through"]
                == before.parameters["through"]
            )
    with client(real.host, real.port) as c:
        assert (
            get_table(real, c, s.db, s.unpartitioned).parameters["through"]
            == before.parameters["through"]
        )
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") >= 3


@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_writes_straight_at_the_metastore_are_seen_within_a_poll(
    store: str,
    real: HiveMetastore,
    real_sample: Sample,
    own_redis: RedisServer,
    proxies: Callable[..., ProxyProcess],
) -> None:
    args = ["--notification-poll", POLL, "--ttl-table", "600", "--ttl-partitions", "600"]
    proxy = proxies(*args, *(("--redis", own_redis.url) if store == "redis" else ()))
    for write in bypass_writes(real, real_sample):
        for _ in range(2):
            for _, request in table_reads(real_sample):
                raw.call("127.0.0.1", proxy.port, request)
        write()
        started = time.monotonic()
        # A poll (0.3 s here) and the reads that look, on a busy machine: one bound.
        eventually(lambda: fresh(real, proxy, real_sample), 3, f"{write.__name__} seen")
        print(f"{write.__name__}: seen {time.monotonic() - started:.2f} s after")
    seen = {
        dict(labels)["type"]
        for (name, labels), v in proxy.metrics().items()
        if name == "hmsproxy_notification_events_total" and v
    }
    assert {"ADD_PARTITION", "ALTER_PARTITION", "ALTER_TABLE", "DROP_PARTITION"} <= seen
    assert proxy.metric("hmsproxy_notification_gaps_total") == 0


# -- (c) ten writers at once --------------------------------------------------------------------


@pytest.mark.parametrize("store", ["redis", "embedded"])
def test_ten_concurrent_alters_straight_at_the_metastore_are_all_seen(
    store: str,
    real: HiveMetastore,
    real_sample: Sample,
    own_redis: RedisServer,
    proxies: Callable[..., ProxyProcess],
) -> None:
    db = f"concurrent_{uuid.uuid4().hex[:8]}"
    names = [f"t{i}" for i in range(10)]
    with client(real.host, real.port) as c:
        c.create_database(t.Database(db, "", None, {}))
        for n in names:
            c.create_table(
                table(db, n, storage_descriptor(f"{real.warehouse.as_uri()}/{db}.db/{n}"))
            )
        since = c.get_current_notificationEventId().eventId
    args = ["--notification-poll", POLL, "--ttl-table", "600"]
    proxy = proxies(*args, *(("--redis", own_redis.url) if store == "redis" else ()))
    for round_ in range(4):
        requests = {n: idl.encode_call("get_table", 1, dbname=db, tbl_name=n) for n in names}
        for _ in range(2):
            for r in requests.values():
                raw.call("127.0.0.1", proxy.port, r)
        mark = f"{round_}-{uuid.uuid4().hex}"
        read = lambda c, db, name: get_table(real, c, db, name)  # noqa: E731 - 4.0.1: no get_table
        acknowledged = alter_together(real, db, names, mark, read=read)
        assert sorted(acknowledged) == sorted(names)

        def all_fresh(requests: dict[str, bytes] = requests) -> bool:
            return all(
                raw.same_result(
                    "get_table",
                    raw.call("127.0.0.1", proxy.port, r),
                    old_reply(real, "get_table", r),
                )
                for r in requests.values()
            )

        eventually(all_fresh, 5, f"all ten writes seen through the proxy (round {round_})")
    with client(real.host, real.port) as c:
        events = c.get_next_notification(t.NotificationEventRequest(since, 10_000)).events
    # Every write was logged. (Their ids may repeat: 3.1.3's DbNotificationListener takes the
    # next id with SELECT ... FOR UPDATE, which its SQLGenerator leaves off on Derby, so on
    # Derby concurrent writes share ids, as on 2.3.10; the follower must cope either way.)
    assert sum(e.eventType == "ALTER_TABLE" for e in events) == 40
    assert proxy.metric("hmsproxy_notification_gaps_total") == 0
