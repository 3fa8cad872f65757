"""A real Hive Metastore 2.3.10 from the pyspark jars, on Derby, on a free port."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from xml.sax.saxutils import escape

from tests.rig import java
from tests.rig.ports import free_port, wait_for_port
from tests.rig.service import Service

LOG4J2 = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %-5p %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""


# What CallerLog.java writes to the log as a slow call begins.
SLOW_CALL_STARTED = "hmsproxy.rig.CallerLog: slow call started: "


class MetastoreServer(Service):
    """One HMS process with its own Derby folder and warehouse under ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        *,
        framed: bool = False,
        port: int | None = None,
        keystore: Path | None = None,
        keystore_password: str = "",
        locks: bool = False,
        txn_timeout: float = 300.0,
    ) -> None:
        self.workdir = workdir
        # A metastore that can grant locks (Iceberg's commits need one): DBCP, which 2.3's
        # TxnHandler can use (it knows BoneCP, which the pyspark jars lack, and DBCP; not
        # HikariCP), and the transaction tables (tests/rig/java/TxnTables.java).
        self.locks = locks
        self.txn_timeout = txn_timeout  # hive.txn.timeout: a lock not heartbeated dies after it
        self.framed = framed
        self.keystore = keystore  # a PKCS#12 keystore: the metastore speaks TLS
        self.keystore_password = keystore_password
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.warehouse = workdir / "warehouse"
        self.caller_log = workdir / "callers.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"thrift://{self.host}:{self.port}"

    def _site(self) -> dict[str, str]:
        tls = {}
        if self.keystore is not None:
            tls = {
                "hive.metastore.use.SSL": "true",
                "hive.metastore.keystore.path": str(self.keystore),
                "hive.metastore.keystore.password": self.keystore_password,
            }
        locking = {}
        listeners = "hmsproxy.rig.NotificationLog"
        if self.locks:
            listeners = "hmsproxy.rig.TxnTables," + listeners
            locking = {
                "datanucleus.connectionPoolingType": "DBCP",
                "hive.txn.timeout": f"{self.txn_timeout:g}s",
                # Locks not heartbeated for hive.txn.timeout are reaped by the housekeeper,
                # which 2.3 starts only with the compactor's initiator and an ACID
                # transaction manager; reap every second.
                "hive.compactor.initiator.on": "true",
                "hive.txn.manager": "org.apache.hadoop.hive.ql.lockmgr.DbTxnManager",
                "hive.support.concurrency": "true",
                "hive.timedout.txn.reaper.start": "1s",
                "hive.timedout.txn.reaper.interval": "1s",
            }
        return (
            tls
            | {
                "javax.jdo.option.ConnectionURL": (
                    f"jdbc:derby:;databaseName={self.workdir / 'metastore_db'};create=true"
                ),
                "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
                "datanucleus.schema.autoCreateAll": "true",
                "hive.metastore.schema.verification": "false",
                "hive.metastore.warehouse.dir": self.warehouse.as_uri(),
                "hive.metastore.thrift.framed.transport.enabled": str(self.framed).lower(),
                # 2.3 defaults to BoneCP, which the pyspark jars lack; HikariCP is there.
                "datanucleus.connectionPoolingType": "HikariCP",
                "hive.metastore.pre.event.listeners": "hmsproxy.rig.CallerLog",
                # The rig's own stand-in for DbNotificationListener (not in the pyspark jars).
                "hive.metastore.event.listeners": listeners,
                "hmsproxy.rig.caller.log": str(self.caller_log),
                # No hadoop-aws in the pyspark jars: a stand-in lets tables live on s3:// and
                # s3a:// (see ObjectStoreStub.java; the proxy lists the real objects itself).
                "fs.s3.impl": "hmsproxy.rig.ObjectStoreStub",
                "fs.s3a.impl": "hmsproxy.rig.ObjectStoreStub",
                "fs.s3.impl.disable.cache": "true",
                "fs.s3a.impl.disable.cache": "true",
                # Partition-level column statistics are on in Hive by default; keep the default.
            }
            | locking
        )

    def start(self, timeout: float = 180) -> None:
        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        props = "".join(
            f"<property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
            for k, v in self._site().items()
        )
        (conf / "hive-site.xml").write_text(f"<configuration>\n{props}</configuration>\n")
        (conf / "log4j2.properties").write_text(LOG4J2)
        classes = java.compiled_helpers()
        command = [
            "java",
            "-Xmx768m",
            "-XX:+UseSerialGC",
            "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
            f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
            "-cp",
            java.classpath(conf, classes),
            "org.apache.hadoop.hive.metastore.HiveMetaStore",
            "-p",
            str(self.port),
        ]
        with open(self.workdir / "hms.log", "ab") as log:  # the process keeps its own copy
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        try:
            wait_for_port(self.port, timeout, alive=lambda: self.process.poll() is None)  # type: ignore[union-attr]
        except Exception as exc:
            raise RuntimeError(f"HMS did not start: {exc}\n{self.log_tail()}") from exc

    def log(self) -> str:
        path = self.workdir / "hms.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def slow_calls_started(self) -> int:
        """How many slow calls (see CallerLog.java) this HMS has begun, restarts included:
        each says so in the log as it begins its pause."""
        return self.log().count(SLOW_CALL_STARTED)

    def kill(self) -> None:
        """SIGKILL, as a crashed or OOM-killed metastore goes."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def callers(self) -> list[tuple[str, str, str]]:
        """(event, target, user) lines the HMS recorded, in order."""
        if not self.caller_log.exists():
            return []
        out = []
        for line in self.caller_log.read_text().splitlines():
            event, target, user = line.split(" ")
            out.append((event, target, user))
        return out
