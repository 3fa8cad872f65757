"""Kerberos through the proxy, with real parts: an MIT KDC, Kerberized metastores 2.3.10
(``authentication`` and ``privacy``, the proxy granted hadoop.proxyuser rights), the rig's own
GSSAPI client (no code shared with proxy.sasl) as the engine, and the HMS's caller log as the
judge of who each call ran as. Real Spark through the proxy is in
tests/e2e/test_spark_kerberos.py.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gssapi
import pytest

from proxy import idl
from proxy.sasl.layer import SaslError
from proxy.sasl.negotiation import Status, encode
from tests.rig.hms import MetastoreServer
from tests.rig.kdc import Realm
from tests.rig.proxy_process import ProxyProcess, kerberos_options, proxies_started
from tests.rig.sasl_client import KerberosConnection, SaslRefused
from tests.rig.token_client import TokenConnection
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

M = idl.module()
EVERY_QOP = "authentication,integrity,privacy"


def call(conn: Any, method: str, **args: Any) -> Any:
    reply = conn.call(idl.encode_call(method, 1, **args))
    return idl.decode_result(method, reply[12 + len(method) :])


def database(name: str, warehouse: Path, **parameters: str) -> Any:
    return M.Database(
        name=name,
        description="",
        locationUri=(warehouse / f"{name}.db").as_uri(),
        parameters=parameters,
    )


ProxyMaker = Callable[..., ProxyProcess]


@pytest.fixture
def kerberos_proxy(tmp_path: Path, realm: Realm) -> Iterator[ProxyMaker]:
    """Proxies that authenticate engines as proxy/localhost and reach ``hms`` over SASL."""
    with proxies_started(tmp_path) as started:

        def make(
            hms: MetastoreServer, *args: str, principal: str = "proxy/localhost"
        ) -> ProxyProcess:
            options = kerberos_options(realm, hms, principal=principal)
            proxy = ProxyProcess(tmp_path, hms.uri, *options, *args)
            started.append(proxy.start())
            return proxy

        yield make


def engine(realm: Realm, user: str, proxy: ProxyProcess, qop: str = "auth") -> KerberosConnection:
    return KerberosConnection(
        "localhost", proxy.port, service="proxy", ccache=realm.kinit(user), qop=qop
    )


def callers(hms: MetastoreServer, event: str, target: str) -> list[str]:
    return [user for e, t, user in hms.callers() if e == event and target in t]


def test_each_engine_runs_as_itself_and_never_reads_anothers_entries(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    proxy = kerberos_proxy(kerberos_hms)
    warehouse = kerberos_hms.warehouse
    with engine(realm, "alice", proxy) as alice, engine(realm, "bob", proxy) as bob:
        assert call(alice, "create_database", database=database("k_alice", warehouse)).o1 is None
        assert call(bob, "create_database", database=database("k_bob", warehouse)).o1 is None
        assert callers(kerberos_hms, "CREATE_DATABASE", "k_alice") == ["alice"]
        assert callers(kerberos_hms, "CREATE_DATABASE", "k_bob") == ["bob"]

        hits = proxy.metric_sum("hmsproxy_cache_lookups_total", method="get_database", result="hit")
        assert call(alice, "get_database", name="k_alice").success.name == "k_alice"
        assert call(alice, "get_database", name="k_alice").success.name == "k_alice"
        after = proxy.metric_sum(
            "hmsproxy_cache_lookups_total", method="get_database", result="hit"
        )
        assert after == hits + 1  # alice's second read was hers from the cache
        # bob's read of the same database is his own: fetched as bob, not alice's entry.
        assert call(bob, "get_database", name="k_alice").success.name == "k_alice"
        assert callers(kerberos_hms, "READ_DATABASE", "k_alice") == ["alice", "bob"]

        # set_ugi cannot make alice someone else (the HMS ignores it under SASL; so does the
        # proxy's cache scope).
        assert call(alice, "set_ugi", user_name="mallory", group_names=[]).success is not None
        call(alice, "get_database", name="k_bob")
        assert callers(kerberos_hms, "READ_DATABASE", "k_bob") == ["alice"]
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="gssapi", result="ok") == 2


@pytest.mark.parametrize("qop", ["auth", "auth-int", "auth-conf"])
def test_every_protection_carries_big_messages_both_ways(
    qop: str, realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    """Requests and replies of ~300 KB: several frames' worth, wrapped off the event loop."""
    proxy = kerberos_proxy(kerberos_hms, "--sasl-qop", EVERY_QOP)
    name = f"k_big_{qop.replace('-', '_')}"
    big = {f"key{i}": "v" * 1000 for i in range(300)}
    with engine(realm, "alice", proxy, qop) as alice:
        made = call(
            alice, "create_database", database=database(name, kerberos_hms.warehouse, **big)
        )
        assert made.o1 is None
        for _ in range(2):  # the metastore's reply, then the cache's
            assert call(alice, "get_database", name=name).success.parameters == big


