"""Fire-and-forget work is kept referenced until it ends (asyncio holds tasks weakly)."""

from __future__ import annotations

import ast
import asyncio
import gc
import logging
from pathlib import Path

import pytest

from proxy import tasks

PROXY = Path(__file__).resolve().parents[2] / "proxy"


def test_no_task_is_started_and_dropped_in_the_proxy() -> None:
    """Every ``create_task``/``ensure_future`` result is kept (assigned, returned, added to
    a set, passed on); a bare expression statement would let the task be collected."""
    dropped = []
    for path in PROXY.rglob("*.py"):
        if "_gen" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = getattr(func, "attr", getattr(func, "id", ""))
                if name in ("create_task", "ensure_future"):
                    dropped.append(f"{path.relative_to(PROXY)}:{node.lineno}")
    assert not dropped, dropped


def test_background_work_survives_a_collection_and_its_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> list[str]:
        done: list[str] = []
        release = asyncio.Event()

        async def work() -> None:
            await release.wait()
            done.append("finished")

        async def boom() -> None:
            raise RuntimeError("boom")

        tasks.background(work(), "some work")  # the caller keeps nothing
        tasks.background(boom(), "failing work")
        gc.collect()
        await asyncio.sleep(0)
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert tasks.running() == 0
        return done

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(run()) == ["finished"]
    assert "failing work failed: boom" in caplog.text
