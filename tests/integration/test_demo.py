"""The README's first command: the demo passes with both cores busy, can be left running with
commands that work, and a failure says in one line what went wrong and where the logs are."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rig.proxy_process import REPO

pytestmark = pytest.mark.hms

BURN = "while True: pass"


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.demo", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.whole_machine  # (its busy loops would starve a test running beside it)
def test_the_demo_passes_with_both_cores_busy_and_can_be_left_running() -> None:
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 2)]
    try:
        done = demo("--rounds", "5", "--keep-running")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    stop = re.search(r"Stop them with (\S+)", done.stdout)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Summary (5 rounds" in done.stdout
        # The sealed listings are cached, however late the follower brings back the demo's
        # own writes on a busy machine.
        assert "second call" in done.stdout and "(10 from cache;" in done.stdout, done.stdout
        commands = [
            shlex.split(line.strip())
            for line in done.stdout.splitlines()
            if line.strip().startswith(".venv/bin/hms-cache-proxy ")
        ]
        assert {c[1] for c in commands} == {"stats", "warm", "invalidate", "splits", "ls"}
        for command in commands:  # exactly as printed, against the live ports
            ran = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
            assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
    finally:
        assert stop is not None, done.stdout
        subprocess.run([stop.group(1)], timeout=60, check=False)


def test_a_failing_demo_keeps_its_logs_and_says_why_in_one_line() -> None:
    # A metastore that cannot start: its JVM refuses an option it does not know.
    done = demo("--rounds", "1", env={"JAVA_TOOL_OPTIONS": "-XX:+NoSuchOptionForTheRig"})
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    found = re.search(r"demo failed while starting a Hive Metastore.*logs kept in (\S+)", lines[0])
    assert found, lines[0]
    assert (Path(found.group(1)) / "hms" / "hms.log").is_file()
