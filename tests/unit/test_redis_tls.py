"""proxy.cache.redis_tls: a rediss:// URL's settings make the lean connections' SSL context
that redis-py's own connection makes, and what cannot be honoured is refused at start-up.

The handshake itself, with a real redis-server over TLS, is tested in
tests/integration/test_tls.py.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis.asyncio as aredis
from cryptography.hazmat.primitives import serialization

from proxy.cache import redis_tls
from proxy.config import ConfigError, load
from tests.rig.certs import Authority


def _kwargs(url: str) -> dict[str, Any]:
    """What RedisStore hands resp.open_connection for ``url``."""
    pool = aredis.Redis.from_url(url).connection_pool
    return {**pool.connection_kwargs, "connection_class_name": pool.connection_class.__name__}


def _redis_pys(url: str) -> ssl.SSLContext:
    """The context redis-py's own connection for ``url`` uses."""
    pool = aredis.Redis.from_url(url).connection_pool
    made: ssl.SSLContext = pool.connection_class(**pool.connection_kwargs).ssl_context.get()
    return made


def _seen(context: ssl.SSLContext) -> dict[str, Any]:
    return {
        "verify_mode": context.verify_mode,
        "check_hostname": context.check_hostname,
        "verify_flags": context.verify_flags,
        "minimum_version": context.minimum_version,
        "ciphers": sorted(c["name"] for c in context.get_ciphers()),
        "cas": context.cert_store_stats()["x509_ca"],
    }


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("ca"))


def test_the_settings_make_the_context_redis_py_makes(authority: Authority) -> None:
    client = authority.issue("proxy-client", server=False)
    queries = [
        "",  # redis-py's defaults: certificates required, host names checked
        f"ssl_ca_certs={authority.ca}",
        f"ssl_ca_path={authority.ca.parent}",
        "ssl_cert_reqs=none",
        "ssl_cert_reqs=optional&ssl_check_hostname=false",
        f"ssl_certfile={client.cert}&ssl_keyfile={client.key}&ssl_ca_certs={authority.ca}",
        f"ssl_min_version={ssl.TLSVersion.TLSv1_3.value}",
        "ssl_ciphers=ECDHE-ECDSA-AES128-GCM-SHA256",
        "ssl_include_verify_flags=VERIFY_X509_STRICT",
        "ssl_exclude_verify_flags=VERIFY_X509_PARTIAL_CHAIN",
    ]
    for query in queries:
        url = f"rediss://proxy:pw@127.0.0.1:6380/0?{query}"
        assert redis_tls.uses_tls(_kwargs(url))
        assert _seen(redis_tls.context(_kwargs(url))) == _seen(_redis_pys(url)), query


def test_what_each_setting_does(authority: Authority) -> None:
    def made(query: str = "") -> ssl.SSLContext:
        return redis_tls.context(_kwargs(f"rediss://127.0.0.1:6380?{query}"))

    default = made()
    assert default.verify_mode == ssl.CERT_REQUIRED and default.check_hostname
    assert made(f"ssl_ca_certs={authority.ca}").cert_store_stats()["x509_ca"] == (
        default.cert_store_stats()["x509_ca"] + 1
    )
    pem = quote(authority.ca.read_text())
    assert made(f"ssl_ca_data={pem}").cert_store_stats()["x509_ca"] == (
        default.cert_store_stats()["x509_ca"] + 1
    )
    unchecked = made("ssl_cert_reqs=none")
    assert unchecked.verify_mode == ssl.CERT_NONE and not unchecked.check_hostname
    assert not made("ssl_check_hostname=false").check_hostname
    assert made("ssl_min_version=772").minimum_version == ssl.TLSVersion.TLSv1_3
    tls12 = {c["name"] for c in made("ssl_ciphers=ECDHE-ECDSA-AES128-GCM-SHA256").get_ciphers()}
    assert "ECDHE-ECDSA-AES256-GCM-SHA384" not in tls12
    assert "ECDHE-ECDSA-AES128-GCM-SHA256" in tls12
    assert made("ssl_include_verify_flags=VERIFY_X509_STRICT").verify_flags & (
        ssl.VERIFY_X509_STRICT
    )


