"""What a finished SASL negotiation leaves behind: a security layer over the frames.

After the negotiation every write is one frame, ``length:u32 BE | payload``; the payload is the
plain bytes when the negotiated protection is ``auth`` and the mechanism's ``wrap`` of them
for ``auth-int`` (integrity) and ``auth-conf`` (confidentiality).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntFlag, StrEnum
from typing import Protocol


class SaslError(Exception):
    """The peer failed authentication or broke the SASL protocol; the connection must end."""


class Qop(StrEnum):
    """A protection level, under SASL's names; Hadoop's names map onto them."""

    AUTH = "auth"
    AUTH_INT = "auth-int"
    AUTH_CONF = "auth-conf"

    @property
    def bit(self) -> Layers:
        return _BITS[self]

    @property
    def strength(self) -> int:
        return _ORDER.index(self)

    @classmethod
    def from_hadoop(cls, name: str) -> Qop:
        """``hadoop.rpc.protection``'s names (and SASL's own)."""
        name = name.strip().lower()
        if name in _HADOOP:
            return _HADOOP[name]
        return cls(name)


class Layers(IntFlag):
    """The GSSAPI security-layer bitmask (RFC 4752 section 3.3)."""

    NONE = 1
    INTEGRITY = 2
    CONFIDENTIALITY = 4


_ORDER = [Qop.AUTH, Qop.AUTH_INT, Qop.AUTH_CONF]
_BITS = {
    Qop.AUTH: Layers.NONE,
    Qop.AUTH_INT: Layers.INTEGRITY,
    Qop.AUTH_CONF: Layers.CONFIDENTIALITY,
}
_HADOOP = {"authentication": Qop.AUTH, "integrity": Qop.AUTH_INT, "privacy": Qop.AUTH_CONF}


def at_least(allowed: Sequence[Qop]) -> list[Qop]:
    """Every protection at least as strong as the weakest of ``allowed``, weakest first: what
    the proxy accepts towards a metastore, which decides what it requires."""
    floor = min(q.strength for q in allowed)
    return [q for q in _ORDER if q.strength >= floor]


def qop_for_bit(bit: int) -> Qop:
    for qop, value in _BITS.items():
        if bit == value:
            return qop
    raise SaslError(f"not one security layer: {bit:#x}")


class SecurityLayer(Protocol):
    """Wraps outgoing and unwraps incoming frame payloads (raises SaslError on bad input)."""

    qop: Qop
    max_send: int  # the largest plain payload one frame may carry (0: no limit)

    def wrap(self, data: bytes) -> bytes: ...

    def unwrap(self, data: bytes) -> bytes: ...


class PlainLayer:
    """``auth``: frames carry the bytes as they are."""

    qop = Qop.AUTH
    max_send = 0

    def wrap(self, data: bytes) -> bytes:
        return data

    def unwrap(self, data: bytes) -> bytes:
        return data


PLAIN = PlainLayer()
