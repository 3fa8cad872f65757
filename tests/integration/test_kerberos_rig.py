"""The Kerberos rig itself: a realm whose tickets are real, and Kerberized metastores that
refuse plain Thrift, run each call as the Kerberos user (not as set_ugi says), offer only the
QOP they are configured for, and let the proxy's principal (and no one else) fetch another
user's delegation token. The proxy's Kerberos tests rely on every one of these."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gssapi
import pytest
from gssapi.raw.misc import GSSError

from proxy import idl
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.kdc import Realm
from tests.rig.sasl_client import KerberosConnection, SaslRefused
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

M = idl.module()
# Each Kerberized metastore, and the one layer it offers.
SECURE = [
    pytest.param("kerberos_hms", "auth", id="auth"),
    pytest.param("privacy_hms", "auth-conf", id="privacy"),
]


def result(method: str, reply: bytes) -> Any:
    return idl.decode_result(method, reply[12 + len(method) :])


def test_kinit_gives_the_user_a_ticket(realm: Realm) -> None:
    listing = realm.klist(realm.kinit("alice"))
    assert "Default principal: alice@HMSPROXY.TEST" in listing
    assert "krbtgt/HMSPROXY.TEST@HMSPROXY.TEST" in listing


def test_a_short_lived_realm_bounds_every_ticket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a keytab re-login test needs: tickets that run out within seconds however long
    the client asks for (the TGT, and the service ticket a context is made with, accepted
    here from the service's keytab as the proxy accepts its clients), and that acceptors
    refuse once run out (not five minutes later: the realm's clock skew is small)."""
    with Realm(tmp_path / "short", ticket_lifetime=3) as short:
        for key, value in short.env.items():
            monkeypatch.setenv(key, value)
        keytab = short.add_service("hive/localhost")
        short.add_user("alice", "alice-pw")
        ccache = short.kinit("alice", lifetime=3600)
        creds = gssapi.Credentials(usage="initiate", store={"ccache": f"FILE:{ccache}"})
        assert 0 < creds.lifetime <= 3
        accept = gssapi.Credentials(usage="accept", store={"keytab": str(keytab)})
        target = gssapi.Name("hive@localhost", gssapi.NameType.hostbased_service)
        client = gssapi.SecurityContext(name=target, creds=creds, usage="initiate")
        server = gssapi.SecurityContext(creds=accept, usage="accept")
        server.step(client.step())
        assert str(server.initiator_name) == "alice@HMSPROXY.TEST"
        assert 0 < server.lifetime <= 3 + short.clockskew
        # A ticket got while it was valid, presented once (a second time is a replay) after
        # the end of the ticket and the skew: the clock is what is waited for here.
        late = gssapi.SecurityContext(name=target, creds=creds, usage="initiate").step()
        ends = time.time() + 3 + short.clockskew
        eventually(lambda: time.time() > ends + 1, timeout=15, what="the ticket's end")
        refusing = gssapi.SecurityContext(creds=accept, usage="accept")
        refusing.step(late)  # python-gssapi returns the error token, and raises next time
        with pytest.raises(GSSError, match="Ticket expired"):
            assert not refusing.complete
        with pytest.raises(GSSError, match="expired"):
            gssapi.SecurityContext(name=target, creds=creds, usage="initiate").step()


def test_a_kerberized_metastore_refuses_plain_thrift(kerberos_hms: MetastoreServer) -> None:
    assert kerberos_hms.uri.startswith("thrift://localhost:")
    request = idl.encode_call("get_all_databases", 1)
    assert raw.call(kerberos_hms.host, kerberos_hms.port, request) == raw.CLOSED
    # Refused by the SASL transport: a Thrift message's first byte (0x80) is no SASL status.
    eventually(lambda: "Invalid status -128" in kerberos_hms.log(), what="the HMS's SASL error")


@pytest.mark.parametrize(("server", "qop"), SECURE)
def test_calls_run_as_the_kerberos_user_whatever_set_ugi_says(
    request: pytest.FixtureRequest, realm: Realm, server: str, qop: str, tmp_path: Path
) -> None:
    hms: MetastoreServer = request.getfixturevalue(server)
    db = f"kerberos_rig_{server}"
    database = M.Database(name=db, locationUri=(tmp_path / db).as_uri())
    with KerberosConnection(hms.host, hms.port, ccache=realm.kinit("alice"), qop=qop) as alice:
        assert alice.user == "alice@HMSPROXY.TEST"
        ugi = alice.call(idl.encode_call("set_ugi", 1, user_name="mallory", group_names=["g"]))
        assert result("set_ugi", ugi).success == ["g", "mallory"]  # accepted, and ignored
        created = alice.call(idl.encode_call("create_database", 2, database=database))
        assert result("create_database", created).o1 is None
        got = result("get_database", alice.call(idl.encode_call("get_database", 3, name=db)))
        assert got.success.name == db
    assert ("READ_DATABASE", db, "alice") in hms.callers()
    assert all(user != "mallory" for _, _, user in hms.callers())


def test_a_metastore_offers_only_its_own_protection(
    realm: Realm, kerberos_hms: MetastoreServer, privacy_hms: MetastoreServer
) -> None:
    ccache = realm.kinit("alice")
    with pytest.raises(SaslRefused, match="offers layers 0x4"):
        KerberosConnection(privacy_hms.host, privacy_hms.port, ccache=ccache, qop="auth")
    with pytest.raises(SaslRefused, match="offers layers 0x1"):
        KerberosConnection(kerberos_hms.host, kerberos_hms.port, ccache=ccache, qop="auth-conf")


def test_only_the_proxy_may_fetch_another_users_delegation_token(
    realm: Realm, kerberos_hms: MetastoreServer
) -> None:
    ask = idl.encode_call(
        "get_delegation_token", 1, token_owner="bob", renewer_kerberos_principal_name="proxy"
    )
    proxy_keytab = realm.keytab("proxy/localhost")
    with KerberosConnection(
        kerberos_hms.host,
        kerberos_hms.port,
        keytab=proxy_keytab,
        principal=realm.principal("proxy/localhost"),
    ) as proxy:
        assert result("get_delegation_token", proxy.call(ask)).success
    with KerberosConnection(
        kerberos_hms.host, kerberos_hms.port, ccache=realm.kinit("alice")
    ) as alice:
        refused = result("get_delegation_token", alice.call(ask))
    assert refused.success is None
    assert "not allowed to impersonate bob" in refused.o1.message
