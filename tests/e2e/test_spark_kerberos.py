"""Real Spark through the proxy as two Kerberos users at once, each from a ticket cache of
their own, against a Kerberized metastore: Spark's own Java client (Hive 2.3.10's
HadoopThriftAuthBridge) negotiates SASL GSSAPI with the proxy, alice with privacy
(auth-conf) and bob with authentication, and every call reaches the HMS as its own user
(through a delegation token of theirs), as the HMS's caller log shows.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.rig import spark
from tests.rig.hms import MetastoreServer
from tests.rig.kdc import Realm
from tests.rig.proxy_process import ProxyProcess, kerberos_options

pytestmark = [pytest.mark.hms, pytest.mark.spark]


def result_of(out: str) -> dict[str, object]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-4000:]
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def test_spark_as_two_users_through_the_proxy(
    tmp_path: Path, realm: Realm, kerberos_hms: MetastoreServer
) -> None:
    options = kerberos_options(realm, kerberos_hms)
    proxy = ProxyProcess(
        tmp_path, kerberos_hms.uri, *options, "--sasl-qop", "authentication,privacy"
    ).start()
    try:
        uri = f"thrift://localhost:{proxy.port}"  # _HOST in the principal becomes localhost
        principal = f"proxy/_HOST@{realm.name}"
        warehouse = kerberos_hms.warehouse.as_uri()
        users = {"alice": "privacy", "bob": "authentication"}
        outputs = {}
        with contextlib.ExitStack() as stack:  # both jobs at once
            jobs = {}
            for user, protection in users.items():
                env = spark.kerberos_env(realm, user, tmp_path, protection)
                args = (uri, warehouse, f"ks_{user}", principal, protection)
                jobs[user] = stack.enter_context(
                    spark.running("spark_kerberos_job", *args, env=env)
                )
            for user, process in jobs.items():
                outputs[user] = result_of(spark.finish(process))
        for user, result in outputs.items():
            assert result["partitions"] == ["ds=2024-01-01", "ds=2024-01-02"], user
            assert result["count"] == 2, user
            assert result["user"] == f"{user}@{realm.name}"
            assert result["authentication"] == "KERBEROS"
        # Every call on each user's database reached the HMS as that user.
        for user in users:
            seen = {who for _, target, who in kerberos_hms.callers() if f"ks_{user}" in target}
            assert seen == {user}, (user, seen)
        assert proxy.metric("hmsproxy_client_auth_total", mechanism="gssapi", result="ok") >= 2
        assert proxy.metric("hmsproxy_kerberos_tokens_total", event="fetched") == 2
    finally:
        proxy.stop()
