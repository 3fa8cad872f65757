"""Locks between the test processes of one run (pytest-xdist's workers share .rig/).

* :func:`turn`: a test that loads every core on purpose (the demo's, with busy loops beside
  it) has the machine to itself; every other test holds a shared lock for its duration, so
  its time bounds are not measured on a machine another test starves on purpose.
* :func:`alone`: one process at a time through a step that builds something shared (the
  Java helpers)."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

RIG_DIR = Path(__file__).resolve().parents[2] / ".rig"


WAIT_LIMIT = 1200.0  # seconds a test waits for its turn before it fails saying so


def _take(lock: IO[str], how: int, what: str, limit: float) -> None:
    """flock ``lock``, waiting at most ``limit`` seconds (locks die with their process, so
    only a test that runs that long makes another wait that long)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            fcntl.flock(lock, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {limit:g} s for {what}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def alone(name: str, folder: Path = RIG_DIR, limit: float = WAIT_LIMIT) -> Iterator[None]:
    """Hold ``<folder>/<name>.lock`` exclusively."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as lock:
        _take(lock, fcntl.LOCK_EX, f"{folder / name}.lock", limit)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def turn(whole_machine: bool, folder: Path = RIG_DIR, limit: float = WAIT_LIMIT) -> Iterator[None]:
    """Run a test: with the machine to itself (``whole_machine``), or beside others like it.

    Every taker first passes a turnstile (held only while it takes its lock), so a test
    waiting for the whole machine keeps new shared holders out: it waits for the tests
    under way to end, not for a gap between them that may never come. Not reentrant: a
    second ``turn`` in the same process while one is held would wait for itself."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "machine.lock", "a") as lock:
        with alone("machine-turnstile", folder, limit):
            how = fcntl.LOCK_EX if whole_machine else fcntl.LOCK_SH
            _take(lock, how, "the machine (a whole_machine test)", limit)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
