"""Work started and not waited for, kept referenced until it ends.

The event loop keeps only a weak reference to a task; one nobody holds can be garbage
collected before it has run to the end (the asyncio documentation warns of exactly this).
Every fire-and-forget task of the proxy goes through :func:`background`, which holds it until
it is done and logs what it raised, instead of "Task exception was never retrieved".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

_RUNNING: set[asyncio.Task[Any]] = set()


def background(work: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
    task = asyncio.get_running_loop().create_task(work)
    _RUNNING.add(task)
    task.add_done_callback(lambda t: _done(t, what))
    return task


def _done(task: asyncio.Task[Any], what: str) -> None:
    _RUNNING.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s failed: %s", what, task.exception())


def running() -> int:
    return len(_RUNNING)