def test_a_privacy_metastore_gets_privacy_and_calls_still_run_as_the_user(
    realm: Realm, privacy_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    """hadoop.rpc.protection=privacy: GSSAPI auth-conf for the proxy's own calls and
    DIGEST-MD5 auth-conf (3des, as Java's client picks) for the users' token connections."""
    proxy = kerberos_proxy(privacy_hms)
    with engine(realm, "alice", proxy) as alice:
        assert (
            call(alice, "create_database", database=database("p_alice", privacy_hms.warehouse)).o1
            is None
        )
        assert call(alice, "get_database", name="p_alice").success.name == "p_alice"
    assert callers(privacy_hms, "CREATE_DATABASE", "p_alice") == ["alice"]
    assert proxy.metric("hmsproxy_upstream_auth_total", mechanism="digest-md5", result="ok") >= 1
    assert proxy.metric("hmsproxy_upstream_auth_total", mechanism="gssapi", result="ok") >= 1


def test_upstream_identity_proxy_runs_every_call_as_the_proxy(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    proxy = kerberos_proxy(kerberos_hms, "--upstream-identity", "proxy")
    with engine(realm, "alice", proxy) as alice:
        call(alice, "create_database", database=database("k_as_proxy", kerberos_hms.warehouse))
    assert callers(kerberos_hms, "CREATE_DATABASE", "k_as_proxy") == ["proxy"]
    assert proxy.metric("hmsproxy_kerberos_tokens_total", event="fetched") == 0


def test_bad_engines_are_closed_one_by_one_and_the_rest_go_on(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    proxy = kerberos_proxy(kerberos_hms)  # offers auth only (the default)
    with engine(realm, "alice", proxy) as alice:  # a good engine, open throughout
        # A plain Thrift client on the SASL port.
        with socket.create_connection(("127.0.0.1", proxy.port), 10) as plain:
            plain.sendall(idl.encode_call("get_all_databases", 1))
            plain.settimeout(10)
            answer = plain.recv(1000)
            assert answer[:1] == b"\x03" and b"plain Thrift client" in answer  # BAD, then closed
            assert plain.recv(1000) == b""
        # A ticket for another service (the metastore's) presented to the proxy.
        with pytest.raises(SaslRefused, match="Kerberos authentication failed"):
            KerberosConnection("localhost", proxy.port, service="hive", ccache=realm.kinit("bob"))
        # No common protection: the engine wants privacy, the proxy offers authentication.
        with pytest.raises(SaslRefused):
            engine(realm, "bob", proxy, qop="auth-conf")
        # A SASL mechanism the proxy does not speak.
        with socket.create_connection(("127.0.0.1", proxy.port), 10) as other:
            other.sendall(b"\x01\x00\x00\x00\x05PLAIN\x02\x00\x00\x00\x00")
            other.settimeout(10)
            assert b"unsupported SASL mechanism PLAIN" in other.recv(1000)
        assert call(alice, "get_all_databases").success  # unaffected
    assert proxy.alive()
    log = proxy.log()
    assert "plain Thrift client" in log and "unsupported SASL mechanism" in log
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="other", result="protocol") == 1
    # The wrong service, and the engine that found no common protection and hung up.
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="gssapi", result="failed") == 2
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="other", result="unsupported") == 1


