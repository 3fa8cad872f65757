"""The DIGEST-MD5 client and its layers against the real Java implementation.

tests/rig/java/DigestPeer.java is a Thrift-SASL DIGEST-MD5 server made as a Hive 2.3
metastore makes its token side (libthrift's TSaslServerTransport, the JDK's DIGEST-MD5 server
as ``null``/``default``, Hive's callback handler over a DelegationTokenSecretManager): it mints
real delegation tokens, checks the password against them, names the token's owner as the
authorization ID, then echoes each frame (unwrap, then wrap), so that every echoed payload
proves both directions of a layer.
"""

from __future__ import annotations

import queue
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from proxy.sasl import negotiation
from proxy.sasl.digest import DigestCipher, DigestClient, restrict_qop, token_owner
from proxy.sasl.digest_layer import JAVA_CIPHER_ORDER
from proxy.sasl.layer import Qop, SaslError, SecurityLayer
from proxy.sasl.negotiation import NegotiationReader, Status
from proxy.sasl.tokens import HIVE_DELEGATION_KIND, HadoopToken
from tests.rig import java

pytestmark = pytest.mark.hms

OWNERS = "bob/proxy/,ñandú/hive/alice"
SPECS = [
    "auth",
    "auth-int",
    "auth-conf",
    "auth-conf,auth-int,auth",
    "auth-int@4096",
    "auth-conf@4096",
]
SIZES = [1, 7, 8, 9, 15, 16, 17, 100, 1024, 4000, 65536 - 32, 65536, 200_000]


@dataclass
class Peer:
    process: subprocess.Popen[str]
    tokens: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    choices: dict[str, tuple[str, str]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    def token(self, owner: str = "bob") -> HadoopToken:
        return HadoopToken.decode(self.tokens[owner][0])

    def event(self, kind: str, port: int, timeout: float = 20) -> list[str]:
        """The next SESSION or CLOSED line for a port (others of that kind are put back)."""
        skipped = []
        try:
            while True:
                words = self.lines.get(timeout=timeout).split(" ", 6 if kind == "SESSION" else 2)
                if words[0] == kind and words[1] == str(port):
                    return words
                skipped.append(" ".join(words))
        finally:
            for line in skipped:
                self.lines.put(line)


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    command = [
        "java",
        "--add-opens=java.security.sasl/com.sun.security.sasl.digest=ALL-UNNAMED",
        "-cp",
        java.classpath(java.compiled_helpers()),
        "DigestPeer",
        OWNERS,
        *SPECS,
    ]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        encoding="utf-8",
    )
    assert process.stdout is not None and process.stdin is not None
    found = Peer(process)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            found.lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while (line := found.lines.get(timeout=120)) != "READY":
            kind, rest = line.split(" ", 1)
            if kind == "TOKEN":
                owner, url, *numbers = rest.split(" ")
                found.tokens[owner] = (url, [int(n) for n in numbers])
            elif kind == "CHOICE":
                spec, qop, cipher = rest.split(" ")
                found.choices[spec] = (qop, cipher)
            elif kind == "LISTEN":
                spec, port = rest.split(" ")
                found.ports[spec] = int(port)
        yield found
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        process.stdout.close()


class Session:
    """One Thrift-SASL connection: the negotiation, then length-prefixed frames."""

    def __init__(self, port: int, client: DigestClient) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.port = port
        self.reader = NegotiationReader()
        self.challenge = b""
        self.response = b""
        self.sock.sendall(
            negotiation.encode(Status.START, client.mechanism.encode())
            + negotiation.encode(Status.OK, client.initial_response)
        )

    def message(self) -> negotiation.Negotiation:
        while (message := self.reader.next()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("peer closed during the negotiation")
            self.reader.feed(data)
        return message

    def handshake(self, client: DigestClient, narrow: set[Qop] | None = None) -> SecurityLayer:
        first = self.message()
        assert first.status is Status.OK, first
        self.challenge = first.payload if narrow is None else restrict_qop(first.payload, narrow)
        self.response = client.respond(self.challenge)
        self.sock.sendall(negotiation.encode(Status.OK, self.response))
        last = self.message()
        if last.status is not Status.COMPLETE:
            raise SaslError(f"{last.status.name}: {last.payload.decode(errors='replace')}")
        self.buffer = bytearray(self.reader.rest())
        return client.finish(last.payload)

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("peer closed")
            self.buffer += data
        chunk = bytes(self.buffer[:size])
        del self.buffer[:size]
        return chunk

    def send(self, frame: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(frame)) + frame)

    def recv(self) -> bytes:
        (size,) = struct.unpack(">I", self._exactly(4))
        return self._exactly(size)

    def close(self) -> None:
        self.sock.close()


