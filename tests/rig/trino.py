"""A real Trino server (476, from Maven Central: tests/rig/maven/trino/pom.xml), one coordinator
that is its own worker, with the catalogs its caller gives, and a small client of Trino's HTTP
protocol.

The server runs straight from the unpacked ``trino-server-core`` (its ``lib/`` on the class
path, ``io.trino.server.TrinoServer`` as main class, as ``bin/launcher run`` would), on the JDK
that :func:`tests.rig.maven.java_home` finds (Trino 476 needs Java 24 or newer). Its own
folder, under the caller's ``workdir``, holds ``etc/`` (config, log-level and catalog
properties; the node properties are system properties, as the launcher passes them),
``plugin/`` (the connector folders the catalogs need, linked) and ``data/``.

Tables live on the S3-compatible server the tests run (tests/rig/s3_server.py, moto), which
Trino reads and writes with its native S3 file system (:func:`s3_files`), the proxy lists
(``--s3-endpoint-url``), and the rig's metastore takes as locations (it sees every ``s3://``
path as an empty directory: tests/rig/java/ObjectStoreStub.java). Not the local file system:
Trino 476's native one (``fs.native-local.enabled``) takes ``file:`` locations but lists
their files as ``local:///...``, which the Hive connector then drops as outside the partition
(every read of a ``file:`` table is empty), and the metastore knows no ``local:`` scheme;
the HDFS file system (``fs.hadoop.enabled``) is not in the Maven Central plugin zip.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from tests.rig import engine_docs, maven
from tests.rig.ports import free_port
from tests.rig.s3_server import BUCKET, S3Server
from tests.rig.service import Service

# Trino 476 refuses to start on a JDK older than this.
JAVA = 24

# The notification poll of the proxies the e2e Trino tests start (the proxy's default).
POLL = 1.0

# The JVM's flags, measured on 2 cores (start to ready, with the e2e module's five
# catalogs): the client compiler only, 12-17 s against 20-23 s with both compilers (the
# server compiler's work pays off in long runs; the tests' queries are small); the serial
# collector, whose start is as quick as G1's with 100 MB less memory (Trino only warns);
# an AppCDS archive (-XX:+AutoCreateSharedArchive) saved nothing measurable, as the plugins'
# classes come from their own class loaders. The rest is what Trino's own jvm.config sets
# for its libraries.
JVM_FLAGS = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:ReservedCodeCacheSize=128M",
    "-Djdk.attach.allowAttachSelf=true",
    "-XX:+EnableDynamicAgentLoading",
    "--enable-native-access=ALL-UNNAMED",
    "-Dfile.encoding=UTF-8",
)

# Connector name -> the plugin folder (a part of the maven pom) that serves it.
PLUGINS = {"hive": "trino-hive", "iceberg": "trino-iceberg"}

# Seconds after the start in which a query refused NO_NODES_AVAILABLE is sent again (query).
SETTLING = 30.0

# Operators that read a table's splits: each split a driver of its own.
SCAN_OPERATORS = ("TableScanOperator", "ScanFilterAndProjectOperator")


def s3_files(endpoint: str, access_key: str, secret_key: str, region: str) -> dict[str, str]:
    """Catalog properties for tables on an S3-compatible server (tests/rig/s3_server.py):
    Trino's native S3 file system, path-style."""
    return {
        "fs.native-s3.enabled": "true",
        "s3.endpoint": endpoint,
        "s3.path-style-access": "true",
        "s3.aws-access-key": access_key,
        "s3.aws-secret-key": secret_key,
        "s3.region": region,
    }


def hive_catalog(metastore_uri: str, files: dict[str, str], **extra: str) -> dict[str, str]:
    """A Hive-connector catalog as docs/engines.md's Trino snippet has it (Trino's own
    metastore caches off, its timeouts and retries), on ``metastore_uri``, its tables on
    ``files`` (see :func:`s3_files`); ``extra`` on top (it may turn the caches on:
    ``**{"hive.metastore-cache-ttl": "60s"}``)."""
    return engine_docs.configured("Trino", metastore_uri) | files | extra


def iceberg_catalog(metastore_uri: str, files: dict[str, str], **extra: str) -> dict[str, str]:
    """An Iceberg-connector catalog as docs/engines.md's Trino snippet under Iceberg has it,
    whose catalog is the metastore at ``metastore_uri``."""
    return engine_docs.configured("Iceberg", metastore_uri) | files | extra


class TrinoError(RuntimeError):
    """A query Trino failed: ``name`` is its error name (``TABLE_NOT_FOUND``, ...)."""

    def __init__(self, query_id: str, name: str, message: str) -> None:
        super().__init__(f"{name}: {message} (query {query_id})")
        self.query_id = query_id
        self.name = name
        self.message = message


