"""Real Hive standalone metastores 3.1.3 and 4.0.1 from Maven Central, on Derby, on a free port.

The parts come from ``tests/rig/maven/hive-<version>/pom.xml`` (tests/rig/maven.py): Hive's own
binary tarball of the standalone metastore (its ``lib/`` and the schematool's SQL scripts),
Hadoop's shaded client jars, and the few jars the tarball expects from a Hadoop install.

Each metastore runs as its version ships, with what the proxy's tests need on:

* the schema Hive's own schematool creates (``-initSchema -dbType derby``): the metastore's
  tables, the transaction and lock tables and the notification log, checked by the metastore
  at start-up (``metastore.schema.verification`` stays on). The schematool runs once per
  version into a template database that each metastore copies (seconds saved per start);
* the notification log: 3.1.3 with Hive's real ``DbNotificationListener`` (hcatalog's server
  extensions 3.1.3, json-0.2 messages); 4.0.1 with the rig's stand-in
  (tests/rig/java-hive4/NotificationLog.java: hcatalog's extensions are not published for
  4.0.x), a transactional listener writing Hive 4's own messages (gzip(json-2.0));
* tables on ``s3://`` and ``s3a://`` locations (the moto S3 server the Trino tests write to):
  the 2.3.10 rig's stand-in file system (tests/rig/java/ObjectStoreStub.java, compiled against
  each version's Hadoop jars), for which every path is an existing empty directory; the
  tarballs have no hadoop-aws;
* transactions and locks (``lock``/``check_lock``/``unlock``, as Iceberg's commits take), with
  the housekeeper reaping locks not heartbeated for ``txn_timeout`` seconds.

The class is a :class:`tests.rig.hms.MetastoreServer` (uri, port, host, warehouse, workdir,
start/stop/kill, log/log_tail, a ``with`` block), started by a different command.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.rig import machine, maven
from tests.rig.hms import CONSOLE_LOG4J2, MetastoreServer, write_site

VERSIONS = ("3.1.3", "4.0.1")
STAND_INS = Path(__file__).resolve().parent / "java-hive4"
# The 2.3.10 rig's S3 stand-in (see tests/rig/hms.py), compiled with each version's jars.
OBJECT_STORE = Path(__file__).resolve().parent / "java" / "ObjectStoreStub.java"

# The start-up line of each, and the one that says the notification listener is the one asked.
LOG4J2 = (
    CONSOLE_LOG4J2
    + """\
