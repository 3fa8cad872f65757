"""docs/engines.md says what the tests run: its snippets are the rig's engine configurations,
and its table of tested versions names the versions the rig resolves and installs."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from tests.rig import engine_docs, maven
from tests.rig.presto import hive_catalog as presto_catalog
from tests.rig.trino import hive_catalog, iceberg_catalog

URI = "thrift://10.0.0.1:9999"

# The snippets (section, index) the rig's engines are built from, and those no test builds an
# engine from, with the reason; every snippet of docs/engines.md is one or the other.
RUN = {("Trino", 0), ("Presto", 0), ("Spark", 0), ("Iceberg", 0)}
NOT_RUN = {
    ("Iceberg", 1): "no Iceberg runtime for Spark 4.3 on Maven Central",
    ("Kerberos and SASL", 0): "Trino is not run with Kerberos here",
    ("Kerberos and SASL", 1): "the Kerberized Spark tests build their conf in tests/rig/spark.py",
}


def versions_tested() -> dict[str, str]:
    """The table under "What the tests run": engine -> version."""
    text = engine_docs.DOC.read_text()
    section = text.split("## What the tests run", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", section, re.M)
    return {engine: version for engine, version in rows if engine not in ("engine", "---")}


def pom_version(name: str, artifact: str) -> str:
    pom = (maven.POMS / name / "pom.xml").read_text()
    properties = dict(re.findall(r"<([\w.]+)>([^<]+)</\1>", pom))
    found = re.search(
        rf"<artifactId>{re.escape(artifact)}</artifactId>\s*<version>([^<]+)</version>", pom
    )
    assert found is not None, f"{artifact} not in tests/rig/maven/{name}/pom.xml"
    version = found.group(1)
    return properties.get(version[2:-1], version) if version.startswith("${") else version


def test_every_snippet_is_run_by_a_test_or_says_why_not() -> None:
    sections = re.findall(r"^## (.+)$", engine_docs.DOC.read_text(), re.M)
    found = {
        (section, index)
        for section in sections
        for index in range(len(engine_docs.snippets(section)))
    }
    assert found == RUN | set(NOT_RUN), found ^ (RUN | set(NOT_RUN))


def test_every_snippet_names_the_documented_uri() -> None:
    for section, key in (
        ("Trino", "hive.metastore.uri"),
        ("Presto", "hive.metastore.uri"),
        ("Spark", "spark.hadoop.hive.metastore.uris"),
    ):
        assert engine_docs.snippets(section)[0][key] == engine_docs.DOC_URI, section


def test_the_trino_and_presto_catalogs_of_the_tests_are_the_documented_ones() -> None:
    files = {"fs.native-s3.enabled": "true"}
    hive = engine_docs.configured("Trino", URI)
    assert hive["hive.metastore-cache-ttl"] == "0s"
    assert hive["hive.metastore-stats-cache-ttl"] == "0s"
    assert hive_catalog(URI, files) == hive | files
    presto = engine_docs.configured("Presto", URI)
    assert presto["connector.name"] == "hive-hadoop2"
    assert presto_catalog(URI, files) == presto | files
    iceberg = engine_docs.configured("Iceberg", URI)
    assert iceberg["iceberg.catalog.type"] == "hive_metastore"
    assert iceberg_catalog(URI, files) == iceberg | files


def test_the_spark_sessions_of_the_tests_use_the_documented_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pyspark_sql = pytest.importorskip("pyspark.sql")
    seen: dict[str, str] = {}

    class Builder:
        """SparkSession.builder's chain, recording ``config``; the session is never made."""

        def __getattr__(self, name: str) -> object:
            if name == "getOrCreate":
                raise LookupError("stop here")
            return lambda *args, **kwargs: self

        def config(self, key: str, value: str) -> Builder:
            seen[key] = value
            return self

    monkeypatch.setattr(pyspark_sql.SparkSession, "builder", Builder())
    from tests.rig import spark

    with pytest.raises(LookupError):
        spark.session(URI, "/tmp/warehouse", "app")
    assert engine_docs.configured("Spark", URI).items() <= seen.items()


def test_the_tested_versions_are_the_ones_the_rig_runs() -> None:
    versions = versions_tested()
    trino = pom_version("trino", "trino-server-core")
    assert versions["Trino, Hive connector"] == trino
    assert versions["Trino, Iceberg connector"] == trino
    assert versions["Spark (built-in Hive 2.3.10 client)"] == importlib.metadata.version("pyspark")
    assert versions["Java Iceberg `HiveCatalog`"] == pom_version(
        "iceberg", "iceberg-hive-metastore"
    )
    assert versions["pyiceberg"] == importlib.metadata.version("pyiceberg")
    assert versions["Presto, Hive connector"] == pom_version("presto", "presto-server")


def test_the_tests_the_table_names_exist() -> None:
    section = engine_docs.DOC.read_text().split("## What the tests run", 1)[1].split("\n## ")[0]
    root = Path(__file__).resolve().parents[2]
    for path in re.findall(r"`(tests/[\w/]+\.py)`", section):
        assert (root / path).is_file(), path
