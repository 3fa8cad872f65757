"""The metastore misbehaving: down, silent, dropping pooled connections, killed mid-call.

Clients always get a Thrift error promptly (never a hang), the proxy recovers by itself,
reads on a stale pooled connection are retried once, writes never are.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest
from hmsclient import hmsclient

from proxy import idl
from proxy.wire.binary import MessageType
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.faults import FaultyRelay
from tests.rig.hms import MetastoreServer
from tests.rig.ports import free_port
from tests.rig.proxy_process import NOT_SERVING, SERVING, ProxyProcess, health
from tests.rig.raw import _application_exception
from tests.rig.sample import Sample, create_slow_table
from tests.rig.waiting import eventually, wait_for_slow_call

pytestmark = pytest.mark.hms


def _get_db(port: int, name: str, seqid: int = 1) -> bytes:
    return raw.call("127.0.0.1", port, idl.encode_call("get_database", seqid, name=name))


def _refused(port: int) -> bool:
    """Whether a connection to ``port`` is refused (nothing listens there)."""
    try:
        raw.RawConnection("127.0.0.1", port).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def relay(hms: MetastoreServer) -> Iterator[FaultyRelay]:
    r = FaultyRelay(hms.host, hms.port).start()
    yield r
    r.stop()


def test_unreachable_metastore_gives_a_prompt_thrift_error(proxy_factory: ProxyFactory) -> None:
    proxy = proxy_factory(upstream=f"thrift://127.0.0.1:{free_port()}")
    started = time.monotonic()
    exc = _application_exception(_get_db(proxy.port, "default"))
    assert time.monotonic() - started < 5
    assert "no metastore reachable" in exc.message
    assert (
        proxy.metric("hmsproxy_requests_total", method="get_database", outcome="upstream_error")
        == 1
    )


def test_fails_over_to_the_next_uri(
    proxy_factory: ProxyFactory, hms: MetastoreServer, sample: Sample
) -> None:
    proxy = proxy_factory("--cache", "off", upstream=f"thrift://127.0.0.1:{free_port()},{hms.uri}")
    assert _get_db(proxy.port, sample.db)[3] == MessageType.REPLY
    failed = proxy.metric("hmsproxy_upstream_connects_total", result="failed")
    assert failed >= 1  # the dead endpoint was tried (at start-up, or by the first call)
    for seqid in range(3):
        assert _get_db(proxy.port, sample.db, seqid)[3] == MessageType.REPLY
    # ... and then passed over while it stays in backoff.
    assert proxy.metric("hmsproxy_upstream_connects_total", result="failed") == failed


def test_a_silent_metastore_times_out(
    proxy_factory: ProxyFactory, relay: FaultyRelay, sample: Sample
) -> None:
    proxy = proxy_factory(
        "--upstream-read-timeout", "1", upstream=f"thrift://127.0.0.1:{relay.port}"
    )
    relay.blackhole = True
    started = time.monotonic()
    exc = _application_exception(_get_db(proxy.port, sample.db))
    assert time.monotonic() - started < 10
    assert "sent nothing for 1 s" in exc.message
    relay.blackhole = False
    assert _get_db(proxy.port, sample.db)[3] == MessageType.REPLY  # recovered by itself


def test_a_read_on_a_stale_pooled_connection_is_retried(
    proxy_factory: ProxyFactory, relay: FaultyRelay, sample: Sample
) -> None:
    # Without the cache, so that the second read has to use the pooled connection.
    proxy = proxy_factory("--cache", "off", upstream=f"thrift://127.0.0.1:{relay.port}")
    direct = _get_db(proxy.port, sample.db)
    opened = relay.connections  # the call's, and the readiness probe's (one pooled connection)
    assert relay.drop_idle_connections_silently() >= 1
    assert _get_db(proxy.port, sample.db) == direct
    assert relay.connections == opened + 1  # one fresh connection for the retry
    assert "stale, retrying get_database" in proxy.log()


def test_a_write_on_a_stale_connection_is_not_retried(
    proxy_factory: ProxyFactory, relay: FaultyRelay, hms: MetastoreServer, sample: Sample
) -> None:
    proxy = proxy_factory("--notifications", "off", upstream=f"thrift://127.0.0.1:{relay.port}")
    _get_db(proxy.port, sample.db)  # leaves a pooled connection
    relay.drop_idle_connections_silently()
    opened = relay.connections
    m = idl.module()
    create = idl.encode_call(
        "create_database", 2, database=m.Database(name="never_created", parameters={})
    )
    assert raw.call("127.0.0.1", proxy.port, create) == raw.CLOSED
    with hmsclient.HMSClient(host=hms.host, port=hms.port) as c:
        assert "never_created" not in c.get_all_databases()
    assert relay.connections == opened  # no second attempt


def test_metastore_killed_mid_call(own_hms: MetastoreServer, proxy_factory: ProxyFactory) -> None:
    slow = create_slow_table(own_hms.host, own_hms.port)
    proxy = proxy_factory(upstream=own_hms.uri)
    outcome: dict[str, object] = {}

    def call() -> None:
        started = time.monotonic()
        request = idl.encode_call("get_table", 1, dbname="proxy_it", tbl_name=slow)
        outcome["reply"] = raw.call("127.0.0.1", proxy.port, request)
        outcome["seconds"] = time.monotonic() - started

    caller = threading.Thread(target=call)
    before = own_hms.slow_calls_started()
    caller.start()
    wait_for_slow_call(own_hms, before)  # the HMS is now inside the three-second read
    own_hms.kill()
    caller.join(30)
    assert not caller.is_alive()
    # As a direct client would see it (the connection ends), or, when the call went out
    # on a pooled connection the proxy then retried, a Thrift error for the dead HMS.
    reply = outcome["reply"]
    assert reply == raw.CLOSED or reply[3] == MessageType.EXCEPTION  # type: ignore[index]
    assert outcome["seconds"] < 10  # type: ignore[operator]
    exc = _application_exception(_get_db(proxy.port, "proxy_it"))  # and later calls
    assert "no metastore reachable" in exc.message
    assert proxy.alive()


def test_sigterm_drains_calls_in_flight(
    proxy_factory: ProxyFactory, hms: MetastoreServer, sample: Sample
) -> None:
    slow = create_slow_table(hms.host, hms.port)
    proxy = proxy_factory()
    idle = raw.RawConnection("127.0.0.1", proxy.port)  # connected, no call in flight
    outcome: dict[str, bytes] = {}

    def call() -> None:
        request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=slow)
        outcome["reply"] = raw.call("127.0.0.1", proxy.port, request)

    caller = threading.Thread(target=call)
    before = hms.slow_calls_started()
    caller.start()
    wait_for_slow_call(hms, before)  # in flight: three seconds from its answer
    proxy.signal(signal.SIGTERM)
    eventually(lambda: _refused(proxy.port), 10, "the proxy to stop accepting on SIGTERM")
    assert idle.closed_by_peer(timeout=5)  # idle connections are closed at once
    idle.close()
    caller.join(30)
    assert proxy.wait(30) == 0
    assert outcome["reply"][3] == MessageType.REPLY  # the call in flight finished normally
    assert "draining" in proxy.log()


def test_oneway_calls_get_no_reply(hms: MetastoreServer, proxy_factory: ProxyFactory) -> None:
    proxy = proxy_factory()
    oneway = idl.encode_call("reinitialize", 1)
    oneway = oneway[:3] + bytes([MessageType.ONEWAY]) + oneway[4:]
    follow = idl.encode_call("getName", 2)
    with raw.RawConnection("127.0.0.1", hms.port) as direct:
        direct.send(oneway)
        expected = direct.call(follow)
    with raw.RawConnection("127.0.0.1", proxy.port) as conn:
        conn.send(oneway)
        assert conn.call(follow) == expected  # the first bytes back answer getName
    assert proxy.metric("hmsproxy_requests_total", method="reinitialize", outcome="ok") == 1


def test_callers_at_the_connection_limit_share_the_connections_that_come_back(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    """Twelve clients, two metastore connections: every call is answered, on those two
    connections, each handed to a waiting caller when it comes back (not closed and opened
    again after a caller has waited out --upstream-connect-timeout)."""
    proxy = proxy_factory(
        "--cache",
        "off",
        "--upstream-max-connections",
        "2",
        "--upstream-max-idle",
        "2",
        "--upstream-connect-timeout",
        "30",
    )
    before = proxy.metric("hmsproxy_upstream_connects_total", result="ok")
    expected = _get_db(hms.port, sample.db)
    errors: list[bytes] = []

    def client() -> None:
        for _ in range(10):
            reply = _get_db(proxy.port, sample.db)
            if reply != expected:
                errors.append(reply)

    threads = [threading.Thread(target=client) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    connects = proxy.metric("hmsproxy_upstream_connects_total", result="ok") - before
    assert connects <= 2, f"{connects:.0f} metastore connections opened"


def test_a_client_that_hangs_up_before_its_answer_costs_nothing(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    """The metastore's answer then has nowhere to go: the proxy drops it with its metastore
    connection (it may be half read), frees the slot, logs no internal error."""
    import socket
    import struct

    slow = create_slow_table(hms.host, hms.port)
    proxy = proxy_factory(
        "--cache", "off", "--upstream-max-connections", "1", "--upstream-max-idle", "1"
    )
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=slow)

    def hang_up(gone: int) -> None:
        before = hms.slow_calls_started()
        quitter = socket.create_connection(("127.0.0.1", proxy.port))
        quitter.sendall(request)
        wait_for_slow_call(hms, before)  # at the metastore, three seconds from its answer
        quitter.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        quitter.close()  # reset: whatever the proxy writes now fails
        eventually(
            lambda: (
                proxy.metric("hmsproxy_requests_total", method="get_table", outcome="client_gone")
                == gone
            ),
            15,
            "the proxy to drop the answer nobody waits for",
        )

    hang_up(1)
    hang_up(2)
    expected = _get_db(hms.port, sample.db)
    assert _get_db(proxy.port, sample.db) == expected  # the one connection is free again
    assert proxy.metric("hmsproxy_requests_total", method="get_table", outcome="client_gone") == 2
    assert "internal error" not in proxy.log()


# -- the proxy is never the reason a call fails ------------------------------------------------


def test_slow_calls_succeed_with_the_defaults(proxy: ProxyProcess, hms: MetastoreServer) -> None:
    """The metastore takes 10 s to add partitions to a "slowadd" table and 10 s to read a
    "slowlong" one (see CallerLog.java): through a proxy with default options both succeed,
    as they would directly (Hive's and Spark's clients wait 600 s), and the new partition is
    read back at once. The two run at the same time."""
    from tests.rig.locking import Endpoint, create_table

    direct, at = Endpoint(hms.host, hms.port), Endpoint("127.0.0.1", proxy.port)
    for db, table in (("slow_writes", "slowadd_events"), ("slow_reads", "slowlong_events")):
        if table not in (direct.call("get_all_tables", db_name=db).success or []):
            create_table(direct, hms.warehouse.as_uri(), db, table)
    read: dict[str, object] = {}

    def slow_read() -> None:
        started = time.monotonic()
        found = at.call("get_table", dbname="slow_reads", tbl_name="slowlong_events")
        read["seconds"], read["table"] = time.monotonic() - started, found.success.tableName

    reader = threading.Thread(target=slow_read)
    reader.start()
    db, table = "slow_writes", "slowadd_events"
    before = at.call("get_partition_names", db_name=db, tbl_name=table, max_parts=-1).success
    m = idl.module()
    day = f"2025-{len(before):02d}-01"
    template = direct.call("get_partition", db_name=db, tbl_name=table, part_vals=["2024-01-01"])
    sd = template.success.sd
    sd.location = sd.location.rsplit("/", 1)[0] + f"/ds={day}"
    started = time.monotonic()
    result = at.call(
        "add_partitions",
        new_parts=[m.Partition(values=[day], dbName=db, tableName=table, sd=sd, parameters={})],
    )
    assert time.monotonic() - started >= 10
    assert result.success == 1, result
    after = at.call("get_partition_names", db_name=db, tbl_name=table, max_parts=-1).success
    assert f"ds={day}" in after
    reader.join(60)
    assert read["table"] == "slowlong_events" and read["seconds"] >= 10  # type: ignore[operator]


def test_a_metastore_that_stops_answering_is_noticed_promptly(
    proxy_factory: ProxyFactory, relay: FaultyRelay
) -> None:
    """Accepting connections and answering nothing: readiness goes to not ready within the
    probe's own short bound, however long calls may wait."""
    proxy = proxy_factory(upstream=f"thrift://127.0.0.1:{relay.port}")
    eventually(lambda: health(proxy, "readiness") == SERVING, 20)
    relay.blackhole = True
    eventually(lambda: health(proxy, "readiness") == NOT_SERVING, 20)
    assert proxy.metric("hmsproxy_upstream_available") == 0
    relay.blackhole = False
    eventually(lambda: health(proxy, "readiness") == SERVING, 20)