def test_an_expired_ticket_is_refused(
    tmp_path: Path, hms: MetastoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A realm whose tickets last 3 s (and a clock skew of 1 s): a ticket presented after its
    end is refused, and an engine with a fresh one is served. The metastore is a plain one:
    only the engines' side is Kerberos here."""
    with Realm(tmp_path / "short", ticket_lifetime=3) as short:
        for key, value in short.env.items():
            monkeypatch.setenv(key, value)
        short.add_service("proxy/localhost")
        short.add_user("carol", "carol-pw")
        proxy = ProxyProcess(tmp_path, hms.uri, *kerberos_options(short), env=short.env).start()
        try:
            ccache = short.kinit("carol")
            with KerberosConnection(
                "localhost", proxy.port, service="proxy", ccache=ccache
            ) as carol:
                assert call(carol, "get_all_databases").success
            # A service ticket got while the TGT was valid, presented after its end.
            creds = gssapi.Credentials(usage="initiate", store={"ccache": f"FILE:{ccache}"})
            target = gssapi.Name("proxy@localhost", gssapi.NameType.hostbased_service)
            late = gssapi.SecurityContext(name=target, creds=creds, usage="initiate").step()
            ends = time.time() + 3 + short.clockskew
            eventually(lambda: time.time() > ends + 1, timeout=15, what="the ticket's end")
            with socket.create_connection(("127.0.0.1", proxy.port), 10) as stale:
                stale.sendall(encode(Status.START, b"GSSAPI") + encode(Status.OK, late))
                stale.settimeout(10)
                answer = stale.recv(1000)
            assert answer[:1] == bytes([Status.BAD]) and b"Ticket expired" in answer
            fresh = short.kinit("carol")
            with KerberosConnection(
                "localhost", proxy.port, service="proxy", ccache=fresh
            ) as carol:
                assert call(carol, "get_all_databases").success
            # A plain metastore: the user reaches it by the set_ugi the proxy sends for her.
            with KerberosConnection(
                "localhost", proxy.port, service="proxy", ccache=fresh
            ) as carol:
                call(carol, "create_database", database=database("carols", hms.warehouse))
            assert callers(hms, "CREATE_DATABASE", "carols") == ["carol"]
        finally:
            proxy.stop()


def test_delegation_token_engines_work_through_the_proxy(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    """A token fetched through the proxy over Kerberos, then DIGEST-MD5 connections with it,
    whose calls run as the token's owner; renewal and cancellation by the owner."""
    proxy = kerberos_proxy(kerberos_hms)
    with engine(realm, "alice", proxy) as alice:
        token = own_token(alice, "alice")
        assert token
        # The HMS judges what alice may ask for, as it would directly: not bob's token.
        refused = call(
            alice,
            "get_delegation_token",
            token_owner="bob",
            renewer_kerberos_principal_name="alice",
        )
        assert refused.success is None and "not allowed to impersonate bob" in refused.o1.message
        renewed = call(alice, "renew_delegation_token", token_str_form=token)
        assert renewed.success > time.time() * 1000
    with TokenConnection.connect("localhost", proxy.port, token) as tokened:
        call(tokened, "create_database", database=database("k_token", kerberos_hms.warehouse))
        assert call(tokened, "get_database", name="k_token").success.name == "k_token"
    assert callers(kerberos_hms, "CREATE_DATABASE", "k_token") == ["alice"]
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="digest-md5", result="ok") == 1
    with engine(realm, "alice", proxy) as alice:
        assert call(alice, "cancel_delegation_token", token_str_form=token).o1 is None
    with pytest.raises(SaslError, match=r"BAD|ERROR"):
        TokenConnection.connect("localhost", proxy.port, token)
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="digest-md5", result="failed") == 1


def own_token(conn: Any, user: str, owner: str | None = None) -> Any:
    return call(
        conn,
        "get_delegation_token",
        token_owner=owner or user,
        renewer_kerberos_principal_name=user,
    ).success


