"""A real Presto server (0.287, from Maven Central: tests/rig/maven/presto/pom.xml), run as
tests/rig/trino.py runs Trino, whose :class:`TrinoServer` it extends: one coordinator that is its
own worker, with the catalogs its caller gives, and the same HTTP client (Presto's protocol is
Trino's with ``X-Presto-*`` headers for ``X-Trino-*``).

Presto 0.287 is built for Java 8 and 11; this machine kind has Java 17 (and 25). On 17 it runs
with three changes, each found by the error it starts with otherwise:

* ``--add-opens`` for the JDK internals its libraries reach into (:data:`ADD_OPENS`): Guice's
  cglib calls ``ClassLoader.defineClass`` ("module java.base does not "opens java.lang" to
  unnamed module"), and the Hive connector's ``HadoopFileSystemCache`` rewrites the final
  ``FileSystem.CACHE`` field through ``Class.getDeclaredFields0`` and ``Field.modifiers``;
* ASM 9.7.1 in place of the ASM 9.0 both the server's ``lib/`` and the Hive plugin carry: the
  Thrift codecs Presto generates at start, the server's and the Hive connector's, are checked
  against JDK classes, whose class files ASM 9.0 cannot read ("Unsupported class file major
  version 61"). The server takes it first on its class path; the plugin, whose class loader is
  its own, gets a folder of links to its jars with the ASM ones swapped
  (:meth:`PrestoServer._plugin`);
* a JDK no newer than 17 (:func:`java_home`): on the Temurin 25 beside it Presto does not start
  (ASM 9.7.1 reads no class file of Java 25: "Unsupported class file major version 69"), and
  on 18 and later ``HadoopFileSystemCache``'s write of a final static field is refused
  whatever the module flags (prestodb/presto#17952; not tried here).

Tables live on the S3-compatible server the tests run (tests/rig/s3_server.py), which the
Hive connector reads and writes with Presto's own S3 file system (:func:`s3_files`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.rig import engine_docs, maven
from tests.rig.trino import Result, TrinoError, TrinoServer

__all__ = ["PrestoError", "PrestoServer", "Result", "hive_catalog", "java_home", "s3_files"]

# What Presto 0.287 runs on: it is built for Java 11; see the module docstring for why not 18+.
JAVA = (11, 17)

# The module internals Presto's libraries open on Java 17 (see the module docstring): java.lang
# for Guice's cglib and the Hadoop cache, java.lang.reflect for the latter. Measured: without
# either Presto does not start; the e2e module's statements need no other.
ADD_OPENS = (
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
)

# tests/rig/trino.py's flags, but those a Java 17 lacks (-XX:+EnableDynamicAgentLoading).
JVM_FLAGS = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:ReservedCodeCacheSize=128M",
    "-Djdk.attach.allowAttachSelf=true",
    "-Dfile.encoding=UTF-8",
    *ADD_OPENS,
)

# Connector name -> the plugin folder of the server tarball that serves it.
PLUGINS = {"hive-hadoop2": "hive-hadoop2"}

PrestoError = TrinoError


def java_home() -> Path:
    """A JDK whose version is in :data:`JAVA` (this machine kind's default JDK, 17)."""
    return maven.java_home(*JAVA, needs="Presto 0.287")


def s3_files(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """Catalog properties for tables on an S3-compatible server (tests/rig/s3_server.py):
    Presto's S3 file system, path-style, plain HTTP."""
    return {
        "hive.s3.endpoint": endpoint,
        "hive.s3.path-style-access": "true",
        "hive.s3.ssl.enabled": "false",
        "hive.s3.aws-access-key": access_key,
        "hive.s3.aws-secret-key": secret_key,
    }


def hive_catalog(metastore_uri: str, files: dict[str, str], **extra: str) -> dict[str, str]:
    """A Hive-connector catalog as docs/engines.md's Presto snippet has it, on
    ``metastore_uri``, its tables on ``files`` (see :func:`s3_files`); ``extra`` on top."""
    return engine_docs.configured("Presto", metastore_uri) | files | extra


class PrestoServer(TrinoServer):
    """One Presto process under ``workdir`` with ``catalogs`` (see :func:`hive_catalog`); the
    rest as :class:`TrinoServer`."""

    NAME = "Presto"
    PARTS = "presto"
    MAIN_CLASS = "com.facebook.presto.server.PrestoServer"
    LOG_PACKAGE = "com.facebook.presto"
    JVM_FLAGS = JVM_FLAGS

    def __init__(self, workdir: Path, catalogs: dict[str, dict[str, str]], **kwargs: Any) -> None:
        super().__init__(workdir, catalogs, **kwargs)
        self.log_path = workdir / "presto.log"

    def config(self, plugins: Path) -> dict[str, str]:
        return super().config(plugins) | {
            "discovery-server.enabled": "true",
            "query.max-total-memory-per-node": self.query_memory,
        }

    def _link_plugin(self, parts: Path, connector: str, into: Path) -> None:
        """The plugin as a folder of links to its jars, its ASM jars the pom's newer ones (see
        the module docstring)."""
        into.mkdir()
        newer = sorted((parts / "lib").glob("asm*.jar"))
        for jar in sorted((parts / "presto-server" / "plugin" / PLUGINS[connector]).iterdir()):
            if not jar.name.startswith("asm"):
                (into / jar.name).symlink_to(jar)
        for jar in newer:
            (into / jar.name).symlink_to(jar)

    def java(self) -> Path:
        return java_home() / "bin" / "java"

    def classpath(self, parts: Path) -> str:
        # The pom's ASM first: the server's lib/ has an older one.
        return f"{parts / 'lib' / '*'}{os.pathsep}{parts / 'presto-server' / 'lib' / '*'}"

    def _request(
        self, method: str, url: str, user: str, body: bytes | None = None, **headers: str
    ) -> dict[str, Any]:
        # Trino's client, its X-Trino-* headers named as Presto's.
        presto = {k.replace("X-Trino-", "X-Presto-"): v for k, v in headers.items()}
        return super()._request(method, url, user, body, **{"X-Presto-User": user}, **presto)