def test_tokens_decode_as_hadoop_encodes_them(peer: Peer) -> None:
    for spec in OWNERS.split(","):
        owner, renewer, real_user = spec.split("/")
        url, (issue, max_date, sequence, master_key) = peer.tokens[owner]
        token = HadoopToken.decode(url)
        assert token.kind == HIVE_DELEGATION_KIND and token.service == ""
        assert token.encode() == url  # Hadoop's own URL-safe base64, no padding
        ident = token.token_identifier()
        assert (ident.owner, ident.renewer, ident.real_user) == (owner, renewer, real_user)
        assert (ident.issue_date, ident.max_date) == (issue, max_date)
        assert (ident.sequence, ident.master_key) == (sequence, master_key)
        assert ident.to_bytes() == token.identifier


def _echo(peer: Peer, spec: str, client: DigestClient, sizes: list[int]) -> SecurityLayer:
    port = peer.ports[spec]
    session = Session(port, client)
    try:
        layer = session.handshake(client)
        _, _, user, authzid, qop, cipher, raw_send = peer.event("SESSION", port)
        assert user == "bob"  # as the metastore would run the calls
        assert authzid == client.username  # the SASL authorization ID is the identifier
        assert qop == layer.qop.value == client.qop
        assert cipher == (client.cipher.value if client.cipher else "-")
        for i, size in enumerate(sizes):
            payload = bytes((i + j) & 0xFF for j in range(size))
            frame = layer.wrap(payload)
            session.send(frame)
            back = session.recv()
            if layer.qop is not Qop.AUTH:
                assert back != payload  # protected, not plain
            assert layer.unwrap(back) == payload, size
        if layer.qop is not Qop.AUTH:
            # Java's figure (maxbuf-16, maxbuf-26) is never above ours
            assert 0 < int(raw_send) <= layer.max_send
    finally:
        session.close()
    assert peer.event("CLOSED", port)[2] == "eof"
    return layer


@pytest.mark.parametrize("spec", ["auth", "auth-int", "auth-conf,auth-int,auth"])
def test_each_protection_level(peer: Peer, spec: str) -> None:
    client = DigestClient.for_token(peer.token())
    layer = _echo(peer, spec, client, SIZES)
    assert layer.qop is Qop(spec.split(",")[0])


@pytest.mark.parametrize("cipher", list(DigestCipher))
def test_each_cipher(peer: Peer, cipher: DigestCipher) -> None:
    client = DigestClient.for_token(peer.token(), ciphers=[cipher])
    layer = _echo(peer, "auth-conf", client, SIZES)
    assert client.cipher is cipher and layer.max_send == (65517 if cipher.block_size > 1 else 65520)


@pytest.mark.parametrize("spec", SPECS)
def test_default_choice_is_javas(peer: Peer, spec: str) -> None:
    """Against each server, the default client picks what the JDK's own client picks."""
    client = DigestClient.for_token(peer.token(), ciphers=JAVA_CIPHER_ORDER)
    port = peer.ports[spec]
    session = Session(port, client)
    try:
        session.handshake(client)
        peer.event("SESSION", port)
    finally:
        session.close()
    peer.event("CLOSED", port)
    assert client.qop is not None
    assert (client.qop.value, client.cipher.value if client.cipher else "-") == peer.choices[spec]
    assert DigestClient.for_token(peer.token()).ciphers[0] is DigestCipher.DES3


