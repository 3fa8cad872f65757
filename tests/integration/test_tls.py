"""TLS everywhere it can be: engines to the proxy (and mutual TLS), the proxy to a real
metastore running with ``hive.metastore.use.SSL``, and the proxy to a real Redis over TLS with
an ACL user. Certificates come from a throwaway CA the tests make."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from hmsclient import hmsclient
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.transport.TSSLSocket import TSSLSocket
from thrift.transport.TTransport import TBufferedTransport

from proxy import idl
from proxy.wire.binary import MessageType
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.certs import KEYSTORE_PASSWORD, Authority
from tests.rig.hms import MetastoreServer
from tests.rig.ports import free_port
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample

pytestmark = pytest.mark.hms

M = idl.module()


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def tls_hms(
    tmp_path_factory: pytest.TempPathFactory, authority: Authority
) -> Iterator[MetastoreServer]:
    issued = authority.issue("metastore", server=True)
    with MetastoreServer(
        tmp_path_factory.mktemp("tls-hms"),
        keystore=issued.keystore,
        keystore_password=KEYSTORE_PASSWORD,
    ) as server:
        yield server


def client_context(
    authority: Authority, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(authority.ca))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def test_engines_reach_the_proxy_over_tls(
    hms: MetastoreServer,
    proxy_factory: ProxyFactory,
    sample: Sample,
    authority: Authority,
) -> None:
    server = authority.issue("proxy", server=True)
    proxy = proxy_factory("--tls-cert", str(server.cert), "--tls-key", str(server.key))
    request = idl.encode_call("get_table", 3, dbname=sample.db, tbl_name=sample.table)
    direct = raw.call(hms.host, hms.port, request)
    for _ in range(2):  # a miss, then a hit: both byte-identical to the HMS's reply
        assert raw.call("127.0.0.1", proxy.port, request, tls=client_context(authority)) == direct
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 1
    # A real Thrift SSL client (what Hive's and Spark's clients do with use.SSL).
    socket = TSSLSocket("127.0.0.1", proxy.port, ca_certs=str(authority.ca))
    with hmsclient.HMSClient(iprot=TBinaryProtocol(TBufferedTransport(socket))) as c:
        assert c.get_database(sample.db).name == sample.db
    # Plain TCP to a TLS port gets nowhere.
    assert raw.call("127.0.0.1", proxy.port, request) == raw.CLOSED


def test_mutual_tls_wants_a_certificate_the_ca_signed(
    hms: MetastoreServer,
    proxy_factory: ProxyFactory,
    sample: Sample,
    authority: Authority,
    tmp_path: Path,
) -> None:
    server = authority.issue("proxy-mtls", server=True)
    engine = authority.issue("trino", server=False)
    stranger = Authority(tmp_path / "other-ca").issue("stranger", server=False)
    proxy = proxy_factory(
        *("--tls-cert", str(server.cert), "--tls-key", str(server.key)),
        *("--tls-client-ca", str(authority.ca)),
    )
    request = idl.encode_call("get_database", 1, name=sample.db)
    good = client_context(authority, engine.cert, engine.key)
    assert raw.call("127.0.0.1", proxy.port, request, tls=good)[3] == MessageType.REPLY
    for refused in (
        client_context(authority),
        client_context(authority, stranger.cert, stranger.key),
    ):
        with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):
            reply = raw.call("127.0.0.1", proxy.port, request, tls=refused)
            if reply == raw.CLOSED:  # TLS 1.3 reports the refusal on the first read
                raise EOFError("closed")


def test_the_proxy_speaks_tls_to_a_tls_metastore(
    tls_hms: MetastoreServer, proxy_factory: ProxyFactory, authority: Authority, tmp_path: Path
) -> None:
    upstream = f"thrift://127.0.0.1:{tls_hms.port}"
    proxy = proxy_factory(
        "--upstream-tls", "on", "--upstream-tls-ca", str(authority.ca), upstream=upstream
    )
    to_hms = client_context(authority)
    create = idl.encode_call("create_database", 1, database=M.Database("over_tls", "", None, {}))
    assert raw.call("127.0.0.1", proxy.port, create)[3] == MessageType.REPLY
    read = idl.encode_call("get_database", 2, name="over_tls")
    through = raw.call("127.0.0.1", proxy.port, read)
    assert through == raw.call("127.0.0.1", tls_hms.port, read, tls=to_hms)
    assert through[3] == MessageType.REPLY

    # A proxy that does not trust the metastore's certificate refuses to talk to it, and says
    # so to its client at once instead of hanging.
    other = Authority(tmp_path / "other-ca")
    wary = proxy_factory(
        "--upstream-tls", "on", "--upstream-tls-ca", str(other.ca), upstream=upstream
    )
    reply = raw.call("127.0.0.1", wary.port, read)
    assert reply[3] == MessageType.EXCEPTION
    assert wary.metric("hmsproxy_upstream_connects_total", result="failed") >= 1
    assert "CERTIFICATE_VERIFY_FAILED" in wary.log()


@pytest.fixture
def tls_redis(tmp_path: Path, authority: Authority) -> Iterator[RedisServer]:
    issued = authority.issue("redis", server=True)
    port = free_port()
    with RedisServer(
        tmp_path / "redis-tls",
        port,
        *("--port", "0", "--tls-port", str(port)),
        *("--tls-cert-file", str(issued.cert), "--tls-key-file", str(issued.key)),
        *("--tls-ca-cert-file", str(authority.ca), "--tls-auth-clients", "no"),
        *("--user", "default", "off"),
        *("--user", "proxy", "on", ">s3cret", "~*", "&*", "+@all"),
    ) as server:
        yield server


def test_redis_over_tls_with_an_acl_user(
    hms: MetastoreServer,
    tls_redis: RedisServer,
    proxy_factory: ProxyFactory,
    sample: Sample,
    authority: Authority,
) -> None:
    url = f"rediss://proxy:s3cret@127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={authority.ca}"
    # A generous Redis timeout: this test is about TLS and ACLs, not latency under load.
    proxy = proxy_factory("--redis", url, "--redis-timeout", "2")
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.table)
    direct = raw.call(hms.host, hms.port, request)
    for _ in range(3):
        assert raw.call("127.0.0.1", proxy.port, request) == direct
    assert proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 2
    assert "password" not in proxy.log() and "s3cret" not in proxy.log()

    # The wrong password: the proxy still answers, from the metastore, and says Redis is down.
    wrong = proxy_factory("--redis", url.replace("s3cret", "wrong"))
    for _ in range(3):
        assert raw.call("127.0.0.1", wrong.port, request) == direct
    assert wrong.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 0
    assert wrong.metric("hmsproxy_cache_errors_total", operation="connect") >= 1
    assert wrong.metric("hmsproxy_cache_available") == 0
