"""A real Hive Metastore 2.3.10 from the pyspark jars, on Derby, on a free port.

With ``kerberos=`` a Realm (tests/rig/kdc.py) it runs in secure mode: SASL GSSAPI with the
principal ``hive/localhost``, ``hadoop.rpc.protection`` as asked, and the proxy's principal
(short name ``proxy``) allowed to impersonate anyone, as a real proxy needs for per-user
delegation tokens. Clients ask for ``service@<host of the URI>``, so such a metastore's URI
says ``localhost``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from xml.sax.saxutils import escape

from tests.rig import java
from tests.rig.kdc import Realm
from tests.rig.ports import free_port, wait_for_port
from tests.rig.service import Service

# Warnings to stderr: the base of every rig JVM's log4j2 configuration.
CONSOLE_LOG4J2 = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %-5p %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""

LOG4J2 = (
    CONSOLE_LOG4J2
    + """\
# Two start-up lines say what the metastore came up as (secure or not, which port); the
# rest of HiveMetaStore's INFO (a line per call, the audit log) stays out.
logger.start.name = org.apache.hadoop.hive.metastore.HiveMetaStore
logger.start.level = info
logger.start.filter.lines.type = RegexFilter
logger.start.filter.lines.regex = .*(Secure Mode|new metaserver on port).*
logger.start.filter.lines.onMatch = ACCEPT
logger.start.filter.lines.onMismatch = DENY
# "Login successful for user hive/localhost@... using keytab file ...": the keytab worked.
logger.login.name = org.apache.hadoop.security.UserGroupInformation
logger.login.level = info
"""
)

# What HiveMetaStore logs before it listens when SASL is on.
SECURE_MODE = "Starting DB backed MetaStore Server in Secure Mode"
# hadoop.rpc.protection values (SASL QOP auth / auth-int / auth-conf).
PROTECTIONS = ("authentication", "integrity", "privacy")
# The metastore's service principal (its host is the URI's host: see the module docstring).
SERVICE = "hive/localhost"


# What CallerLog.java writes to the log as a slow call begins.
SLOW_CALL_STARTED = "hmsproxy.rig.CallerLog: slow call started: "


class MetastoreServer(Service):
    """One HMS process with its own Derby folder and warehouse under ``workdir``; Kerberized
    with ``kerberos`` (see the module docstring), SASL QOP from ``protection``."""

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
        kerberos: Realm | None = None,
        protection: str = "authentication",
        heap: str = "768m",
    ) -> None:
        if protection not in PROTECTIONS:
            raise ValueError(f"protection: one of {PROTECTIONS}, not {protection!r}")
        if kerberos is not None and framed:
            raise ValueError("a Kerberized metastore cannot be framed (SASL frames instead)")
        self.workdir = workdir
        self.kerberos = kerberos
        self.protection = protection
        # A metastore that can grant locks (Iceberg's commits need one): DBCP, which 2.3's
        # TxnHandler can use (it knows BoneCP, which the pyspark jars lack, and DBCP; not
        # HikariCP), and the transaction tables (tests/rig/java/TxnTables.java).
        self.locks = locks
        self.txn_timeout = txn_timeout  # hive.txn.timeout: a lock not heartbeated dies after it
        self.framed = framed
        self.keystore = keystore  # a PKCS#12 keystore: the metastore speaks TLS
        self.keystore_password = keystore_password
        self.port = port or free_port()
        # Kerberos: the host of the URI names the service principal (hive/localhost).
        self.host = "127.0.0.1" if kerberos is None else "localhost"
        self.warehouse = workdir / "warehouse"
        self.caller_log = workdir / "callers.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.heap = heap  # -Xmx: what a fetch of many partitions runs out of

    @property
    def uri(self) -> str:
        return f"thrift://{self.host}:{self.port}"

    @property
    def principal(self) -> str:
        """The metastore's own principal (``hive/localhost@REALM``); a client names it as
        ``hive/_HOST@REALM`` or in full."""
        if self.kerberos is None:
            raise ValueError("this metastore is not Kerberized")
        return self.kerberos.principal(SERVICE)

    def _secure_site(self) -> dict[str, str]:
        if self.kerberos is None:
            return {}
        return {
            "hive.metastore.sasl.enabled": "true",
            "hive.metastore.kerberos.principal": self.principal,
            "hive.metastore.kerberos.keytab.file": str(self.kerberos.add_service(SERVICE)),
        }

    def _core_site(self) -> dict[str, str]:
        """Hadoop's side of secure mode: the login user comes from the keytab, the SASL
        QOP from ``hadoop.rpc.protection``, and ``proxy`` (the proxy's principal's short
        name) and ``trino`` (an engine with impersonation, as Trino's) may act for any user
        from any host: get_delegation_token(user, ...) for another user needs it."""
        rights = {
            f"hadoop.proxyuser.{who}.{what}": "*"
            for who in ("proxy", "trino")
            for what in ("hosts", "groups", "users")
        }
        return {
            "hadoop.security.authentication": "kerberos",
            "hadoop.rpc.protection": self.protection,
        } | rights

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
            | self._secure_site()
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
                # A fetch of every partition of a table of 100,000 puts all their ids in one
                # IN (...) list, which Derby cannot compile ("Statement too complex"): 2.3
                # then falls back to its slow JDO path (131-151 s instead of 16-18 s, and a
                # full heap). A real database takes the list; batches of 1,000 are what the
                # metastore does on one that cannot.
                "hive.metastore.direct.sql.batch.size": "1000",
            }
            | locking
        )

    def _write_conf(self, conf: Path) -> None:
        write_site(conf / "hive-site.xml", self._site())
        if self.kerberos is not None:
            write_site(conf / "core-site.xml", self._core_site())
        (conf / "log4j2.properties").write_text(LOG4J2)

    def _command(self, conf: Path) -> list[str]:
        classes = java.compiled_helpers()
        return [
            "java",
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            # The client compiler only: a test's metastore lives seconds to minutes, and
            # starts in ~3.7 s instead of ~6 s (the server compiler's work is for long runs).
            "-XX:TieredStopAtLevel=1",
            *(kerberos_jvm_flags(self.kerberos) if self.kerberos is not None else []),
            "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
            f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
            "-cp",
            java.classpath(conf, classes),
            "org.apache.hadoop.hive.metastore.HiveMetaStore",
            "-p",
            str(self.port),
        ]

    def start(self, timeout: float = 180) -> None:
        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self._write_conf(conf)
        command = self._command(conf)
        with open(self.workdir / "hms.log", "ab") as log:  # the process keeps its own copy
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=os.environ | (self.kerberos.env if self.kerberos is not None else {}),
                start_new_session=True,
            )
        try:
            wait_for_port(self.port, timeout, alive=lambda: self.process.poll() is None)  # type: ignore[union-attr]
        except Exception as exc:
            raise RuntimeError(f"HMS did not start: {exc}\n{self.log_tail()}") from exc
        # The line comes before the port opens; without it the metastore is not using SASL
        # (it would accept anyone, and a Kerberos test against it would prove nothing).
        if self.kerberos is not None and SECURE_MODE not in self.log():
            raise RuntimeError(f"HMS did not start in secure mode:\n{self.log_tail()}")

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
        """(event, target, user) lines the HMS recorded, in order. The user is the short
        name of the identity the HMS ran the call as: without Kerberos, the connection's
        set_ugi user; with Kerberos, the SASL-authenticated principal mapped by Hadoop's
        default auth_to_local (``alice@REALM`` and ``alice/host@REALM`` → ``alice``), or, on a
        DIGEST-MD5 connection, the owner of its delegation token. set_ugi changes nothing
        under SASL."""
        if not self.caller_log.exists():
            return []
        out = []
        for line in self.caller_log.read_text().splitlines():
            event, target, user = line.split(" ")
            out.append((event, target, user))
        return out


def kerberos_jvm_flags(realm: Realm) -> list[str]:
    """What a JDK 17 metastore needs to log in from a keytab in ``realm``: the realm's
    krb5.conf (the JDK does not read KRB5_CONFIG; without it the login reads /etc/krb5.conf
    and fails "Cannot locate KDC"). The JDK's Kerberos internals are opened to Hadoop, which
    reflects into them in some versions; the Hadoop 3.5 of these jars logs in, accepts and
    maps principals without them (tried), so they are insurance, as are the referrals left
    off (one realm here)."""
    return [
        f"-Djava.security.krb5.conf={realm.krb5_conf}",
        "-Dsun.security.krb5.disableReferrals=true",
        "--add-opens=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
        "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    ]


def write_site(path: Path, properties: dict[str, str]) -> None:
    """A Hadoop-style ``*-site.xml``."""
    props = "".join(
        f"<property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
        for k, v in properties.items()
    )
    path.write_text(f"<configuration>\n{props}</configuration>\n")