@pytest.mark.parametrize(
    ("spec", "cipher"),
    [("auth-int@4096", None), *(("auth-conf@4096", c) for c in DigestCipher)],
)
def test_frames_near_the_servers_maxbuf(peer: Peer, spec: str, cipher: DigestCipher | None) -> None:
    """A server with maxbuf 4096 says so (quoted, as Java writes it); a message of max_send
    bytes wraps to at most 4096, one more byte to more; Java takes bigger frames anyway."""
    client = DigestClient.for_token(peer.token(), ciphers=[cipher] if cipher else [])
    port = peer.ports[spec]
    session = Session(port, client)
    try:
        layer = session.handshake(client)
        assert b'maxbuf="4096"' in session.challenge
        peer.event("SESSION", port)
        limit = layer.max_send
        for size in [limit - 9, limit - 1, limit, limit + 1, 4096, 100_000]:
            payload = bytes(size % 251 for _ in range(size))
            frame = layer.wrap(payload)
            assert (len(frame) <= 4096) == (size <= limit), (size, len(frame))
            session.send(frame)
            assert layer.unwrap(session.recv()) == payload
    finally:
        session.close()
    assert peer.event("CLOSED", port)[2] == "eof"


def test_non_ascii_owner(peer: Peer) -> None:
    client = DigestClient.for_token(peer.token("ñandú"))
    port = peer.ports["auth-conf"]
    session = Session(port, client)
    try:
        session.handshake(client)
        assert peer.event("SESSION", port)[2] == "ñandú"
        assert token_owner(session.response) == "ñandú"
    finally:
        session.close()
    peer.event("CLOSED", port)


def test_wrong_password_is_refused_by_java(peer: Peer) -> None:
    token = peer.token()
    forged = HadoopToken(token.identifier, bytes(len(token.password)), token.kind, token.service)
    client = DigestClient.for_token(forged)
    port = peer.ports["auth-conf"]
    session = Session(port, client)
    try:
        with pytest.raises(SaslError, match="Mismatched response"):
            session.handshake(client)
    finally:
        session.close()
    assert "Mismatched response" in peer.event("CLOSED", port)[2]


def test_tampered_frame_is_never_echoed(peer: Peer) -> None:
    """Java drops a frame whose MAC fails (no error) and then, at the next frame, finds the
    sequence out of order and ends the connection: forged bytes never reach the server."""
    client = DigestClient.for_token(peer.token(), qops=[Qop.AUTH_INT])
    port = peer.ports["auth-conf,auth-int,auth"]
    session = Session(port, client)
    try:
        layer = session.handshake(client)
        peer.event("SESSION", port)
        frame = bytearray(layer.wrap(b"get_table"))
        frame[0] ^= 1
        session.send(bytes(frame))
        session.send(layer.wrap(b"get_database"))
        with pytest.raises((EOFError, ConnectionResetError)):
            session.recv()
    finally:
        session.close()
    assert "Out of order" in peer.event("CLOSED", port)[2]


def test_a_relay_may_narrow_the_qop(peer: Peer) -> None:
    """restrict_qop on a real challenge: the client then picks auth-int, Java accepts it."""
    client = DigestClient.for_token(peer.token())
    port = peer.ports["auth-conf,auth-int,auth"]
    session = Session(port, client)
    try:
        layer = session.handshake(client, narrow={Qop.AUTH_INT, Qop.AUTH})
        assert b'qop="auth-int,auth"' in session.challenge
        assert layer.qop is Qop.AUTH_INT
        assert token_owner(session.response) == "bob"
        assert peer.event("SESSION", port)[4] == "auth-int"
        session.send(layer.wrap(b"ping"))
        assert layer.unwrap(session.recv()) == b"ping"
    finally:
        session.close()
    peer.event("CLOSED", port)
