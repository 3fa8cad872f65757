"""The event loop choice (proxy/loop.py): uvloop where installed, asyncio otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from proxy import loop


def test_asyncio_is_asyncios_own_loop() -> None:
    assert loop.factory("asyncio") == ("asyncio", None)


def test_auto_runs_uvloop_where_it_is_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    name, make = loop.factory("auto")
    assert name.startswith("uvloop ") and make is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=make) as runner:
        assert type(runner.get_loop()).__module__.startswith("uvloop")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now fails
    assert loop.factory("auto") == ("asyncio (uvloop is not installed)", None)
    with pytest.raises(RuntimeError, match="not installed"):
        loop.factory("uvloop")
