"""Java Iceberg's HiveCatalog as a writer process (tests/rig/iceberg_java/IcebergWriter.java).

The program runs on Iceberg's jars from Maven (tests/rig/maven/iceberg, resolved by
:func:`tests.rig.maven.resolved`) followed by the pyspark wheel's jars, which carry the Hive
2.3.10 metastore client and Hadoop. It is compiled once per content of its source and of the pom
into ``.rig/iceberg-classes-<digest>``, as :func:`tests.rig.java.compiled_helpers` does for the
rig's other Java helpers.

Below it, pyiceberg's side of the commit tests (tests/integration/test_iceberg.py and the tests
that run it beside Java Iceberg or against the real 3.1.3 and 4.0.1 metastores): its Hive
catalog straight at a metastore or through a proxy, a table to append to, and the two ways
its writers commit around another writer (in the window, and at once in threads).
"""

from __future__ import annotations

import hashlib
import itertools
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.hive import HiveCatalog
from pyiceberg.exceptions import CommitFailedException

from tests.rig import java, machine, maven
from tests.rig.proxy_process import ProxyProcess

SOURCES = Path(__file__).resolve().parent / "iceberg_java"
POM = maven.POMS / "iceberg" / "pom.xml"
# Small and quick to start: several of these run at once on two cores.
JVM_FLAGS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")


def classpath(classes: Path | None = None) -> str:
    lib = maven.resolved("iceberg") / "lib"
    first = [str(classes)] if classes else []
    return ":".join([*first, str(lib / "*"), str(java.spark_jars() / "*")])


