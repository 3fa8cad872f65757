"""Real Spark sessions (pyspark, ``local[1]``, Hive support) against a metastore URI.

A session lives in a process of its own (one per process): the jobs in ``tests/e2e`` build
theirs with ``session``, and the tests run them with ``running``. A job that must pause for
the test prints ``READY`` and waits for a file (``wait_for_go``); the test waits for that
line (``wait_ready``), does its part, creates the file, then ``finish``es the job.

Kerberos: the test gives the job ``kerberos_env`` (the user's ticket cache and a Hadoop
configuration that says ``kerberos``); the job builds its session with ``kerberos_conf``.
Both halves are needed: Hadoop's login user is made from HADOOP_CONF_DIR before any
``spark.hadoop.*`` setting applies (with only the Spark conf the client stays SIMPLE and
fails "Failed to find any Kerberos tgt"), and the metastore client's SASL settings come from
the Spark conf.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.rig import engine_docs
from tests.rig.hms import write_site
from tests.rig.kdc import Realm

REPO = Path(__file__).resolve().parents[2]


def session(uri: str, warehouse: str, app: str, conf: Mapping[str, str] | None = None) -> Any:
    """A Spark session whose Hive catalog is the metastore at ``uri``, configured as
    docs/engines.md says (its Spark snippet, tests.rig.engine_docs), with dynamic partitions
    allowed (non-strict), quiet logs and no UI; ``conf`` on top (``kerberos_conf``)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName(app)
    for key, value in engine_docs.configured("Spark", uri).items():
        builder = builder.config(key, value)
    builder = (
        builder.config("spark.sql.warehouse.dir", warehouse)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
    )
    conf = dict(conf or {})
    # The client compiler only (as the test metastores, tests.rig.hms): a job of a few
    # statements is mostly its JVM starting and warming up.
    options = conf.pop("spark.driver.extraJavaOptions", "")
    conf["spark.driver.extraJavaOptions"] = f"-XX:TieredStopAtLevel=1 {options}".strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.enableHiveSupport().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql("SET hive.exec.dynamic.partition.mode=nonstrict")
    return spark


def kerberos_conf(
    principal: str, krb5_conf: str | Path, protection: str | None = None
) -> dict[str, str]:
    """The Spark conf of a session whose metastore client speaks SASL GSSAPI to the service
    ``principal`` (``hive/_HOST@REALM``, or the proxy's ``proxy/_HOST@REALM``: ``_HOST``
    becomes the host of the metastore URI); ``protection`` is hadoop.rpc.protection (None:
    Hadoop's default, ``authentication``, which a ``privacy`` metastore refuses: "No common
    protection layer between client and server"). The driver's JDK reads the realm from
    ``krb5_conf`` (it ignores KRB5_CONFIG); Spark's launcher already opens the JDK's
    Kerberos internals to Hadoop."""
    conf = {
        "spark.hadoop.hive.metastore.sasl.enabled": "true",
        "spark.hadoop.hive.metastore.kerberos.principal": principal,
        "spark.hadoop.hadoop.security.authentication": "kerberos",
        "spark.driver.extraJavaOptions": f"-Djava.security.krb5.conf={krb5_conf}",
    }
    if protection is not None:
        conf["spark.hadoop.hadoop.rpc.protection"] = protection
    return conf


def kerberos_env(
    realm: Realm, user: str, workdir: Path, protection: str | None = None
) -> dict[str, str]:
    """The environment of a Spark job running as ``user`` (who must be ``realm.add_user``'d):
    a fresh TGT in a FILE ccache of the user's own (KRB5CCNAME, which the JDK reads
    directly), HADOOP_CONF_DIR with a core-site.xml saying ``kerberos`` (and
    ``protection``), and the realm's ``env`` (KRB5_CONFIG, for the job's own use in
    ``kerberos_conf``)."""
    ccache = realm.kinit(user, workdir / f"cc-{user}")
    conf_dir = workdir / f"hadoop-conf-{user}"
    conf_dir.mkdir(parents=True, exist_ok=True)
    core = {"hadoop.security.authentication": "kerberos"}
    if protection is not None:
        core["hadoop.rpc.protection"] = protection
    write_site(conf_dir / "core-site.xml", core)
    return realm.env | {"KRB5CCNAME": f"FILE:{ccache}", "HADOOP_CONF_DIR": str(conf_dir)}


def wait_for_go(path: str | Path) -> None:
    """In a job: say READY, then wait until the test creates ``path`` (no deadline here:
    the test has one, and kills the job when it runs out)."""
    print("READY", flush=True)
    while not Path(path).exists():
        time.sleep(0.1)


@contextlib.contextmanager
def running(
    job: str, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The job module ``tests.e2e.<job>`` running with ``args``, its output piped; killed on
    the way out if it has not ended. ``env`` is added to this process's environment
    (``kerberos_env``)."""
    process = subprocess.Popen(
        [sys.executable, "-m", f"tests.e2e.{job}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=os.environ | dict(env or {}),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_ready(job: subprocess.Popen[str]) -> None:
    """Until the job prints READY; fails with its errors if it ends first."""
    assert job.stdout is not None
    for line in job.stdout:
        if line.startswith("READY"):
            return
    raise AssertionError(job.stderr.read() if job.stderr else "the Spark job ended early")


def finish(job: subprocess.Popen[str], timeout: float = 600) -> str:
    """Wait for the job to end, and end well; its output."""
    out, err = job.communicate(timeout=timeout)
    assert job.returncode == 0, err[-4000:]
    return out


def run_job(uri: str, warehouse: Path, db: str) -> dict[str, object]:
    with running("spark_job", uri, warehouse.as_uri(), db) as job:
        out = finish(job)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-4000:]
    return dict(json.loads(lines[-1][len("RESULT ") :]))
