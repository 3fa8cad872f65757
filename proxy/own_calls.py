"""Metastore calls the proxy makes itself through its own request path (warm-up, listing):
they are cached and invalidated exactly as an engine's calls are, so what warm-up prefetches
is what a query would have cached."""

from __future__ import annotations

from typing import Any

import grpc

from proxy import idl
from proxy.handler import CallHandler, SessionState
from proxy.wire.binary import MessageType, parse_header
from proxy.wire.framing import Message, Transport


class MetastoreFailure(LookupError):
    """The metastore answered with one of the method's declared exceptions."""

    def __init__(self, method: str, exception: Any) -> None:
        super().__init__(f"{method}: {exception}")
        self.exception = exception

    @property
    def not_found(self) -> bool:
        return type(self.exception).__name__ in ("NoSuchObjectException", "UnknownDBException")

    @property
    def status(self) -> grpc.StatusCode:
        """NOT_FOUND for a missing object; INVALID_ARGUMENT for what the metastore refused
        (a partition filter it cannot parse is a MetaException)."""
        return grpc.StatusCode.NOT_FOUND if self.not_found else grpc.StatusCode.INVALID_ARGUMENT


class _Keeper:
    """A client channel that keeps the reply instead of sending it anywhere."""

    transport = Transport.BUFFERED

    def __init__(self) -> None:
        self.data = bytearray()

    async def send(self, data: bytes) -> None:
        self.data += data

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        self.data += head
        self.data += rest


class OwnCalls:
    def __init__(self, handler: CallHandler) -> None:
        self.handler = handler
        self._seqid = 0

    async def call(self, method: str, **args: Any) -> Any:
        """Make one metastore call through the proxy's own path; the decoded result."""
        self._seqid += 1
        data = idl.encode_call(method, self._seqid, **args)
        header = parse_header(data, 0, len(data))
        assert header is not None
        keeper = _Keeper()
        await self.handler.handle(SessionState(peer="admin"), Message(header, data), keeper)
        reply = bytes(keeper.data)
        got = parse_header(reply, 0, len(reply))
        if got is None or got.type != MessageType.REPLY:
            raise RuntimeError(f"{method} failed at the metastore")
        result = idl.decode_result(method, reply[got.length :])
        if result.success is None:
            failures = [v for k, v in vars(result).items() if k != "success" and v is not None]
            raise MetastoreFailure(method, failures[0] if failures else "no result")
        return result.success
