"""tests.rig.machine: a whole-machine test waits for the tests under way, keeps new ones out
while it waits and runs, and then lets them in (threads here; the locks are flock's, per
open file, so threads of one process contend as processes do)."""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.rig import machine


def held_by_someone(path: Path) -> bool:
    with open(path, "a") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        threading.Event().wait(0.005)
    raise AssertionError(f"never: {what}")


def test_a_whole_machine_test_runs_alone_and_is_not_overtaken(tmp_path: Path) -> None:
    events: list[str] = []
    release = {name: threading.Event() for name in ("a", "x", "b")}

    def run(name: str, whole: bool) -> None:
        with machine.turn(whole, tmp_path):
            events.append(f"{name} in")
            release[name].wait(10)
            events.append(f"{name} out")

    a = threading.Thread(target=run, args=("a", False))
    a.start()
    until(lambda: events == ["a in"], "a test under way")
    x = threading.Thread(target=run, args=("x", True))
    x.start()
    # x waits for a, holding the turnstile: a test that comes now waits behind x.
    until(lambda: held_by_someone(tmp_path / "machine-turnstile.lock"), "x waiting")
    b = threading.Thread(target=run, args=("b", False))
    b.start()
    threading.Event().wait(0.2)
    assert events == ["a in"]  # neither x (a is under way) nor b (x waits) went in
    release["a"].set()
    until(lambda: events[-1] == "x in", "x in once a is out")
    threading.Event().wait(0.2)
    assert events == ["a in", "a out", "x in"]  # b still waits: x runs alone
    release["x"].set()
    release["b"].set()
    for thread in (a, x, b):
        thread.join(10)
    assert events == ["a in", "a out", "x in", "x out", "b in", "b out"]


def test_tests_that_share_the_machine_run_together(tmp_path: Path) -> None:
    inside = threading.Barrier(3, timeout=10)

    def run() -> None:
        with machine.turn(False, tmp_path):
            inside.wait()  # all three inside at once, or the barrier breaks

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert not inside.broken


def test_a_turn_not_had_within_its_limit_fails_saying_why(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with machine.turn(True, tmp_path):
            started.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    started.wait(10)
    try:
        with (
            pytest.raises(TimeoutError, match=r"waited 0\.2 s for the machine"),
            machine.turn(False, tmp_path, limit=0.2),
        ):
            pass
    finally:
        release.set()
        holder.join(10)
    with machine.turn(False, tmp_path, limit=5):  # and had once it is free
        pass
