"""DIGEST-MD5's security layers (RFC 2831 2.3 and 2.4), byte for byte as Java's DigestMD5Base.

``auth-int``: each frame is ``msg | MAC(10) | 0x0001 | seqnum(4)`` with
``MAC = HMAC-MD5(Ki, seqnum | msg)[0..9]``, Kic for client to server and Kis back.

``auth-conf``: ``CIPHER(Kc, msg | padding | MAC(10)) | 0x0001 | seqnum(4)``. The block ciphers
(3des, des) are CBC whose state runs on across frames (Java calls ``Cipher.update``, never
``doFinal``), so a frame can only be read in order and after all the frames before it; RC4 is a
stream whose key stream runs on the same way. Padding is 1-8 bytes each holding its count; the
MAC covers the message only.

Each direction numbers its frames from 0. A frame whose number is not the next one (replayed,
dropped, reordered) or whose MAC does not match raises :class:`SaslError`, after which the layer
refuses all use: the cipher state has moved past a frame the peer did not send, so nothing after
it could be read anyway. (Java drops a frame with a bad MAC and goes on; it then fails at the
next frame's sequence number, or with a block cipher at its MAC.)

A layer is for one connection and one task at a time: wrap and unwrap each carry state.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from enum import StrEnum
from typing import TYPE_CHECKING

from proxy.sasl.layer import Qop, SaslError

if TYPE_CHECKING:
    from cryptography.hazmat.decrepit.ciphers.algorithms import ARC4, TripleDES
    from cryptography.hazmat.primitives.ciphers import CipherContext

_MSG_TYPE = b"\x00\x01"
_MAC_SIZE = 10
_TRAILER = 2 + 4  # message type, sequence number
_SEQ_MASK = 0xFFFFFFFF

_CLIENT_SIGN = b"Digest session key to client-to-server signing key magic constant"
_SERVER_SIGN = b"Digest session key to server-to-client signing key magic constant"
_CLIENT_SEAL = b"Digest H(A1) to client-to-server sealing key magic constant"
_SERVER_SEAL = b"Digest H(A1) to server-to-client sealing key magic constant"


class DigestCipher(StrEnum):
    """The ``auth-conf`` ciphers of RFC 2831, under their directive names."""

    DES3 = "3des"
    RC4 = "rc4"
    DES = "des"
    RC4_56 = "rc4-56"
    RC4_40 = "rc4-40"

    @property
    def block_size(self) -> int:
        return 8 if self in (DigestCipher.DES3, DigestCipher.DES) else 1

    @property
    def key_material(self) -> int:
        """n: how many bytes of H(A1) go into Kc: 5 for rc4-40, 7 for rc4-56, else 16 (des too,
        as Java's DigestMD5Base has it). Only the key's entropy shrinks: RC4 always keys with all
        16 bytes of Kc."""
        return {DigestCipher.RC4_40: 5, DigestCipher.RC4_56: 7}.get(self, 16)


# What Java's DigestMD5Client picks, first to last: by strength (high: 3des and rc4; medium:
# des and rc4-56; low: rc4-40), then in DigestMD5Base.CIPHER_TOKENS order. A Java server offers
# all five in this order; the client chooses.
JAVA_CIPHER_ORDER = (
    DigestCipher.DES3,
    DigestCipher.RC4,
    DigestCipher.DES,
    DigestCipher.RC4_56,
    DigestCipher.RC4_40,
)
# Java's "high" strength. The default: a server that offers only 56- or 40-bit keys is refused
# unless the caller asks for them.
STRONG_CIPHERS = (DigestCipher.DES3, DigestCipher.RC4)


def integrity_keys(ha1: bytes) -> tuple[bytes, bytes]:
    """(Kic, Kis) from the binary H(A1) of the handshake."""
    return hashlib.md5(ha1 + _CLIENT_SIGN).digest(), hashlib.md5(ha1 + _SERVER_SIGN).digest()


def sealing_keys(ha1: bytes, cipher: DigestCipher) -> tuple[bytes, bytes]:
    """(Kcc, Kcs): MD5 of the first n bytes of H(A1) and the direction's magic constant."""
    head = ha1[: cipher.key_material]
    return hashlib.md5(head + _CLIENT_SEAL).digest(), hashlib.md5(head + _SERVER_SEAL).digest()


def des_key(seven: bytes) -> bytes:
    """Java's ``addDesParity``: 56 key bits spread over 8 bytes, each with odd parity in bit 0."""
    if len(seven) != 7:
        raise ValueError("a DES key is made from 7 bytes")
    bits = int.from_bytes(seven, "big")
    out = bytearray(8)
    for i in range(7, -1, -1):
        b = (bits & 0x7F) << 1
        out[i] = b | ((b.bit_count() & 1) ^ 1)
        bits >>= 7
    return bytes(out)


def _cipher_key(kc: bytes, cipher: DigestCipher) -> bytes:
    """The key the cipher runs with. 3DES is two-key EDE (K1, K2, K1) from Kc's first 14
    bytes; DES uses the first 7, given as K1 three times (the same cipher, and the form
    cryptography still accepts); every RC4 variant keys with all 16 bytes of Kc."""
    if cipher is DigestCipher.DES3:
        k1, k2 = des_key(kc[:7]), des_key(kc[7:14])
        return k1 + k2 + k1
    if cipher is DigestCipher.DES:
        return des_key(kc[:7]) * 3
    return kc


def _algorithms() -> tuple[type[TripleDES], type[ARC4]]:
    """(TripleDES, ARC4), imported on first use so that auth and auth-int need no cryptography.

    Both moved to ``hazmat.decrepit`` in cryptography 43 (the old names warn, then go).
    """
    try:
        from cryptography.hazmat.decrepit.ciphers import algorithms
    except ImportError:  # cryptography < 43
        from cryptography.hazmat.primitives.ciphers import algorithms  # type: ignore[no-redef]
    return algorithms.TripleDES, algorithms.ARC4


def _context(kc: bytes, cipher: DigestCipher, *, encrypt: bool) -> CipherContext:
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

    triple_des, arc4 = _algorithms()
    key = _cipher_key(kc, cipher)
    if cipher.block_size > 1:
        block = Cipher(triple_des(key), modes.CBC(kc[8:16]))  # IV: the last 8 bytes of Kc
        return block.encryptor() if encrypt else block.decryptor()
    stream = Cipher(arc4(key), None)
    return stream.encryptor() if encrypt else stream.decryptor()


@functools.cache
def available_ciphers() -> frozenset[DigestCipher]:
    """The ciphers this process can run (Java's ``getPlatformCiphers``): none without the
    ``cryptography`` package, and no RC4 where its OpenSSL has no legacy provider."""
    found = set()
    for cipher in DigestCipher:
        try:
            _context(bytes(16), cipher, encrypt=True).update(bytes(8))
        except Exception:  # ImportError, UnsupportedAlgorithm, an OpenSSL refusal
            continue
        found.add(cipher)
    return frozenset(found)


def max_send(qop: Qop, maxbuf: int, cipher: DigestCipher | None = None) -> int:
    """The largest message whose wrapped frame fits the peer's ``maxbuf``.

    Java's own figure is cruder (maxbuf-16 for auth-int, maxbuf-26 for any auth-conf
    cipher); this is exact: 16 bytes of MAC and trailer, plus 1-8 of padding for a block
    cipher. No peer checks it, though (libthrift wraps each flush whole, whatever its size).
    """
    if qop is Qop.AUTH:
        return 0
    room = maxbuf - _TRAILER
    if cipher is not None and cipher.block_size > 1:
        size = room // cipher.block_size * cipher.block_size - _MAC_SIZE - 1
    else:
        size = room - _MAC_SIZE
    if size < 1:
        raise SaslError(f"maxbuf {maxbuf} leaves no room for a {qop} message")
    return size


class IntegrityLayer:
    """``auth-int``: the message in clear with a MAC and a sequence number."""

    qop = Qop.AUTH_INT

    def __init__(self, my_ki: bytes, peer_ki: bytes, max_send: int) -> None:
        self.max_send = max_send
        self._my_mac: hmac.HMAC = hmac.new(my_ki, digestmod="md5")
        self._peer_mac: hmac.HMAC = hmac.new(peer_ki, digestmod="md5")
        self._send_seq = 0
        self._recv_seq = 0
        self._failed = False

    def _mac(self, base: hmac.HMAC, seq: bytes, msg: bytes | memoryview) -> bytes:
        mac = base.copy()
        mac.update(seq)
        mac.update(msg)
        return mac.digest()[:_MAC_SIZE]

    def _next_send_seq(self) -> bytes:
        if self._failed:
            raise SaslError("the security layer failed earlier; the connection must end")
        seq = self._send_seq.to_bytes(4, "big")
        self._send_seq = (self._send_seq + 1) & _SEQ_MASK
        return seq

    def _fail(self, reason: str) -> SaslError:
        self._failed = True
        return SaslError(f"DIGEST-MD5 {self.qop}: {reason}")

    def _accept(self, seq: bytes, msg_type: bytes | memoryview) -> None:
        """After the MAC matched: the frame must be the next one, of the only message type."""
        got = int.from_bytes(seq, "big")
        if got != self._recv_seq:
            raise self._fail(f"frame {got} out of sequence (expected {self._recv_seq})")
        if msg_type != _MSG_TYPE:
            raise self._fail(f"message type {bytes(msg_type).hex()} (expected 0001)")
        self._recv_seq = (self._recv_seq + 1) & _SEQ_MASK

    def wrap(self, data: bytes) -> bytes:
        if not data:  # as Java: nothing to protect, no sequence number spent
            return b""
        seq = self._next_send_seq()
        return b"".join([data, self._mac(self._my_mac, seq, data), _MSG_TYPE, seq])

    def unwrap(self, data: bytes) -> bytes:
        if self._failed:
            raise SaslError("the security layer failed earlier; the connection must end")
        if not data:
            return b""
        if len(data) < _MAC_SIZE + _TRAILER:
            raise self._fail(f"frame of {len(data)} bytes is shorter than its MAC and trailer")
        view = memoryview(data)
        msg = view[: -_MAC_SIZE - _TRAILER]
        seq = bytes(view[-4:])
        if not hmac.compare_digest(self._mac(self._peer_mac, seq, msg), view[-16:-6]):
            raise self._fail("MAC does not match")
        self._accept(seq, view[-6:-4])
        return bytes(msg)


class PrivacyLayer(IntegrityLayer):
    """``auth-conf``: the message, padding and MAC encrypted; the trailer in clear."""

    qop = Qop.AUTH_CONF

    def __init__(
        self,
        cipher: DigestCipher,
        my_ki: bytes,
        peer_ki: bytes,
        my_kc: bytes,
        peer_kc: bytes,
        max_send: int,
    ) -> None:
        super().__init__(my_ki, peer_ki, max_send)
        self.cipher = cipher
        self._block = cipher.block_size
        self._encrypt = _context(my_kc, cipher, encrypt=True)
        self._decrypt = _context(peer_kc, cipher, encrypt=False)

    def wrap(self, data: bytes) -> bytes:
        if not data:
            return b""
        seq = self._next_send_seq()
        tail = self._mac(self._my_mac, seq, data)
        if self._block > 1:
            pad = self._block - (len(data) + _MAC_SIZE) % self._block
            tail = bytes([pad]) * pad + tail
        # CBC keeps a partial block between update calls, so the message is not copied first.
        return b"".join([self._encrypt.update(data), self._encrypt.update(tail), _MSG_TYPE, seq])

    def unwrap(self, data: bytes) -> bytes:
        if self._failed:
            raise SaslError("the security layer failed earlier; the connection must end")
        if not data:
            return b""
        view = memoryview(data)
        sealed = view[:-_TRAILER]
        if len(sealed) < _MAC_SIZE + (1 if self._block > 1 else 0):
            raise self._fail(f"frame of {len(data)} bytes is shorter than its MAC and trailer")
        if len(sealed) % self._block:
            raise self._fail(f"{len(sealed)} encrypted bytes are not whole {self.cipher} blocks")
        plain = memoryview(self._decrypt.update(sealed))
        body, mac = plain[:-_MAC_SIZE], plain[-_MAC_SIZE:]
        if self._block > 1:
            pad = body[-1]
            if not 1 <= pad <= self._block or body[-pad:] != bytes([pad]) * pad:
                raise self._fail("bad padding")
            body = body[:-pad]
        seq = bytes(view[-4:])
        if not hmac.compare_digest(self._mac(self._peer_mac, seq, body), mac):
            raise self._fail("MAC does not match")
        self._accept(seq, view[-6:-4])
        return bytes(body)


def security_layer(
    qop: Qop,
    ha1: bytes,
    maxbuf: int,
    cipher: DigestCipher | None = None,
    *,
    server: bool = False,
) -> IntegrityLayer | None:
    """The layer for a finished handshake (None for ``auth``), as the client by default.

    ``maxbuf`` is the peer's (what it can take in one frame). ``server=True`` gives the other
    end's layer, which only tests need.
    """
    if qop is Qop.AUTH:
        return None
    kic, kis = integrity_keys(ha1)
    my_ki, peer_ki = (kis, kic) if server else (kic, kis)
    if qop is Qop.AUTH_INT:
        return IntegrityLayer(my_ki, peer_ki, max_send(qop, maxbuf))
    if cipher is None:
        raise SaslError("auth-conf without a cipher")
    if cipher not in available_ciphers():
        raise SaslError(f"cipher {cipher} is not available here (is cryptography installed?)")
    kcc, kcs = sealing_keys(ha1, cipher)
    my_kc, peer_kc = (kcs, kcc) if server else (kcc, kcs)
    return PrivacyLayer(cipher, my_ki, peer_ki, my_kc, peer_kc, max_send(qop, maxbuf, cipher))
