"""A Thrift client connection over SASL GSSAPI (Kerberos), written for the rig alone.

It shares no code with ``proxy.sasl``: like ``raw`` (which reads replies with Apache Thrift,
not the proxy's scanner), it is an independent client that a test can point at a Kerberized
metastore or at the proxy, so that a mistake in the proxy's SASL cannot hide itself. Requests
and replies are raw Thrift messages (``proxy.idl.encode_call`` / ``decode_result``), as with
``raw.RawConnection``.

The exchange (Thrift's ``TSaslClientTransport``, RFC 4752): START "GSSAPI" + OK(first
token); tokens until the context is established (the server's mutual-auth token answered
with an empty OK); the server's wrapped offer (layer bitmask, max buffer); the client's
wrapped choice; COMPLETE. Then every message is one frame ``u32 length | payload``, the
payload wrapped (signed, or sealed) unless the layer is ``auth``.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import gssapi
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TType
from thrift.transport.TTransport import TTransportBase

START, OK, BAD, ERROR, COMPLETE = 1, 2, 3, 4, 5
# SASL GSSAPI security layers (the offer's bitmask) and the QOP names they go by.
LAYERS = {"auth": 1, "auth-int": 2, "auth-conf": 4}
MAX_BUFFER = 0xFFFFFF  # the largest wrapped message this client takes (3 bytes)


class SaslRefused(Exception):
    """The server ended the negotiation (BAD or ERROR, with its reason), or closed."""


class KerberosConnection:
    """One authenticated connection to ``service@host`` (``hive@localhost`` for a Kerberized
    metastore, ``proxy@localhost`` for the proxy) with the TGT in ``ccache`` (a FILE ccache
    from ``Realm.kinit``), or from ``keytab`` as ``principal`` (a MEMORY ccache, no kinit).

    ``qop`` is the layer to choose (``auth``, ``auth-int``, ``auth-conf``); it must be one
    the server offers, as Hadoop's client insists too.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        service: str = "hive",
        ccache: Path | None = None,
        keytab: Path | None = None,
        principal: str | None = None,
        qop: str = "auth",
        timeout: float = 60,
    ) -> None:
        if qop not in LAYERS:
            raise ValueError(f"qop: one of {sorted(LAYERS)}, not {qop!r}")
        self.layer = LAYERS[qop]
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        try:
            self.context = self._negotiate(
                gssapi.Name(f"{service}@{host}", gssapi.NameType.hostbased_service),
                _credentials(ccache, keytab, principal),
            )
        except BaseException:
            self.sock.close()
            raise

    @property
    def user(self) -> str:
        """The principal this connection authenticated as."""
        return str(self.context.initiator_name)

    def call(self, request: bytes) -> bytes:
        """Send one Thrift message; the reply message's bytes."""
        self.send(request)
        return self.receive()

    def send(self, message: bytes) -> None:
        if self.layer != LAYERS["auth"]:
            message = self.context.wrap(message, self.layer == LAYERS["auth-conf"]).message
        self.sock.sendall(struct.pack(">I", len(message)) + message)

    def receive(self) -> bytes:
        """One reply: frames are unwrapped and read as a byte stream until Apache Thrift has
        skipped one whole message (a message may come in more than one frame)."""
        reader = _FrameReader(self)
        proto = TBinaryProtocol(reader, strictRead=False)
        proto.readMessageBegin()
        proto.skip(TType.STRUCT)
        proto.readMessageEnd()
        if reader.pending:
            raise AssertionError(f"{len(reader.pending)} unexpected bytes after the reply")
        return bytes(reader.record)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KerberosConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- SASL -----------------------------------------------------------------------------

    def _negotiate(self, target: gssapi.Name, creds: gssapi.Credentials) -> gssapi.SecurityContext:
        flags = (
            gssapi.RequirementFlag.mutual_authentication
            | gssapi.RequirementFlag.integrity
            | gssapi.RequirementFlag.confidentiality
        )
        context = gssapi.SecurityContext(name=target, creds=creds, usage="initiate", flags=flags)
        self._send_negotiation(START, b"GSSAPI")
        self._send_negotiation(OK, context.step() or b"")
        while not context.complete:
            context_token = self._expect(OK)
            self._send_negotiation(OK, context.step(context_token) or b"")
        offer = context.unwrap(self._expect(OK)).message
        if len(offer) != 4:
            raise SaslRefused(f"the security-layer offer is {len(offer)} bytes, not 4")
        if not offer[0] & self.layer:
            raise SaslRefused(f"the server offers layers {offer[0]:#x}, not {self.layer:#x}")
        choice = bytes([self.layer]) + MAX_BUFFER.to_bytes(3, "big")
        self._send_negotiation(OK, context.wrap(choice, False).message)
        self._expect(COMPLETE)
        return context

    def _send_negotiation(self, status: int, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">BI", status, len(payload)) + payload)

    def _expect(self, wanted: int) -> bytes:
        status, length = struct.unpack(">BI", self._exactly(5))
        payload = self._exactly(length)
        if status in (BAD, ERROR):
            raise SaslRefused(payload.decode(errors="replace"))
        if status != wanted:
            raise SaslRefused(f"negotiation status {status}, wanted {wanted}")
        return payload

    def _exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise SaslRefused("the server closed the connection")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _frame(self) -> bytes:
        (length,) = struct.unpack(">I", self._exactly(4))
        payload = self._exactly(length)
        if self.layer != LAYERS["auth"]:
            payload = self.context.unwrap(payload).message
        return payload


class _FrameReader(TTransportBase):
    """Thrift's view of the frames: a byte stream, recorded as it is read."""

    def __init__(self, connection: KerberosConnection) -> None:
        self.connection = connection
        self.record = bytearray()
        self.pending = b""

    def read(self, sz: int) -> bytes:
        while len(self.pending) < sz:
            self.pending += self.connection._frame()
        out, self.pending = self.pending[:sz], self.pending[sz:]
        self.record += out
        return out

    def readAll(self, sz: int) -> bytes:  # noqa: N802 - thrift's name
        return self.read(sz)


def _credentials(
    ccache: Path | None, keytab: Path | None, principal: str | None
) -> gssapi.Credentials:
    """Explicit credentials: never the default ccache of whoever runs the tests."""
    if (ccache is None) == (keytab is None):
        raise ValueError("give a ccache or a keytab (with its principal)")
    if ccache is not None:
        return gssapi.Credentials(usage="initiate", store={"ccache": f"FILE:{ccache}"})
    if principal is None:
        raise ValueError("a keytab needs its principal")
    return gssapi.Credentials(
        name=gssapi.Name(principal, gssapi.NameType.kerberos_principal),
        usage="initiate",
        store={"client_keytab": str(keytab), "ccache": f"MEMORY:rig-{principal}"},
    )