def test_an_encrypted_client_key_needs_its_password(authority: Authority, tmp_path: Path) -> None:
    client = authority.issue("encrypted-client", server=False)
    key = serialization.load_pem_private_key(client.key.read_bytes(), None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"open sesame"),
        )
    )
    url = f"rediss://127.0.0.1:6380?ssl_certfile={client.cert}&ssl_keyfile={locked}"
    redis_tls.context(_kwargs(url + "&ssl_password=open%20sesame"))
    with pytest.raises(ssl.SSLError):
        redis_tls.context(_kwargs(url + "&ssl_password=wrong"))


def test_a_url_without_tls_gets_no_context() -> None:
    assert not redis_tls.uses_tls(_kwargs("redis://127.0.0.1:6379/0"))
    assert not redis_tls.uses_tls({"path": "/run/redis.sock"})


def test_the_settings_are_the_ones_redis_pys_ssl_connection_takes() -> None:
    assert {
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_cert_reqs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
    } <= set(redis_tls.SETTINGS)
    assert redis_tls.SETTINGS["ssl_cert_reqs"] == "required"
    assert redis_tls.SETTINGS["ssl_check_hostname"] is True
    assert set(redis_tls.SETTINGS) >= redis_tls.CLUSTER_SETTINGS


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("rediss://h:6380?ssl_ca_cert=/ca.pem", "ssl_ca_cert: not a TLS setting"),
        ("rediss://h:6380?ssl=true", "ssl: not a TLS setting"),
        ("redis://h:6379?ssl_ca_certs=/ca.pem", "ssl_ca_certs: TLS settings need a rediss://"),
        ("unix:///run/r.sock?ssl_certfile=/c.pem", "ssl_certfile: TLS settings need a rediss"),
        ("rediss://h:6380?ssl_cert_reqs=always", "ssl_cert_reqs: Invalid SSL Certificate"),
        ("rediss://h:6380?ssl_min_version=9", "ssl_min_version: 9 is not a valid TLSVersion"),
        ("rediss://h:6380?ssl_min_version=tls1.3", "Invalid value for 'ssl_min_version'"),
        ("rediss://h:6380?ssl_ciphers=NO-SUCH-CIPHER", "ssl_ciphers: "),
        ("rediss://h:6380?ssl_include_verify_flags=VERIFY_NOTHING", "Invalid value"),
    ],
)
def test_settings_that_cannot_be_honoured_are_refused(url: str, why: str) -> None:
    refused = redis_tls.refusal(url)
    assert refused is not None and refused.startswith(why), refused


def test_the_cluster_client_takes_fewer_settings() -> None:
    missing = set(redis_tls.SETTINGS) - redis_tls.CLUSTER_SETTINGS
    for name in missing:  # ssl_ca_path and ssl_password, in redis-py 8
        url = f"rediss://h:6380?{name}=x"
        assert redis_tls.refusal(url) is None
        refused = redis_tls.refusal(url, cluster=True)
        assert refused is not None and "Redis Cluster client" in refused


def test_good_settings_pass() -> None:
    assert redis_tls.refusal("redis://h:6379/0") is None
    assert redis_tls.refusal("unix:///run/redis.sock?db=1") is None
    everything = (
        "rediss://u:p@h:6380/0?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
        "&ssl_cert_reqs=optional&ssl_check_hostname=false&ssl_min_version=771"
        "&ssl_ciphers=ECDHE-ECDSA-AES128-GCM-SHA256&ssl_include_verify_flags=VERIFY_X509_STRICT"
    )
    assert redis_tls.refusal(everything) is None  # files are read at each connection, not here


def test_a_refused_setting_stops_start_up_in_one_line_without_the_password() -> None:
    flags = {
        "upstream": "thrift://127.0.0.1:9083",
        "redis": "rediss://proxy:s3cret@h:6380/0?ssl_ca_cert=/ca.pem",
    }
    with pytest.raises(ConfigError) as caught:
        load(flags, {})
    [problem] = [p for p in caught.value.problems if p.startswith("redis:")]
    assert "ssl_ca_cert" in problem and "\n" not in problem and "s3cret" not in problem
    flags["redis"] = "rediss://proxy:s3cret@h:6380/0?ssl_password=x"
    assert load({**flags, "redis_mode": "single"}, {}).redis == flags["redis"]
    with pytest.raises(ConfigError):
        load({**flags, "redis_mode": "cluster"}, {})
