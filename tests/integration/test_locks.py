"""Reads inside an HMS lock are the metastore's answers (the lock fences), with raw Thrift calls.

A real metastore that grants locks (``lock_hms``), real proxies, real Redis. Writes that
bypass the proxy are made straight at the metastore with the notification log not followed,
so the proxy's cache is stale on purpose and only the fence can make the read inside a lock
fresh. The lock, the read, the alter and the unlock go over different connections, and in
the two-proxy cases through different proxies, as Java Iceberg's and Trino's pools send them.
"""

from __future__ import annotations

import itertools
import signal
import time
from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.rig.faults import FaultyRelay
from tests.rig.hms import MetastoreServer
from tests.rig.locking import ACQUIRED, SHARED_READ, WAITING, Endpoint, create_table, decode
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

OFF = ("--notifications", "off")
_names = itertools.count()


def fresh_table(hms: MetastoreServer) -> tuple[str, str]:
    db, table = f"locks_{next(_names)}_{int(time.time() * 1000) % 100000}", "events"
    create_table(Endpoint(hms.host, hms.port), hms.warehouse.as_uri(), db, table)
    return db, table


def at(proxy: ProxyProcess) -> Endpoint:
    return Endpoint("127.0.0.1", proxy.port)


def hits(proxies: list[ProxyProcess], method: str = "get_table") -> float:
    return sum(
        p.metric("hmsproxy_cache_lookups_total", method=method, result="hit") for p in proxies
    )


def fences(proxies: list[ProxyProcess], event: str) -> float:
    return sum(p.metric("hmsproxy_lock_fences_total", event=event) for p in proxies)


def two_proxies(
    make: ProxyFactory, redis: RedisServer | None, *extra: str
) -> tuple[ProxyProcess, ProxyProcess]:
    """Two proxies on one Redis; or, without Redis, one embedded proxy twice."""
    if redis is None:
        one = make(*OFF, *extra)
        return one, one
    args = ("--redis", redis.url, *OFF, *extra)
    return make(*args), make(*args)


def stale_cache(hms: Endpoint, proxy: Endpoint, db: str, table: str, value: str) -> None:
    """Cache the table through the proxy, then change it behind the proxy's back."""
    for _ in range(2):
        proxy.table(db, table)
    hms.set_parameter(db, table, "round", value)
    assert proxy.table(db, table).parameters["round"] != value, "the cache should be stale"


@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_a_read_inside_a_lock_is_the_metastores_answer(
    store: str, lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, own_redis: RedisServer
) -> None:
    a, b = two_proxies(lock_proxy_factory, own_redis if store == "redis" else None)
    hms, pa, pb = Endpoint(lock_hms.host, lock_hms.port), at(a), at(b)
    db, table = fresh_table(lock_hms)
    stale_cache(hms, pa, db, table, "1")

    lock = pa.lock(db, table)  # through proxy A; the read and the rest through B
    assert lock.state == ACQUIRED
    inside = pb.table_reply(db, table)
    assert inside == hms.table_reply(db, table)  # the HMS's own bytes, not the cached ones
    assert pb.table(db, table).parameters["round"] == "1"
    pb.set_parameter(db, table, "round", "2")  # the commit, as Iceberg's alter
    pb.unlock(lock.lockid)

    # The fence is gone: the table is cached again, and fresh.
    proxies = [a, b] if a is not b else [a]
    before = hits(proxies)
    for _ in range(2):
        assert pa.table_reply(db, table) == hms.table_reply(db, table)
        assert pb.table_reply(db, table) == hms.table_reply(db, table)
    assert hits(proxies) > before
    assert fences(proxies, "opened") == 1
    eventually(lambda: sum(p.metric("hmsproxy_lock_fences_active") for p in proxies) == 0)


@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_without_the_fence_the_read_inside_a_lock_is_stale(
    store: str, lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, own_redis: RedisServer
) -> None:
    """The sibling of the test above: with fences off the same sequence (on Redis, the lock
    through proxy A and the read through B) reads the cache, so that test can fail."""
    redis = own_redis if store == "redis" else None
    a, b = two_proxies(lock_proxy_factory, redis, "--lock-fence-seconds", "0")
    hms, pa, pb = Endpoint(lock_hms.host, lock_hms.port), at(a), at(b)
    db, table = fresh_table(lock_hms)
    stale_cache(hms, pa, db, table, "1")
    lock = pa.lock(db, table)
    assert lock.state == ACQUIRED
    assert pb.table(db, table).parameters["round"] == "0"  # stale: a commit would be lost
    pa.unlock(lock.lockid)