def compiled() -> Path:
    """The classes folder of IcebergWriter, compiled once per content (one process at a time;
    built aside and renamed into place)."""
    sources = sorted(SOURCES.glob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [POM, *sources])).hexdigest()[:16]
    out = machine.RIG_DIR / f"iceberg-classes-{digest}"
    if (out / ".done").exists():
        return out
    cp = classpath()  # resolves the jars first (outside our own lock: maven has its own)
    with machine.alone("iceberg-classes"):
        if (out / ".done").exists():
            return out
        for left in [out, *machine.RIG_DIR.glob(".iceberg-classes-*")]:
            shutil.rmtree(left, ignore_errors=True)
        building = Path(tempfile.mkdtemp(prefix=".iceberg-classes-", dir=machine.RIG_DIR))
        try:
            done = subprocess.run(
                ["javac", "-nowarn", "-d", str(building), "-cp", cp, *map(str, sources)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"javac IcebergWriter failed:\n{done.stdout}{done.stderr}")
            (building / ".done").touch()
            building.rename(out)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return out


@dataclass
class Commit:
    snapshot_id: int
    records: int
    attempts: int  # 1, or more after conflicts Iceberg retried
    tag: str  # WRITER-i: its rows are tagged WRITER-i-0 .. WRITER-i-(records-1)

    def tags(self) -> list[str]:
        return [f"{self.tag}-{k}" for k in range(self.records)]


@dataclass
class Result:
    """What one writer process said: its acknowledged commits and its failed appends."""

    writer: str
    commits: list[Commit] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""


class Writer:
    """One IcebergWriter process: ``start()`` launches it and waits for READY, ``go()`` lets
    it append, ``result()`` waits for its end and parses what it printed."""

    def __init__(
        self, uri: str, table: str, writer: str, appends: int, warehouse: Path, tmp: Path
    ) -> None:
        self.writer = writer
        self.command = [
            "java",  # the machine's default (17), as javac compiled it
            *JVM_FLAGS,
            "-cp",
            classpath(compiled()),
            "IcebergWriter",
            uri,
            table,
            writer,
            str(appends),
            warehouse.as_uri(),
            "--wait",
        ]
        self.stderr_path = tmp / f"iceberg-writer-{writer}.stderr"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Writer:
        with self.stderr_path.open("w") as stderr:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        return self

    def ready(self, timeout: float = 90) -> None:
        """Until the writer has loaded the table and printed READY (or died); one that hangs
        instead is killed after ``timeout`` seconds."""
        assert self.proc is not None and self.proc.stdout is not None
        waiting = selectors.DefaultSelector()
        waiting.register(self.proc.stdout, selectors.EVENT_READ)
        if not waiting.select(timeout):
            self.stop()
            raise RuntimeError(
                f"Java writer {self.writer} not ready after {timeout:g} s:\n{self._stderr()}"
            )
        line = self.proc.stdout.readline()  # the JVM prints READY or dies
        if line.strip() != "READY":
            self.proc.wait(10)
            raise RuntimeError(
                f"Java writer {self.writer} did not start ({line!r}):\n{self._stderr()}"
            )

    def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()  # (result()'s communicate closes it)

    def result(self, timeout: float = 120) -> Result:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        got = Result(self.writer, returncode=self.proc.returncode, stderr=self._stderr())
        for line in out.splitlines():
            word, _, rest = line.partition(" ")
            if word == "COMMIT":
                snapshot, records, attempts, tag = rest.split()
                got.commits.append(Commit(int(snapshot), int(records), int(attempts), tag))
            elif word == "FAILED":
                got.failed.append(rest)
        if got.returncode != 0 or "DONE" not in out.splitlines():
            raise RuntimeError(
                f"Java writer {self.writer} ended with {got.returncode}:\n{out}\n{got.stderr}"
            )
        return got

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _stderr(self) -> str:
        text = self.stderr_path.read_text(errors="replace")
        return text[-4000:]


# -- pyiceberg's side ------------------------------------------------------------------------------

ROUNDS = 3  # commits in the window, each way
CONCURRENT = 3  # commits per writer thread
SCHEMA = pa.schema([pa.field("tag", pa.string())])
# Fences alone (the metastore's own check off), so that these tests show the fence works.
FENCE_ONLY = ("--cache-iceberg-tables", "on", "--iceberg-expected-location", "off")
_names = itertools.count()


def catalog(uri: str, warehouse: Path, **properties: str) -> HiveCatalog:
    return HiveCatalog(
        "test", uri=uri, warehouse=warehouse.as_uri(), **{"lock-check-retries": "12", **properties}
    )


def through(proxy: ProxyProcess, warehouse: Path, **properties: str) -> HiveCatalog:
    return catalog(f"thrift://127.0.0.1:{proxy.port}", warehouse, **properties)


def new_table(direct: HiveCatalog) -> str:
    namespace = f"ice_{next(_names)}_{int(time.time() * 1000) % 100000}"
    direct.create_namespace(namespace)
    direct.create_table(f"{namespace}.events", schema=SCHEMA)
    return f"{namespace}.events"


def append(cat: HiveCatalog, ident: str, tag: str, acked: list[str]) -> None:
    cat.load_table(ident).append(pa.table({"tag": [tag]}, schema=SCHEMA))
    acked.append(tag)  # the commit returned: it is acknowledged


def tags(direct: HiveCatalog, ident: str) -> list[str]:
    return sorted(direct.load_table(ident).scan().to_arrow()["tag"].to_pylist())


def in_the_window(direct: HiveCatalog, via: HiveCatalog, ident: str, acked: list[str]) -> None:
    """The proxy's writer builds on a table object it loaded (and the cache keeps) before the
    direct writer commits; then it commits."""
    for i in range(ROUNDS):
        stale = via.load_table(ident)
        append(direct, ident, f"direct-{i}", acked)
        stale.append(pa.table({"tag": [f"proxy-{i}"]}, schema=SCHEMA))
        acked.append(f"proxy-{i}")


def at_once(
    writers: list[tuple[str, Callable[[], HiveCatalog]]], ident: str, acked: list[str]
) -> int:
    """Writers committing back to back in threads; returns the commits that gave up (a
    commit that failed is not acknowledged, so it is not expected in the table)."""
    failed: list[str] = []

    def run(tag: str, make: Callable[[], HiveCatalog]) -> None:
        cat = make()
        for i in range(CONCURRENT):
            try:
                append(cat, ident, f"{tag}-{i}", acked)
            except CommitFailedException:
                failed.append(f"{tag}-{i}")

    threads = [threading.Thread(target=run, args=w) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return len(failed)
