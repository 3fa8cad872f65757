"""A real Java delegation-token engine through the proxy: Hive 2.3.10's own
HiveMetaStoreClient (tests/rig/java/TokenEngine.java), as HiveServer2's tasks and Trino's
impersonation use tokens. As a Kerberos user (keytab login) it gets a token of its own through
the proxy; then, as a UGI with no Kerberos credentials holding only that token under
``hive.metastore.token.signature``, it connects again (the client picks DIGEST-MD5 itself),
creates a database and reads it back. The proxy relays that DIGEST-MD5 negotiation to the
Kerberized metastore, and the metastore's caller log shows the calls ran as the user.

The Python token engine of tests/integration/test_kerberos.py uses the proxy's own DIGEST-MD5
code; this one uses the JDK's DIGEST-MD5 client and Hive's HadoopThriftAuthBridge.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.rig import java
from tests.rig.hms import CONSOLE_LOG4J2, MetastoreServer, kerberos_jvm_flags
from tests.rig.kdc import Realm
from tests.rig.proxy_process import ProxyProcess, kerberos_options

pytestmark = pytest.mark.hms

# The engine's logs (stderr): warnings, and the lines of the client (its logger is
# "hive.metastore") saying where it connects.
LOG4J2 = (
    CONSOLE_LOG4J2
    + """\
logger.client.name = hive.metastore
logger.client.level = info
"""
)


@pytest.fixture
def token_proxy(
    tmp_path: Path, realm: Realm, kerberos_hms: MetastoreServer
) -> Iterator[ProxyProcess]:
    """A proxy in front of ``kerberos_hms``: GSSAPI as proxy/localhost for engines, token
    (DIGEST-MD5) engines relayed to the metastore, per-user tokens upstream."""
    process = ProxyProcess(
        tmp_path, kerberos_hms.uri, *kerberos_options(realm, kerberos_hms)
    ).start()
    yield process
    process.stop()


def run_token_engine(
    realm: Realm, proxy: ProxyProcess, user: str, name: str, location: str, workdir: Path
) -> dict[str, Any]:
    """One JVM: TokenEngine as ``user`` (from the user's keytab) against the proxy; its
    JSON result."""
    workdir.mkdir(parents=True, exist_ok=True)
    log4j = workdir / "log4j2.properties"
    log4j.write_text(LOG4J2)
    command = [
        "java",
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # a short-lived JVM: start fast
        *kerberos_jvm_flags(realm),
        f"-Dlog4j.configurationFile={log4j}",
        "-cp",
        java.classpath(java.compiled_helpers()),
        "TokenEngine",
        f"thrift://localhost:{proxy.port}",  # _HOST in the principal becomes localhost
        f"proxy/_HOST@{realm.name}",
        realm.principal(user),
        str(realm.keytab(user)),
        name,
        location,
    ]
    # Nothing from the machine's Hadoop, Hive or ticket cache: the keytab login only.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HADOOP_CONF_DIR", "HIVE_CONF_DIR", "HADOOP_HOME", "HIVE_HOME", "KRB5CCNAME")
    }
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=workdir,
        env=env | realm.env,
    )
    (workdir / "engine.log").write_text(done.stderr)
    detail = f"{done.stderr[-6000:]}\n--- proxy ---\n{proxy.log()[-4000:]}"
    assert done.returncode == 0, detail
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stdout[-2000:] + detail
    return dict(json.loads(lines[-1]))


def callers(hms: MetastoreServer, event: str, target: str) -> list[str]:
    """Who the metastore ran each ``event`` on ``target`` as (its CallerLog)."""
    return [user for e, t, user in hms.callers() if (e, t) == (event, target)]


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_a_java_engine_gets_a_token_through_the_proxy_and_works_with_it(
    user: str,
    tmp_path: Path,
    realm: Realm,
    kerberos_hms: MetastoreServer,
    token_proxy: ProxyProcess,
) -> None:
    proxy = token_proxy
    name = f"kj_token_{user}"
    location = (kerberos_hms.warehouse / f"{name}.db").as_uri()
    result = run_token_engine(realm, proxy, user, name, location, tmp_path / "engine")

    # (a) A Kerberos login got the token through the proxy, where the call ran as the user
    # (on the user's own token connection): the token is what a direct fetch gives, with no
    # real user.
    assert result["login"] == realm.principal(user)
    assert result["login_auth"] == "KERBEROS"
    assert result["token"] is True
    assert result["token_kind"] == "HIVE_DELEGATION_TOKEN"
    assert (result["token_owner"], result["token_renewer"]) == (user, user)
    assert result["token_real_user"] == ""
    assert proxy.metric("hmsproxy_requests_total", method="get_delegation_token", outcome="ok") == 1

    # (b) The holder had no Kerberos credentials, only the token, which the client selected.
    assert (result["holder"], result["holder_auth"]) == (user, "SIMPLE")
    assert result["holder_kerberos"] is False
    assert result["token_selected"] is True
    assert (result["created"], result["read"]) == (name, name)
    # Hadoop normalises the URI (file:/...): the same folder.
    assert Path(urlparse(result["read_location"]).path) == kerberos_hms.warehouse / f"{name}.db"
    assert name in result["databases"]

    # One GSSAPI engine connection (the token's fetch), one DIGEST-MD5 (the token holder's),
    # which the metastore accepted through the relay.
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="gssapi", result="ok") == 1
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="digest-md5", result="ok") == 1
    assert proxy.metric("hmsproxy_client_auth_total", mechanism="digest-md5", result="failed") == 0
    assert proxy.metric("hmsproxy_requests_total", method="create_database", outcome="ok") == 1
    # The metastore checked the engine's token as it connected; the calls went out on the
    # proxy's own token connection for the user, as every engine's of that user do.
    assert proxy.metric("hmsproxy_kerberos_tokens_total", event="fetched") == 1

    # The metastore ran the token holder's calls as the user.
    assert callers(kerberos_hms, "CREATE_DATABASE", name) == [user]
    assert set(callers(kerberos_hms, "READ_DATABASE", name)) == {user}
