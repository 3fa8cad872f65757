"""Raw Thrift exchanges, read with the Apache ``thrift`` package (not the proxy's code).

Byte-identity tests need the exact bytes of a reply; the message boundary is found here by
Apache Thrift's own ``TBinaryProtocol.skip`` over a transport that records what it reads, so
a mistake in the proxy's scanner cannot hide itself.
"""

from __future__ import annotations

import socket
import ssl
import struct

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TType
from thrift.transport.TTransport import TMemoryBuffer, TTransportBase


class _RecordingSocket(TTransportBase):
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.record = bytearray()
        self._buf = b""

    def read(self, sz: int) -> bytes:
        while len(self._buf) < sz:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("connection closed mid-reply")
            self._buf += chunk
        out, self._buf = self._buf[:sz], self._buf[sz:]
        self.record += out
        return out

    def readAll(self, sz: int) -> bytes:  # noqa: N802 - thrift's name
        return self.read(sz)


class Cursor(TTransportBase):
    """Bytes to read from; running out raises EOFError (in ``readAll``): "need more"."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def read(self, sz: int) -> bytes:
        out = self.data[self.pos : self.pos + sz]
        self.pos += len(out)
        return out


def message_length(data: bytes) -> int | None:
    """The length of the (unframed) Thrift message ``data`` starts with; ``None``: incomplete."""
    cursor = Cursor(data)
    proto = TBinaryProtocol(cursor, strictRead=False)
    try:
        proto.readMessageBegin()
        proto.skip(TType.STRUCT)
    except EOFError:
        return None
    return cursor.pos


class RawConnection:
    """One socket; send request bytes, get the raw reply bytes back."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        framed: bool = False,
        timeout: float = 60,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.framed = framed

    def send(self, request: bytes) -> None:
        if self.framed:
            request = struct.pack(">i", len(request)) + request
        self.sock.sendall(request)

    def receive(self) -> bytes:
        if self.framed:
            size = struct.unpack(">i", self._exactly(4))[0]
            return self._exactly(size)
        rec = _RecordingSocket(self.sock)
        proto = TBinaryProtocol(rec, strictRead=False)
        proto.readMessageBegin()
        proto.skip(TType.STRUCT)
        proto.readMessageEnd()
        if rec._buf:
            raise AssertionError(f"{len(rec._buf)} unexpected bytes after the reply")
        return bytes(rec.record)

    def call(self, request: bytes) -> bytes:
        self.send(request)
        return self.receive()

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError("connection closed")
            out += chunk
        return out

    def closed_by_peer(self, timeout: float = 5) -> bool:
        """True if the peer closes the connection (reads EOF) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


CLOSED = b"<connection closed without a reply>"


def call(
    host: str,
    port: int,
    request: bytes,
    *,
    framed: bool = False,
    tls: ssl.SSLContext | None = None,
) -> bytes:
    """The raw reply, or ``CLOSED`` when the server hung up instead of replying."""
    with RawConnection(host, port, framed=framed, tls=tls) as conn:
        try:
            return conn.call(request)
        except EOFError:
            return CLOSED


def seqid_of(message: bytes) -> int:
    """The seqid of a strict-header message."""
    (name_len,) = struct.unpack_from(">i", message, 4)
    return int(struct.unpack_from(">i", message, 8 + name_len)[0])


def without_seqid(message: bytes) -> bytes:
    (name_len,) = struct.unpack_from(">i", message, 4)
    at = 8 + name_len
    return message[:at] + b"\0\0\0\0" + message[at + 4 :]


def with_seqid(message: bytes, seqid: int) -> bytes:
    """A strict-header message with its seqid replaced."""
    (name_len,) = struct.unpack_from(">i", message, 4)
    at = 8 + name_len
    return message[:at] + struct.pack(">i", seqid) + message[at + 4 :]


def same_result(method: str, a: bytes, b: bytes) -> bool:
    """Equal as Thrift values (header, then the decoded result). For replies the HMS itself
    does not serialize deterministically: it writes a partition's parameter map in an order
    that varies with the partitions requested together."""
    if a == b:
        return True
    cut = 12 + len(method)
    if a[:cut] != b[:cut]:
        return False
    from proxy import idl

    return bool(idl.decode_result(method, a[cut:]) == idl.decode_result(method, b[cut:]))


def _application_exception(reply: bytes) -> TApplicationException:
    from proxy.wire.binary import MessageType

    proto = TBinaryProtocol(TMemoryBuffer(reply))
    _, mtype, _ = proto.readMessageBegin()
    assert mtype == MessageType.EXCEPTION
    exc = TApplicationException()
    exc.read(proto)
    return exc
