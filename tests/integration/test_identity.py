"""Every call runs at the HMS as the identity its client gave with set_ugi.

The HMS in the rig records, for each call, the user it ran the call as (a pre-event
listener, tests/rig/java/CallerLog.java). Clients with different identities, Trino-style (a
new connection and a set_ugi for every call) and Spark-style (one long connection), go
through one proxy whose pooled connections are shared; each table read must reach the HMS
as its own client's user.
"""

from __future__ import annotations

import getpass
import threading

import pytest
from hmsclient import hmsclient

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import Sample

pytestmark = pytest.mark.hms

USERS = ("alice", "bob", None)  # None: a client that never calls set_ugi


def _table_for(user: str | None) -> str:
    return f"ugi_{user or 'anonymous'}"


def _ensure_tables(hms: MetastoreServer, sample: Sample) -> None:
    with hmsclient.HMSClient(host=hms.host, port=hms.port) as c:
        existing = set(c.get_all_tables(sample.db))
        template = c.get_table(sample.db, sample.unpartitioned)
        for user in (*USERS, "dave"):
            name = _table_for(user)
            if name not in existing:
                template.tableName = name
                template.sd.location = None
                c.create_table(template)


def _one_call(port: int, sample: Sample, user: str | None) -> None:
    with raw.RawConnection("127.0.0.1", port) as conn:
        if user is not None:
            conn.call(idl.encode_call("set_ugi", 1, user_name=user, group_names=[f"{user}-group"]))
        reply = conn.call(
            idl.encode_call("get_table", 2, dbname=sample.db, tbl_name=_table_for(user))
        )
        assert idl.decode_result("get_table", reply[12 + len("get_table") :]).success is not None


@pytest.fixture
def plain(proxy_factory: ProxyFactory) -> ProxyProcess:
    """Forwarding only: every read must reach the HMS for the listener to see it."""
    return proxy_factory("--cache", "off")


def test_each_call_runs_as_its_clients_identity(
    hms: MetastoreServer, plain: ProxyProcess, sample: Sample
) -> None:
    proxy = plain
    _ensure_tables(hms, sample)
    before = len(hms.callers())
    errors: list[BaseException] = []

    def trino_like(user: str | None) -> None:
        try:
            for _ in range(15):
                _one_call(proxy.port, sample, user)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def spark_like() -> None:
        try:
            with hmsclient.HMSClient(host="127.0.0.1", port=proxy.port) as c:
                c.set_ugi("dave", ["dave-group"])
                for _ in range(15):
                    c.get_table(sample.db, _table_for("dave"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=trino_like, args=(u,)) for u in USERS]
    threads.append(threading.Thread(target=spark_like))
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert errors == []

    reads = [
        (target, user) for event, target, user in hms.callers()[before:] if event == "READ_TABLE"
    ]
    expected = {f"{sample.db}.{_table_for(u)}": u or getpass.getuser() for u in (*USERS, "dave")}
    assert len(reads) == 15 * 4
    for target, user in reads:
        assert user == expected[target], (target, user)
    # Connections were shared, not opened per call: 60 calls, a handful of connections.
    assert proxy.metric("hmsproxy_upstream_connects_total", result="ok") <= 8


def test_set_ugi_reply_is_the_hms_reply(hms: MetastoreServer, proxy: ProxyProcess) -> None:
    request = idl.encode_call("set_ugi", 42, user_name="erin", group_names=["g1", "g2"])
    direct = raw.call(hms.host, hms.port, request)
    first = raw.call("127.0.0.1", proxy.port, request)  # binds a connection
    again = raw.call("127.0.0.1", proxy.port, request)  # answered for a bound connection
    assert first == direct
    assert again == direct


def test_a_client_without_set_ugi_never_gets_a_bound_connection(
    hms: MetastoreServer, plain: ProxyProcess, sample: Sample
) -> None:
    proxy = plain
    _ensure_tables(hms, sample)
    before = len(hms.callers())
    _one_call(proxy.port, sample, "alice")  # leaves an idle connection bound to alice
    _one_call(proxy.port, sample, None)
    users = [
        u
        for e, target, u in hms.callers()[before:]
        if e == "READ_TABLE" and target.endswith("anonymous")
    ]
    assert users == [getpass.getuser()]