@dataclass(frozen=True)
class Result:
    query_id: str
    columns: list[str]
    rows: list[list[Any]]


class TrinoServer(Service):
    """One Trino process under ``workdir`` with ``catalogs`` (catalog name -> properties, see
    :func:`hive_catalog`); ``heap`` its -Xmx (it starts with 384M too: queries may use
    ``query_memory``, and Trino keeps 30% of the heap beside it)."""

    NAME = "Trino"
    PARTS = "trino"  # its pom under tests/rig/maven
    MAIN_CLASS = "io.trino.server.TrinoServer"
    LOG_PACKAGE = "io.trino"
    JVM_FLAGS = JVM_FLAGS

    def __init__(
        self,
        workdir: Path,
        catalogs: dict[str, dict[str, str]],
        *,
        heap: str = "768M",
        query_memory: str = "256MB",
        config: dict[str, str] | None = None,
        jvm_flags: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.catalogs = catalogs
        self.heap = heap
        self.query_memory = query_memory
        self.extra_config = dict(config or {})
        self.jvm_flags = jvm_flags
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None  # seconds from the process's start to ready
        self.ready_at: float | None = None  # time.monotonic() of that
        self.log_path = workdir / "trino.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _layout(self, parts: Path) -> None:
        etc = self.workdir / "etc"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        plugins = self.workdir / "plugin"
        plugins.mkdir(exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        for connector in sorted({c["connector.name"] for c in self.catalogs.values()}):
            if not (plugins / connector).exists():
                self._link_plugin(parts, connector, plugins / connector)
        config = self.config(plugins) | self.extra_config
        write_properties(etc / "config.properties", config)
        write_properties(etc / "log.properties", {self.LOG_PACKAGE: "INFO"})
        for name, properties in self.catalogs.items():
            write_properties(etc / "catalog" / f"{name}.properties", properties)

    def config(self, plugins: Path) -> dict[str, str]:
        """config.properties, before the caller's ``config``."""
        return {
            "coordinator": "true",
            "node-scheduler.include-coordinator": "true",
            "http-server.http.port": str(self.port),
            "discovery.uri": self.url,
            "query.max-memory": self.query_memory,
            "query.max-memory-per-node": self.query_memory,
            "plugin.dir": str(plugins),
            "catalog.config-dir": str(self.workdir / "etc" / "catalog"),
            "http-server.log.enabled": "false",
            # Two cores: as many threads as there is work for.
            "task.concurrency": "2",
            "task.max-worker-threads": "4",
        }

    def _link_plugin(self, parts: Path, connector: str, into: Path) -> None:
        into.symlink_to(parts / PLUGINS[connector], target_is_directory=True)

    def node_properties(self) -> dict[str, str]:
        return {
            "node.environment": "rig",
            "node.id": f"rig-{self.port}",
            "node.data-dir": str(self.workdir / "data"),
            # Listen on the loopback only, and be known there.
            "node.bind-ip": "127.0.0.1",
            "node.internal-address": "127.0.0.1",
        }

    def java(self) -> Path:
        return maven.java_home(JAVA) / "bin" / "java"

    def classpath(self, parts: Path) -> str:
        return str(parts / "trino-server-core" / "lib" / "*")

    def command(self, parts: Path) -> list[str]:
        etc = self.workdir / "etc"
        return [
            str(self.java()),
            f"-Xmx{self.heap}",
            *self.JVM_FLAGS,
            *self.jvm_flags,
            f"-Dconfig={etc / 'config.properties'}",
            f"-Dlog.levels-file={etc / 'log.properties'}",
            # node.properties, which bin/launcher hands the server as system properties.
            *(f"-D{k}={v}" for k, v in self.node_properties().items()),
            "-cp",
            self.classpath(parts),
            self.MAIN_CLASS,
        ]

    def start(self, timeout: float = 300) -> Self:
        parts = maven.resolved(self.PARTS)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._layout(parts)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:  # the process keeps its own copy
            self.process = subprocess.Popen(
                self.command(parts),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"},
                start_new_session=True,
            )
        deadline = started + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.NAME} exited with {self.process.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
            info = self._info()
            if info is not None and info.get("starting") is False:
                break
            if time.monotonic() > deadline:
                self.stop()  # not left running by a caller that never got it back
                raise RuntimeError(
                    f"{self.NAME} not started after {timeout:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.25)
        self.started_in = time.monotonic() - started
        self.ready_at = time.monotonic()
        return self

    def _info(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/info", timeout=5) as reply:
                info: dict[str, Any] = json.load(reply)
                return info
        except (OSError, ValueError):
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    # The client: Trino's HTTP protocol (POST /v1/statement, then nextUri until there is none).

    def _request(
        self, method: str, url: str, user: str, body: bytes | None = None, **headers: str
    ) -> dict[str, Any]:
        request = urllib.request.Request(url, data=body, method=method)
        request.add_header("X-Trino-User", user)
        for key, value in headers.items():
            request.add_header(key, value)
        for attempt in range(20):
            try:
                with urllib.request.urlopen(request, timeout=120) as reply:
                    body = reply.read()
                    answer: dict[str, Any] = json.loads(body) if body else {}
                    return answer
            except urllib.error.HTTPError as exc:
                # 502/503/504: the protocol says retry the same URI.
                if exc.code not in (502, 503, 504) or attempt == 19:
                    raise
            time.sleep(0.1)
        raise AssertionError("unreachable")

    def query(
        self,
        sql: str,
        *,
        catalog: str | None = None,
        schema: str | None = None,
        session: dict[str, str] | None = None,
        user: str = "rig",
        timeout: float = 300,
    ) -> Result:
        """Run ``sql`` to its end: its columns and every row; :class:`TrinoError` if it fails.

        Just after the start, a query of a connector's catalog may fail NO_NODES_AVAILABLE:
        the coordinator (its own worker) has not yet seen itself announce the catalogs, and
        each catalog's node map, once read empty, is kept for 5 s. Such a query failed while
        being scheduled, before any task ran; it is sent again for up to ``SETTLING`` s."""
        while True:
            try:
                return self._query(sql, catalog, schema, session, user, timeout)
            except TrinoError as exc:
                settled = self.ready_at is None or time.monotonic() > self.ready_at + SETTLING
                if exc.name != "NO_NODES_AVAILABLE" or settled:
                    raise
            time.sleep(0.5)

    def _query(
        self,
        sql: str,
        catalog: str | None,
        schema: str | None,
        session: dict[str, str] | None,
        user: str,
        timeout: float,
    ) -> Result:
        headers = {}
        if catalog:
            headers["X-Trino-Catalog"] = catalog
        if schema:
            headers["X-Trino-Schema"] = schema
        if session:
            headers["X-Trino-Session"] = ",".join(f"{k}={v}" for k, v in session.items())
        answer = self._request("POST", f"{self.url}/v1/statement", user, sql.encode(), **headers)
        deadline = time.monotonic() + timeout
        columns: list[str] = []
        rows: list[list[Any]] = []
        while True:
            if answer.get("columns") and not columns:
                columns = [c["name"] for c in answer["columns"]]
            rows += answer.get("data") or []
            error = answer.get("error")
            if error:
                raise TrinoError(
                    answer["id"], error.get("errorName", "?"), error.get("message", "")
                )
            next_uri = answer.get("nextUri")
            if next_uri is None:
                return Result(answer["id"], columns, rows)
            if time.monotonic() > deadline:
                self._request("DELETE", next_uri, user)
                raise TimeoutError(f"query {answer['id']} not done after {timeout:g} s: {sql}")
            answer = self._request("GET", next_uri, user)

    def rows(self, sql: str, **kwargs: Any) -> list[list[Any]]:
        return self.query(sql, **kwargs).rows

    def query_info(self, query_id: str, user: str = "rig") -> dict[str, Any]:
        """``GET /v1/query/{id}``: the query's info, its ``queryStats`` among it."""
        return self._request("GET", f"{self.url}/v1/query/{query_id}", user)

    def scan_splits(self, query_id: str) -> int:
        """How many splits the query's table scans read: each split of a scan is a driver of
        its own, so the drivers of the scan operators (``queryStats.operatorSummaries``) are
        its splits."""
        summaries = self.query_info(query_id)["queryStats"]["operatorSummaries"]
        return sum(s["totalDrivers"] for s in summaries if s["operatorType"] in SCAN_OPERATORS)


def results(server: TrinoServer, statements: list[str], catalog: str, schema: str) -> list[Any]:
    """Each statement's text and what it gave: columns, rows and, for a query, the splits
    its scans read (partition pruning shows there), with ``catalog`` and ``schema`` made
    neutral, so runs of one sequence in different catalogs compare equal."""

    def neutral(text: str) -> str:
        return text.replace(catalog, "C").replace(schema, "S")

    out: list[Any] = []
    for sql in statements:
        result = server.query(sql)
        splits = server.scan_splits(result.query_id) if sql.startswith("SELECT") else None
        out.append((neutral(sql), neutral(repr((result.columns, result.rows, splits)))))
    return out


def write_properties(path: Path, properties: dict[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))


# -- the statement sequence of the e2e Trino tests (issue 40, item 1) ------------------------------


def statements(catalog: str, schema: str) -> list[str]:
    """Issue 40, item 1, as one sequence in ``catalog.schema``. RENAME is of an external,
    unpartitioned table: the rig's metastore cannot move a managed table's S3 files (it sees
    S3 through a stand-in, tests/rig/java/ObjectStoreStub.java, for which every path exists,
    so HMS 2.3 refuses the rename: "New location for this table ... already exists"); and HMS
    2.3 on Derby, straight or through the proxy, cannot drop a partitioned table renamed with
    partition column statistics (which Trino's INSERT writes): the DELETE of its partitions
    violates ``PART_COL_STATS_FK1``."""
    s = f"{catalog}.{schema}"
    where = f"s3://{BUCKET}/{catalog}/{schema}"
    return [
        f"CREATE SCHEMA {s} WITH (location = '{where}')",
        f"CREATE TABLE {s}.events (id bigint, name varchar, ds varchar)"
        " WITH (partitioned_by = ARRAY['ds'])",
        # Two new partitions, then one existing and one new.
        f"INSERT INTO {s}.events VALUES (1, 'a', '2024-01-01'), (2, 'b', '2024-01-02')",
        f"INSERT INTO {s}.events VALUES (3, 'c', '2024-01-01'), (4, 'd', '2024-01-03')",
        f"SELECT id, name FROM {s}.events WHERE ds = '2024-01-01' ORDER BY id",
        f"SELECT count(*) FROM {s}.events WHERE ds >= '2024-01-02'",
        f'SELECT ds FROM {s}."events$partitions" ORDER BY ds',
        f"ANALYZE {s}.events",
        f"SHOW STATS FOR {s}.events",
        f"SHOW STATS FOR (SELECT * FROM {s}.events WHERE ds = '2024-01-01')",
        f"ALTER TABLE {s}.events ADD COLUMN note varchar",
        f"INSERT INTO {s}.events VALUES (5, 'e', 'new', '2024-01-02')",
        f"SELECT * FROM {s}.events ORDER BY id",
        f"DESCRIBE {s}.events",
        f"CREATE TABLE {s}.ext (id bigint, name varchar) WITH (external_location = '{where}/ext')",
        f"INSERT INTO {s}.ext VALUES (7, 'g')",
        f"ALTER TABLE {s}.ext RENAME TO {s}.ext_renamed",
        f"SELECT * FROM {s}.ext_renamed",
        f"SHOW STATS FOR {s}.ext_renamed",
        f"SHOW TABLES FROM {s}",
        f"DROP TABLE {s}.events",
        f"DROP TABLE {s}.ext_renamed",
        f"SHOW TABLES FROM {s}",
        f"DROP SCHEMA {s}",
        f"SHOW SCHEMAS FROM {catalog} LIKE '{schema}'",
    ]


def run(trino: TrinoServer, s3: S3Server, catalog: str, schema: str) -> list[Any]:
    """The results of ``statements`` in ``catalog.schema`` (tests.rig.trino.results)."""
    # An external table's location must exist before CREATE TABLE (a hidden marker: Hive
    # skips files whose names start with a dot).
    s3.client().put_object(Bucket=BUCKET, Key=f"{catalog}/{schema}/ext/.keep", Body=b"")
    return results(trino, statements(catalog, schema), catalog, schema)


def direct_run(trino: TrinoServer, s3: S3Server) -> list[Any]:
    """The statements straight at the metastore (catalog ``hive_direct``), checked to be
    worth comparing: the pruned scan read its partition's two files only, the statements
    after ADD COLUMN, ANALYZE and RENAME see what they should, and all is dropped at the end."""
    results = run(trino, s3, "hive_direct", "seq_direct")
    by_sql = dict(results)
    pruned = "SELECT id, name FROM C.S.events WHERE ds = '2024-01-01' ORDER BY id"
    assert by_sql[pruned] == repr((["id", "name"], [[1, "a"], [3, "c"]], 2))
    partitions = 'SELECT ds FROM C.S."events$partitions" ORDER BY ds'
    assert "[['2024-01-01'], ['2024-01-02'], ['2024-01-03']]" in by_sql[partitions]
    # ANALYZE wrote statistics that Trino reads back (ids 1 to 4, 2 distinct per partition).
    assert "['id', None, 2.0, 0.0, None, '1', '4']" in by_sql["SHOW STATS FOR C.S.events"]
    assert "[5, 'e', 'new', '2024-01-02']" in by_sql["SELECT * FROM C.S.events ORDER BY id"]
    assert by_sql["SELECT * FROM C.S.ext_renamed"] == repr((["id", "name"], [[7, "g"]], 1))
    assert by_sql["SHOW SCHEMAS FROM C LIKE 'S'"] == repr((["Schema"], [], None))
    return results
