"""Real Spark sessions (pyspark, ``local[1]``, Hive support) against a metastore URI.

A session lives in a process of its own (one per process): the jobs in ``tests/e2e`` build
theirs with ``session``, and the tests run them with ``running``. A job that must pause for
the test prints ``READY`` and waits for a file (``wait_for_go``); the test waits for that
line (``wait_ready``), does its part, creates the file, then ``finish``es the job.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def session(uri: str, warehouse: str, app: str) -> Any:
    """A Spark session whose Hive catalog is the metastore at ``uri``, with dynamic
    partitions allowed (non-strict), quiet logs and no UI."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .appName(app)
        .config("spark.sql.catalogImplementation", "hive")
        .config("spark.hadoop.hive.metastore.uris", uri)
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .enableHiveSupport()
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql("SET hive.exec.dynamic.partition.mode=nonstrict")
    return spark


def wait_for_go(path: str | Path) -> None:
    """In a job: say READY, then wait until the test creates ``path`` (no deadline here:
    the test has one, and kills the job when it runs out)."""
    print("READY", flush=True)
    while not Path(path).exists():
        time.sleep(0.1)


@contextlib.contextmanager
def running(job: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The job module ``tests.e2e.<job>`` running with ``args``, its output piped; killed on
    the way out if it has not ended."""
    process = subprocess.Popen(
        [sys.executable, "-m", f"tests.e2e.{job}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
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
