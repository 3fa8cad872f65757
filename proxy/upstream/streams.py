"""Metastore connections whose reply bytes can be taken as they arrive, without a task.

A call that the proxy only forwards (:mod:`proxy.handler.flight`) is answered from the
connection's protocol callback: its reply goes to the client as the metastore's bytes come
in, with no task woken for the client's request nor for the reply. While such a call is
under way the connection's :class:`DivertingProtocol` hands its bytes to the call's
:class:`Receiver`; otherwise (and once the receiver lets go) they go to the connection's
``StreamReader`` as ``asyncio.open_connection`` would, for the proxy's ordinary, awaited
exchanges.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Receiver(Protocol):
    """What takes a connection's bytes while a call is answered as they arrive."""

    def data_received(self, data: bytes) -> None: ...

    def ended(self) -> None:
        """The connection ended (end of stream or lost): the receiver must let go."""


class DivertingProtocol(asyncio.StreamReaderProtocol):
    """``asyncio.open_connection``'s protocol, with its bytes handed to ``receiver`` while
    one is set. The end of the connection reaches the stream either way (after the receiver
    is told), so the connection's reader knows it ended whoever reads next."""

    receiver: Receiver | None = None

    def data_received(self, data: bytes) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver.data_received(data)
            return
        super().data_received(data)

    def eof_received(self) -> bool:
        if self.receiver is not None:
            self.receiver.ended()
        return bool(super().eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.receiver is not None:
            self.receiver.ended()
        super().connection_lost(exc)


async def open_connection(
    host: str | None = None, port: int | None = None, *, limit: int, **kwargs: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` with a :class:`DivertingProtocol` (``sock=``, ``ssl=``
    and ``server_hostname=`` as there)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = DivertingProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(
        lambda: protocol,
        host,  # type: ignore[arg-type]  # (None with sock=, as asyncio.open_connection allows)
        port,  # type: ignore[arg-type]
        **kwargs,
    )
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def diverting(writer: object) -> DivertingProtocol | None:
    """The :class:`DivertingProtocol` under a plain stream's ``writer``, if it has one."""
    if type(writer) is not asyncio.StreamWriter:  # (a SASL stream wraps what it reads)
        return None
    protocol = writer.transport.get_protocol()
    return protocol if isinstance(protocol, DivertingProtocol) else None
