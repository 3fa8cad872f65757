"""What the proxy knows about one client connection, and how a call ends it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.upstream import Identity, UpstreamConnection
from proxy.wire.framing import Transport


class ClientGone(Exception):
    """The client connection must be closed (its reply can no longer be completed)."""


def peer_name(transport: Any) -> str:
    """The client's address, for the log (a transport's or a stream's)."""
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


class PeerName:
    """A client's address for the log (``host:port``), made when first written: most
    connections never log a line, and making it at every connect cost ~1.6 us of each of
    Trino's calls (git log -p docs/benchmarks.md). Read from the transport, which keeps the address
    from its connect on (asyncio and uvloop both): a line logged after the close has it."""

    __slots__ = ("_name", "_transport")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._name: str | None = None

    def __str__(self) -> str:
        if self._name is None:
            self._name = peer_name(self._transport)
            self._transport = None
        return self._name


@dataclass
class SessionState:
    """What the proxy remembers about one client connection."""

    peer: str | PeerName  # (for the log)
    identity: Identity | None = None  # who its metastore connections run as (set_ugi, SASL)
    pinned: UpstreamConnection | None = None  # its own metastore connection (setMetaConf)
    calls: int = 0
    user: str | None = None  # the user it authenticated as (SASL), if it did
    mechanism: str | None = None  # how: GSSAPI (Kerberos) or DIGEST-MD5 (a token)
    principal: str | None = None  # its Kerberos principal, or its token's owner
    # The call under way was charged against its user's rate before the cache was asked (a
    # rule that counts hits: proxy.guard.limits); not charged as a call again if it goes on.
    charged: bool = False

    @property
    def cache_identity(self) -> bytes | None:
        """Whose entries it reads when the cache is per user: its authenticated user, or
        what its set_ugi said."""
        if self.user is not None:
            return b"sasl:" + self.user.encode()
        return self.identity.args if self.identity is not None else None

    def lost_pin(self) -> bool:
        """Whether the client's own connection was closed (after a failed exchange): it is
        then forgotten. Its state (setMetaConf) is gone with it: a forwarded call ends the
        client's connection too."""
        if self.pinned is not None and self.pinned.closed:
            self.pinned = None
            return True
        return False


class NoReply:
    """The channel of a call the client sent as ONEWAY: it reads no reply, so the answer is
    dropped. Whether the metastore replies depends on the method, not on the message type
    (a Java processor answers every method that is not declared oneway), so that reply is
    still read off the pooled connection, where it would otherwise answer the next caller."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def send(self, data: bytes) -> None:
        pass

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        pass
