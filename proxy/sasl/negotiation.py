"""Thrift's SASL negotiation messages (``TSaslTransport``), sans-I/O.

Each message is ``status:u8 | length:u32 BE | payload``. The client opens with START (the
mechanism's name) and at once OK (its initial response); the two sides then alternate until
the server sends COMPLETE, or either side BAD or ERROR (with a reason) and closes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from proxy.sasl.layer import SaslError

_HEADER = struct.Struct(">BI")
# A Kerberos AP-REQ is ~1 KB; with an Active Directory PAC of many groups up to ~64 KB (Windows'
# MaxTokenSize). The bound is what an unauthenticated connection can make the proxy hold. A
# plain Thrift client's first bytes (0x80 0x01 ...) read as a status of 128, refused at once,
# never as a length to wait for.
MAX_NEGOTIATION_BYTES = 128 << 10


class Status(IntEnum):
    START = 1
    OK = 2
    BAD = 3
    ERROR = 4
    COMPLETE = 5


@dataclass(frozen=True, slots=True)
class Negotiation:
    status: Status
    payload: bytes

    def encode(self) -> bytes:
        return encode(self.status, self.payload)


def encode(status: Status, payload: bytes = b"") -> bytes:
    return _HEADER.pack(status, len(payload)) + payload


class NegotiationReader:
    """Fed bytes, hands out whole negotiation messages; ``rest`` is what follows them."""

    def __init__(self, limit: int = MAX_NEGOTIATION_BYTES) -> None:
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> Negotiation | None:
        buffer = self._buffer
        if not buffer:
            return None
        try:
            status = Status(buffer[0])
        except ValueError:
            raise SaslError(
                f"not a SASL negotiation (first byte {buffer[0]:#04x}"
                + (": a plain Thrift client?)" if buffer[0] == 0x80 else ")")
            ) from None
        if len(buffer) < _HEADER.size:
            return None
        _, length = _HEADER.unpack_from(buffer)
        if length > self.limit:
            raise SaslError(f"SASL negotiation message of {length} bytes (limit {self.limit})")
        end = _HEADER.size + length
        if len(buffer) < end:
            return None
        payload = bytes(buffer[_HEADER.size : end])
        del buffer[:end]
        return Negotiation(status, payload)

    def rest(self) -> bytes:
        """Bytes after the last message handed out (the first frames, sent early)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data
