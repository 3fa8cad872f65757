"""The adversary's connections, by route (a proxy's name, or the metastore's): raw ones for
reads, hmsclient ones for writes; and how a raw reply is decoded."""

from __future__ import annotations

import contextlib
from typing import Any

from hmsclient import hmsclient

from proxy import idl
from proxy.wire.binary import MessageType
from tests.rig import raw
from tests.rig.sample import client

Client = hmsclient.HMSClient


def decode(method: str, reply: bytes) -> tuple[Any, str | None]:
    """(the result's success value, None) or (None, what came instead)."""
    if reply == raw.CLOSED:
        return None, "the connection closed without a reply"
    if reply[3] != MessageType.REPLY:
        return None, f"a Thrift exception (message type {reply[3]})"
    cut = 12 + int.from_bytes(reply[4:8], "big")
    result = idl.decode_result(method, reply[cut:])
    if result.success is None:
        declared = {k: v for k, v in vars(result).items() if k != "success" and v is not None}
        return None, f"the exception {declared!r}"
    return result.success, None


class Connections:
    """Raw connections by route, kept open (or not: ``fresh``), opened again after an error."""

    def __init__(self, routes: dict[str, tuple[str, int]]) -> None:
        self.routes = routes
        self.open: dict[str, raw.RawConnection] = {}

    def call(self, route: str, request: bytes, *, fresh: bool = False) -> bytes:
        host, port = self.routes[route]
        conn = None if fresh else self.open.get(route)
        try:
            if conn is None:
                conn = raw.RawConnection(host, port, timeout=30)
                if not fresh:
                    self.open[route] = conn
            return conn.call(request)
        except (EOFError, OSError):
            self.open.pop(route, None)
            return raw.CLOSED
        finally:
            if fresh and conn is not None:
                conn.close()

    def close(self) -> None:
        for conn in self.open.values():
            conn.close()
        self.open.clear()


class Clients:
    """hmsclient connections by route (for writes), opened again after a transport error."""

    def __init__(self, routes: dict[str, tuple[str, int]]) -> None:
        self.routes = routes
        self.open: dict[str, Client] = {}

    def get(self, route: str) -> Client:
        if route not in self.open:
            c = client(*self.routes[route], timeout=30)
            c.open()
            self.open[route] = c
        return self.open[route]

    def drop(self, route: str) -> None:
        c = self.open.pop(route, None)
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()

    def close(self) -> None:
        for route in list(self.open):
            self.drop(route)
