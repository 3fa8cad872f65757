"""One connection to the metastore, and the identity bound to it (by ``set_ugi`` or by its
SASL negotiation)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from proxy.config import Endpoint
from proxy.sasl.stream import ByteReader, ByteWriter
from proxy.upstream.streams import DivertingProtocol
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.framing import MessageReader


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a metastore connection runs calls as.

    ``args``: what a client's ``set_ugi`` said, as the bytes of its arguments. Keying by the
    exact bytes means "replay exactly what the client sent"; two clients that encode the same
    user differently just get separate pools, which is harmless.

    ``user``: an engine's user as the proxy authenticated it (Kerberos or a delegation
    token). Against a Kerberized metastore the connection's own negotiation (a delegation
    token of that user's) makes it run as the user; ``set_ugi`` cannot.
    """

    args: bytes = b""
    user: str | None = None

    @property
    def binds_by_set_ugi(self) -> bool:
        return bool(self.args)

    def call(self) -> bytes:
        return encode_header("set_ugi", MessageType.CALL, 0) + self.args


@dataclass(eq=False)
class UpstreamConnection:
    endpoint: Endpoint
    reader: ByteReader
    writer: ByteWriter
    replies: MessageReader  # its transport and reply size limit are the connection's
    identity: Identity | None = None
    calls: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    pinned: bool = False
    closed: bool = False  # closed by the pool: it no longer counts against the limit
    held_by_read: bool = False  # in use by a read: counted against the reads' share
    held_by_heavy: bool = False  # in use by a heavy read: counted against theirs too
    spoilt: bool = False  # a call left it unfit for another (see .hazards): closed after
    # Its protocol, when its replies can be taken as they arrive (plain streams, no SASL).
    diverter: DivertingProtocol | None = None

    @property
    def usable(self) -> bool:
        """Not closed by either side (an idle HMS connection can be closed under us), nor
        spoilt for other calls."""
        return not (self.closed or self.spoilt or self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.closed = True
        self.writer.close()
