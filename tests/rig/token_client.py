"""A delegation-token engine for tests: DIGEST-MD5 with a metastore token, as Trino with
impersonation and Hive's tasks connect, then one call at a time, each flushed as one frame.

Its DIGEST-MD5 is the proxy's own (proxy.sasl.digest), which tests/integration/
test_sasl_digest_java.py checks against the JDK's server and Hive's token manager; the
Kerberos engines of the tests use the rig's independent client (tests/rig/sasl_client.py).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from proxy.sasl.digest import DigestClient
from proxy.sasl.layer import Qop, SaslError, SecurityLayer
from proxy.sasl.negotiation import NegotiationReader, Status, encode
from proxy.sasl.tokens import HadoopToken
from proxy.wire.framing import Message, MessageReader, Transport


class TokenConnection:
    def __init__(self, sock: socket.socket, layer: SecurityLayer, early: bytes = b"") -> None:
        self.sock = sock
        self.layer = layer
        self._early = early  # frame bytes that came with the last negotiation message
        self._replies = MessageReader(Transport.BUFFERED, 1 << 30)

    # -- connecting ---------------------------------------------------------------------------

    @classmethod
    def connect(
        cls, host: str, port: int, token: str, *, qops: tuple[Qop, ...] = (Qop.AUTH,)
    ) -> TokenConnection:
        """DIGEST-MD5 with a delegation token as ``get_delegation_token`` returned it."""
        digest = DigestClient.for_token(HadoopToken.decode(token), qops=qops)
        sock = socket.create_connection((host, port), 30.0)
        holder: dict[str, bytes] = {}
        try:
            early = _negotiate(sock, "DIGEST-MD5", b"", digest.respond, holder)
        except BaseException:
            sock.close()
            raise
        return cls(sock, digest.finish(holder["complete"]), early)

    # -- calls --------------------------------------------------------------------------------

    def call(self, request: bytes) -> bytes:
        """One request's reply message, exactly as it came (as KerberosConnection.call)."""
        return self.message(request).data

    def message(self, request: bytes) -> Message:
        payload = self.layer.wrap(request)
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)
        return self._read_message()

    def close(self) -> None:
        self.sock.close()

    def _read_message(self) -> Message:
        while True:
            message = self._replies.next_message()
            if message is not None:
                return message
            self._replies.feed(self._read_frame())

    def _read_frame(self) -> bytes:
        (length,) = struct.unpack(">I", self._exactly(4))
        return self.layer.unwrap(self._exactly(length))

    def _exactly(self, n: int) -> bytes:
        taken, self._early = self._early[:n], self._early[n:]
        return taken + (_exactly(self.sock, n - len(taken)) if len(taken) < n else b"")

    def __enter__(self) -> TokenConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ConnectionError("the server closed the connection")
        data += piece
    return data


def _negotiate(
    sock: socket.socket,
    mechanism: str,
    first: bytes,
    step: Any,
    holder: dict[str, bytes] | None = None,
) -> bytes:
    sock.sendall(encode(Status.START, mechanism.encode()) + encode(Status.OK, first))
    reader = NegotiationReader()
    while True:
        message = reader.next()
        if message is None:
            data = sock.recv(65536)
            if not data:
                raise SaslError("the server closed the connection during SASL negotiation")
            reader.feed(data)
            continue
        if message.status is Status.COMPLETE:
            if holder is not None:
                holder["complete"] = message.payload
            return reader.rest()
        if message.status is not Status.OK:
            raise SaslError(f"{message.status.name}: {message.payload.decode(errors='replace')}")
        sock.sendall(encode(Status.OK, step(message.payload)))