def test_a_waiting_lock_stays_fenced_until_granted(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, own_redis: RedisServer
) -> None:
    """A writer through the proxy waits behind one that bypasses it. An alter through the
    proxy while it waits does not end its fence (only a granted lock's): the bypassing
    holder commits after that, and the waiter, once granted, reads that commit."""
    a, b = two_proxies(lock_proxy_factory, own_redis)
    hms, pa, pb = Endpoint(lock_hms.host, lock_hms.port), at(a), at(b)
    db, table = fresh_table(lock_hms)
    stale_cache(hms, pb, db, table, "1")

    holder = hms.lock(db, table)
    assert holder.state == ACQUIRED
    waiter = pa.lock(db, table)
    assert waiter.state == WAITING
    assert pb.table(db, table).parameters["round"] == "1"  # fenced while waiting: fresh
    pb.set_parameter(db, table, "round", "2")  # an alter through the proxy meanwhile
    for _ in range(3):
        pb.table(db, table)  # would refill the cache with "2", were the fence ended
    hms.set_parameter(db, table, "round", "3")  # the holder's commit, around the proxy
    hms.unlock(holder.lockid)
    assert pb.check_lock(waiter.lockid).state == ACQUIRED
    assert pb.table(db, table).parameters["round"] == "3"
    pa.unlock(waiter.lockid)


def test_partition_and_database_components(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory
) -> None:
    """A partition's lock fences its table's object, not its partitions; a database's lock
    fences the database object and its table lists, not the tables in it."""
    proxy = lock_proxy_factory(*OFF)
    hms, p = Endpoint(lock_hms.host, lock_hms.port), at(proxy)
    db, table = fresh_table(lock_hms)
    stale_cache(hms, p, db, table, "1")
    names = ["ds=2024-01-01", "ds=2024-01-02"]
    for _ in range(2):
        p.call("get_partitions_by_names", db_name=db, tbl_name=table, names=names)

    lock = p.lock(db, table, partition="ds=2024-01-01", kind=SHARED_READ)
    assert lock.state == ACQUIRED
    assert p.table(db, table).parameters["round"] == "1"  # the table object: fresh
    before = hits([proxy], "get_partitions_by_names")
    p.call("get_partitions_by_names", db_name=db, tbl_name=table, names=names)
    assert hits([proxy], "get_partitions_by_names") == before + 1  # partitions: still cached
    p.unlock(lock.lockid)

    for _ in range(2):
        p.call("get_database", name=db)
    database = hms.call("get_database", name=db).success
    database.parameters = {"round": "changed"}  # (2.3 alters a database's parameters only)
    hms.call("alter_database", dbname=db, db=database)
    stale_cache(hms, p, db, table, "2")
    lock = p.lock(db)
    assert lock.state == ACQUIRED
    assert p.call("get_database", name=db).success.parameters["round"] == "changed"  # fresh
    assert p.table(db, table).parameters["round"] == "1"  # the table is not: cached
    p.unlock(lock.lockid)


