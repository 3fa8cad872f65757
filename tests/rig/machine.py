"""Locks between the test processes of one run (pytest-xdist's workers share .rig/).

* :func:`turn`: a test that loads every core on purpose (the demo's, with busy loops beside
  it) has the machine to itself; every other test holds a shared lock for its duration, so
  its time bounds are not measured on a machine another test starves on purpose.
* :func:`alone`: one process at a time through a step that builds something shared (the
  Java helpers)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

RIG_DIR = Path(__file__).resolve().parents[2] / ".rig"


@contextlib.contextmanager
def alone(name: str, folder: Path = RIG_DIR) -> Iterator[None]:
    """Hold ``<folder>/<name>.lock`` exclusively."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def turn(whole_machine: bool, folder: Path = RIG_DIR) -> Iterator[None]:
    """Run a test: with the machine to itself (``whole_machine``), or beside others like it.

    Every taker first passes a turnstile (held only while it takes its lock), so a test
    waiting for the whole machine keeps new shared holders out: it waits for the tests
    under way to end, not for a gap between them that may never come."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "machine.lock", "a") as lock:
        with alone("machine-turnstile", folder):
            fcntl.flock(lock, fcntl.LOCK_EX if whole_machine else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