logger.start.name = org.apache.hadoop.hive.metastore.HiveMetaStore
logger.start.level = info
logger.start.filter.lines.type = RegexFilter
logger.start.filter.lines.regex = .*(Starting hive metastore on port|Started the new metaserver).*
logger.start.filter.lines.onMatch = ACCEPT
logger.start.filter.lines.onMismatch = DENY
"""
)


@dataclass(frozen=True)
class Kind:
    pom: str  # tests/rig/maven/<pom>/pom.xml
    home: str  # the tarball's folder, unpacked under the resolved parts
    schematool: str
    listener: str  # hive.metastore.transactional.event.listeners
    housekeeper: str  # reaps timed-out transactions and locks


KINDS = {
    "3.1.3": Kind(
        pom="hive-3.1.3",
        home="hive-standalone-metastore",
        schematool="org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool",
        listener="org.apache.hive.hcatalog.listener.DbNotificationListener",
        housekeeper="org.apache.hadoop.hive.metastore.txn.AcidHouseKeeperService",
    ),
    "4.0.1": Kind(
        pom="hive-4.0.1",
        home="hive-standalone-metastore-server",
        schematool="org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool",
        listener="hmsproxy.rig.hive4.NotificationLog",
        housekeeper="org.apache.hadoop.hive.metastore.txn.service.AcidHouseKeeperService",
    ),
}

JVM = [
    "java",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",  # see tests/rig/hms.py
    "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
]


def parts(version: str) -> Path:
    """The resolved parts of ``version`` (downloaded on first use; ~/.m2 keeps them)."""
    return maven.resolved(KINDS[version].pom)


def classpath(version: str, conf: Path) -> str:
    base = parts(version)
    jars = [conf, base / KINDS[version].home / "lib" / "*", base / "lib" / "*"]
    return ":".join(str(p) for p in [_stand_ins(version), *jars])


def _stand_ins(version: str) -> Path:
    """The rig's Java stand-ins compiled against ``version``'s jars, once per content:
    ObjectStoreStub.java for every version, tests/rig/java-hive4/*.java for 4.0.1."""
    sources = [OBJECT_STORE]
    if version == "4.0.1":
        sources += sorted(STAND_INS.glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    out = parts(version) / f"classes-{digest}"
    if (out / ".done").exists():
        return out
    with machine.alone(f"hive-{version}-classes", maven.OUT):
        if (out / ".done").exists():
            return out
        building = Path(tempfile.mkdtemp(prefix=".classes-", dir=parts(version)))
        try:
            lib = parts(version)
            cp = f"{lib / KINDS[version].home / 'lib' / '*'}:{lib / 'lib' / '*'}"
            done = subprocess.run(
                ["javac", "-nowarn", "-d", str(building), "-cp", cp, *map(str, sources)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"javac failed on {[str(p) for p in sources]}:\n{done.stderr[-2000:]}"
                )
            (building / ".done").touch()
            shutil.rmtree(out, ignore_errors=True)
            building.rename(out)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return out


def schema_template(version: str) -> Path:
    """A Derby database holding the schema ``version``'s schematool creates, made once."""
    kind = KINDS[version]
    out = parts(version) / "derby-template"
    if (out / ".done").exists():
        return out / "metastore_db"
    with machine.alone(f"hive-{version}-schema", maven.OUT):
        if (out / ".done").exists():
            return out / "metastore_db"
        shutil.rmtree(out, ignore_errors=True)
        building = Path(tempfile.mkdtemp(prefix=".derby-", dir=parts(version)))
        try:
            conf = building / "conf"
            conf.mkdir()
            db = building / "metastore_db"
            write_site(conf / "metastore-site.xml", _database(db, create=True))
            (conf / "log4j2.properties").write_text(CONSOLE_LOG4J2)
            done = subprocess.run(
                [
                    *JVM,
                    f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
                    "-cp",
                    classpath(version, conf),
                    kind.schematool,
                    "-initSchema",
                    "-dbType",
                    "derby",
                ],
                capture_output=True,
                text=True,
                check=False,
                cwd=building,
                env=os.environ | {"METASTORE_HOME": str(parts(version) / kind.home)},
                timeout=300,
            )
            if done.returncode != 0 or "script completed" not in done.stdout + done.stderr:
                raise RuntimeError(
                    f"Hive {version}'s schematool failed:\n{(done.stdout + done.stderr)[-3000:]}"
                )
            shutil.rmtree(conf)
            (building / ".done").touch()
            building.rename(out)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return out / "metastore_db"


def _database(db: Path, *, create: bool = False) -> dict[str, str]:
    return {
        "javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={db}" + (";create=true" if create else "")
        ),
        "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
    }


class HiveMetastore(MetastoreServer):
    """A real Hive standalone metastore of ``version`` (one of VERSIONS) with its own Derby
    database and warehouse under ``workdir``; see the module docstring."""

    def __init__(
        self,
        version: str,
        workdir: Path,
        *,
        port: int | None = None,
        framed: bool = False,
        txn_timeout: float = 300.0,
    ) -> None:
        if version not in KINDS:
            raise ValueError(f"version: one of {VERSIONS}, not {version!r}")
        super().__init__(workdir, port=port, framed=framed, locks=True, txn_timeout=txn_timeout)
        self.version = version
        self.started_in: float | None = None  # seconds from the command to an open port

    def _site(self) -> dict[str, str]:
        kind = KINDS[self.version]
        return _database(self.workdir / "metastore_db") | {
            "hive.metastore.warehouse.dir": self.warehouse.as_uri(),
            "hive.metastore.thrift.framed.transport.enabled": str(self.framed).lower(),
            # The standalone metastore's own default (its conf/metastore-site.xml): the default
            # proxy is in hive-exec, which a standalone metastore does not have.
            "metastore.expression.proxy": (
                "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy"
            ),
            # The notification log, written in each change's own transaction.
            "hive.metastore.transactional.event.listeners": kind.listener,
            # get_next_notification and get_current_notificationEventId for any user (Hive 3+
            # allows only proxy-privileged users by default).
            "hive.metastore.event.db.notification.api.auth": "false",
            # Transactions and locks (the tables are the schematool's).
            "hive.support.concurrency": "true",
            "hive.txn.manager": "org.apache.hadoop.hive.ql.lockmgr.DbTxnManager",
            "hive.txn.timeout": f"{self.txn_timeout:g}s",
            "metastore.task.threads.always": (
                f"org.apache.hadoop.hive.metastore.events.EventCleanerTask,{kind.housekeeper}"
            ),
            "hive.timedout.txn.reaper.start": "1s",
            "hive.timedout.txn.reaper.interval": "1s",
            "metastore.acid.housekeeper.interval": "1s",
            # A call that fails in the database is retried 10 times 2 s apart (20 s: 3.1.3's
            # get_table_names_by_filter on a parameter filter always fails so on Derby);
            # 10 times 0.1 s apart here.
            "hive.hmshandler.retry.interval": "100ms",
            # No hadoop-aws in the tarballs: the rig's stand-in lets tables live on s3:// and
            # s3a:// (see ObjectStoreStub.java; the proxy and Trino reach the real objects).
            "fs.s3.impl": "hmsproxy.rig.ObjectStoreStub",
            "fs.s3a.impl": "hmsproxy.rig.ObjectStoreStub",
            "fs.s3.impl.disable.cache": "true",
            "fs.s3a.impl.disable.cache": "true",
        }

    def _write_conf(self, conf: Path) -> None:
        database = self.workdir / "metastore_db"
        if not database.exists():
            shutil.copytree(schema_template(self.version), database)
        write_site(conf / "metastore-site.xml", self._site())
        (conf / "log4j2.properties").write_text(LOG4J2)

    def _command(self, conf: Path) -> list[str]:
        return [
            *JVM,
            f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
            "-cp",
            classpath(self.version, conf),
            "org.apache.hadoop.hive.metastore.HiveMetaStore",
            "-p",
            str(self.port),
        ]

    def start(self, timeout: float = 180) -> None:
        # Downloaded, compiled and made once, before the clock starts.
        schema_template(self.version)
        _stand_ins(self.version)
        started = time.monotonic()
        super().start(timeout)
        self.started_in = time.monotonic() - started


REMOVED_IN_401 = ("get_table", "get_table_objects_by_name")


def removed(real: HiveMetastore, method: str) -> bool:
    return real.version >= "4.0.1" and method in REMOVED_IN_401
