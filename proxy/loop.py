"""Which event loop runs the proxy: uvloop where it is installed, else asyncio's own.

uvloop (libuv underneath) makes the proxy's socket reads and writes, the larger part of a
cache hit's time, cheaper; nothing in the proxy depends on it. ``--event-loop`` chooses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib.metadata import version
from typing import Protocol


def factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(the loop's name as logs and --print-config show it, a factory or None for asyncio's).
    Raises RuntimeError when uvloop is asked for and not installed."""
    if choice == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise RuntimeError("--event-loop uvloop: uvloop is not installed") from exc
        return "asyncio (uvloop is not installed)", None
    return f"uvloop {version('uvloop')}", uvloop.new_event_loop


class _Writer(Protocol):
    def write(self, data: bytes | bytearray | memoryview) -> None: ...


def guarded_write(writer: _Writer, data: bytes | bytearray | memoryview) -> None:
    """``writer.write(data)`` on either loop: a write to a connection already closed is
    ignored by asyncio's (its drain() then raises ConnectionResetError) and raises
    RuntimeError under uvloop ("the handler is closed"); here it is ConnectionResetError."""
    try:
        writer.write(data)
    except RuntimeError as exc:
        raise ConnectionResetError(f"the connection is closed: {exc}") from exc


def closed_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is uvloop's RuntimeError for an operation on a transport already
    closed ("the handler is closed"), which asyncio's loop ignores or raises as an OSError:
    a connection lost, not a bug. (Libraries written for asyncio's loop, redis-py among
    them, let it through.)"""
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)