def test_trino_impersonation_through_the_proxy(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    """Trino with hive.metastore.thrift.impersonation.enabled: authenticated as trino (which
    the HMS lets act for others: hadoop.proxyuser.trino), it asks for each end user's token,
    get_delegation_token(user, user), then connects with it: calls run as the end user."""
    realm.add_user("trino", "trino-pw")
    proxy = kerberos_proxy(kerberos_hms)
    with engine(realm, "trino", proxy) as trino:
        token = own_token(trino, "bob", owner="bob")
        assert token
    with TokenConnection.connect("localhost", proxy.port, token) as as_bob:
        call(as_bob, "create_database", database=database("k_impersonated", kerberos_hms.warehouse))
    assert callers(kerberos_hms, "CREATE_DATABASE", "k_impersonated") == ["bob"]


def test_with_every_call_as_the_proxy_an_engine_gets_only_its_own_token(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    """--upstream-identity proxy: the HMS sees only the proxy, which may impersonate anyone,
    so the proxy itself refuses a token of another user (in the HMS's words)."""
    proxy = kerberos_proxy(kerberos_hms, "--upstream-identity", "proxy")
    with engine(realm, "alice", proxy) as alice:
        assert own_token(alice, "alice")
        refused = call(
            alice,
            "get_delegation_token",
            token_owner="bob",
            renewer_kerberos_principal_name="alice",
        )
        assert refused.o1.message == "User: alice is not allowed to impersonate bob"


def test_tokens_are_fetched_again_when_the_metastore_forgets_them(
    realm: Realm, kerberos_hms: MetastoreServer, kerberos_proxy: ProxyMaker
) -> None:
    """The HMS's default token store is in memory: a restart forgets every token the proxy
    holds. The next call of each user gets a new one, and succeeds."""
    proxy = kerberos_proxy(kerberos_hms)
    with engine(realm, "bob", proxy) as bob:
        assert call(bob, "get_all_databases").success
    assert proxy.metric("hmsproxy_kerberos_tokens_total", event="fetched") == 1
    kerberos_hms.stop()
    kerberos_hms.start()
    with engine(realm, "bob", proxy) as bob:
        call(bob, "create_database", database=database("k_after_restart", kerberos_hms.warehouse))
    assert callers(kerberos_hms, "CREATE_DATABASE", "k_after_restart") == ["bob"]
    assert proxy.metric("hmsproxy_kerberos_tokens_total", event="refused") == 1
    assert proxy.metric("hmsproxy_kerberos_tokens_total", event="fetched") == 2


def test_the_proxy_logs_in_again_before_its_ticket_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A realm whose tickets last 6 s: for three lifetimes an engine calls through the proxy on
    new metastore connections (each needs a valid login for its service ticket), and no call
    fails; the login's expiry moves on, and readiness stays green."""
    with Realm(tmp_path / "short", ticket_lifetime=6) as short:
        for key, value in short.env.items():
            monkeypatch.setenv(key, value)
        for service in ("hive/localhost", "proxy/localhost"):
            short.add_service(service)
        short.add_user("dave", "dave-pw")
        with MetastoreServer(tmp_path / "hms", kerberos=short) as hms:
            proxy = ProxyProcess(
                tmp_path,
                hms.uri,
                *kerberos_options(short, hms),
                "--upstream-identity",
                "proxy",
                # Every call on a new metastore connection: each one asks for a ticket.
                "--upstream-max-idle",
                "0",
                env=short.env,
            ).start()
            try:
                first = proxy.metric("hmsproxy_kerberos_login_expiry_timestamp_seconds")
                ends = time.time() + 3 * 6
                calls = 0
                while time.time() < ends:
                    ccache = short.kinit("dave")  # the engine's own ticket runs out too
                    with KerberosConnection(
                        "localhost", proxy.port, service="proxy", ccache=ccache
                    ) as dave:
                        assert call(dave, "get_all_databases").success
                    calls += 1
                    time.sleep(0.5)
                last = proxy.metric("hmsproxy_kerberos_login_expiry_timestamp_seconds")
                assert last > first + 2 * 6 - 2, (first, last)  # two logins more, at least
                assert "Kerberos: logged in again" in proxy.log()
                assert calls > 12
                assert (
                    proxy.metric(
                        "hmsproxy_upstream_auth_total", mechanism="gssapi", result="failed"
                    )
                    == 0
                )
                health = urllib.request.urlopen(
                    f"http://127.0.0.1:{proxy.metrics_port}/readyz", timeout=10
                )
                assert health.status == 200
            finally:
                proxy.stop()