def test_lock_and_transaction_calls_pass_through_untouched_and_never_flush(
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    relay = FaultyRelay(lock_hms.host, lock_hms.port, record=True).start()
    try:
        proxy = ProxyProcess(
            tmp_path_factory.mktemp("relayed"), f"thrift://127.0.0.1:{relay.port}", *OFF
        )
        proxy.start()
        try:
            _pass_through(lock_hms, proxy, relay)
        finally:
            proxy.stop()
    finally:
        relay.stop()


def _pass_through(lock_hms: MetastoreServer, proxy: ProxyProcess, relay: FaultyRelay) -> None:
    from proxy import idl

    m = idl.module()
    p = at(proxy)
    db, table = fresh_table(lock_hms)
    other_db, other = fresh_table(lock_hms)
    listing = {"db_name": other_db, "tbl_name": other, "max_parts": -1}
    for _ in range(2):
        p.raw("get_partitions", **listing)
    catalog_before = proxy.metric("hmsproxy_invalidations_total", scope="catalog", reason="write")
    sent: list[tuple[bytes, bytes]] = []  # (request, reply) as the client sent and got them

    def call(method: str, **args: object) -> Any:
        reply = p.raw(method, **args)
        sent.append((idl.encode_call(method, 7, **args), reply))
        return decode(method, reply)

    txn = call("open_txns", rqst=m.OpenTxnRequest(num_txns=1, user="rig", hostname="h")).success
    txnid = txn.txn_ids[0]
    component = m.LockComponent(type=3, level=2, dbname=db, tablename=table, operationType=3)
    locked = call("lock", rqst=m.LockRequest([component], txnid, "rig", "h", "agent")).success
    call("check_lock", rqst=m.CheckLockRequest(lockid=locked.lockid))
    call("heartbeat", ids=m.HeartbeatRequest(lockid=locked.lockid, txnid=txnid))
    call("show_locks", rqst=m.ShowLocksRequest(dbname=db))
    call("get_open_txns")
    call("commit_txn", rqst=m.CommitTxnRequest(txnid=txnid))
    plain = call("lock", rqst=m.LockRequest([component], None, "rig", "h")).success
    call("unlock", rqst=m.UnlockRequest(lockid=plain.lockid))
    call("unlock", rqst=m.UnlockRequest(lockid=plain.lockid))  # NoSuchLockException
    aborted = call("open_txns", rqst=m.OpenTxnRequest(num_txns=1, user="rig", hostname="h"))
    call("abort_txn", rqst=m.AbortTxnRequest(txnid=aborted.success.txn_ids[0]))

    # Both ways, the bytes the metastore got and sent are the client's (the seqid too: 7).
    for request, reply in sent:
        assert relay.carried(request, upward=True), request[:40]
        assert relay.carried(reply, upward=False), reply[:40]
    before = hits([proxy], "get_partitions")
    p.raw("get_partitions", **listing)
    assert hits([proxy], "get_partitions") == before + 1  # another table: still cached
    assert (
        proxy.metric("hmsproxy_invalidations_total", scope="catalog", reason="write")
        == catalog_before
    )
    # Both locks' fences ended: at commit_txn, and at unlock.
    eventually(lambda: proxy.metric("hmsproxy_lock_fences_total", event="closed") == 2)
    assert proxy.metric("hmsproxy_lock_fences_total", event="opened") == 2


def test_a_fence_whose_unlock_never_comes_ends_at_its_deadline(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory
) -> None:
    proxy = lock_proxy_factory(*OFF, "--lock-fence-seconds", "2")
    p = at(proxy)
    db, table = fresh_table(lock_hms)
    assert p.lock(db, table).state == ACQUIRED  # and the client goes away
    before = hits([proxy])
    p.table(db, table)
    p.table(db, table)
    assert hits([proxy]) == before  # fenced
    eventually(lambda: proxy.metric("hmsproxy_lock_fences_total", event="expired") == 1, 20)
    assert proxy.metric("hmsproxy_lock_fences_active") == 0
    p.table(db, table)
    p.table(db, table)
    assert hits([proxy]) > before


def test_a_proxy_killed_mid_commit_leaves_no_fence_past_its_bound_and_nothing_stale(
    lock_hms: MetastoreServer, lock_proxy_factory: ProxyFactory, own_redis: RedisServer
) -> None:
    a, b = two_proxies(lock_proxy_factory, own_redis, "--lock-fence-seconds", "3")
    hms, pa, pb = Endpoint(lock_hms.host, lock_hms.port), at(a), at(b)
    db, table = fresh_table(lock_hms)
    stale_cache(hms, pb, db, table, "1")
    lock = pa.lock(db, table)
    assert lock.state == ACQUIRED
    a.signal(signal.SIGKILL)
    a.wait(10)
    hms.set_parameter(db, table, "round", "2")  # the commit goes on without proxy A
    hms.unlock(lock.lockid)  # (the client's unlock took another way)
    started = time.monotonic()
    seen: list[tuple[float, bool]] = []

    def settled() -> bool:
        before = hits([b])
        reply = pb.table_reply(db, table)
        assert reply == hms.table_reply(db, table), "a read through B was stale"
        seen.append((time.monotonic() - started, hits([b]) > before))
        return seen[-1][1]

    eventually(settled, 15)
    # Hits resume once the dead proxy's fence passes its deadline, not much later.
    assert seen[-1][0] < 3 + 2, seen[-3:]
