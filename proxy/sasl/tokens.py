"""Hadoop delegation tokens as the metastore hands them out, and their DIGEST-MD5 credentials.

``get_delegation_token(owner, renewer)`` answers with a Hadoop ``Token`` (the Writable
``vint len | identifier | vint len | password | Text kind | Text service``) in URL-safe
base64, as ``Token.encodeToUrlString`` writes it (commons-codec: no ``=`` padding). A client
holding one authenticates with DIGEST-MD5 as username ``base64(identifier)`` and password
``base64(password)`` (Hadoop's ``SaslRpcServer.encodeIdentifier``/``encodePassword``, standard
alphabet with padding); the metastore decodes the username back into the identifier, finds the
password from its own master key, and runs the connection's calls as the identifier's owner.

Everything here is decoding of bytes that a peer may have made up (a relay reads the username
of a client it has not authenticated yet), so malformed input raises :class:`SaslError`, never
an IndexError or a UnicodeError. Encoders raise ValueError: a bad value there is a caller's bug.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from proxy.sasl.layer import SaslError

HIVE_DELEGATION_KIND = "HIVE_DELEGATION_TOKEN"
# Text.DEFAULT_MAX_LEN, the limit AbstractDelegationTokenIdentifier.readFields gives each name.
MAX_TEXT_BYTES = 1 << 20
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


# -- Hadoop WritableUtils: zero-compressed, signed variable-length integers -------------------


def write_vlong(value: int) -> bytes:
    """``WritableUtils.writeVLong``: -112..127 in one byte, else a length byte and 1-8 bytes.

    The length byte says the sign too: -113..-120 is 1..8 bytes of a non-negative value,
    -121..-128 1..8 bytes of a negative value stored as its one's complement.
    """
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise ValueError(f"{value} does not fit a Java long")
    if -112 <= value <= 127:
        return (value & 0xFF).to_bytes(1, "big")
    marker = -112
    if value < 0:
        value = ~value
        marker = -120
    size = (value.bit_length() + 7) // 8
    return ((marker - size) & 0xFF).to_bytes(1, "big") + value.to_bytes(size, "big")


def write_vint(value: int) -> bytes:
    """``WritableUtils.writeVInt``: the same encoding, for a value that fits a Java int."""
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{value} does not fit a Java int")
    return write_vlong(value)


def read_vlong(data: bytes, offset: int = 0) -> tuple[int, int]:
    """``WritableUtils.readVLong`` at ``offset``: (value, offset after it).

    Like Java, a longer encoding than needed is accepted (only the value matters); what the
    encoder writes is always the shortest.
    """
    if offset >= len(data):
        raise SaslError("truncated variable-length integer")
    first = data[offset] - 256 if data[offset] > 127 else data[offset]
    if first >= -112:
        return first, offset + 1
    negative = first < -120
    size = (-120 - first) if negative else (-112 - first)
    end = offset + 1 + size
    if end > len(data):
        raise SaslError("truncated variable-length integer")
    value = int.from_bytes(data[offset + 1 : end], "big")
    if negative:
        value = ~value
    # Eight bytes of a non-negative value may set the top bit: Java reads that as negative.
    if value > _LONG_MAX:
        value -= 1 << 64
    elif value < _LONG_MIN:
        value += 1 << 64
    return value, end


def read_vint(data: bytes, offset: int = 0) -> tuple[int, int]:
    """``WritableUtils.readVInt``: a vlong that must fit a Java int."""
    value, end = read_vlong(data, offset)
    if not _INT_MIN <= value <= _INT_MAX:
        raise SaslError(f"variable-length integer {value} does not fit a Java int")
    return value, end


class _Reader:
    """Reads Writable fields from bytes a peer sent, every read bounds-checked."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def vint(self) -> int:
        value, self.pos = read_vint(self.data, self.pos)
        return value

    def vlong(self) -> int:
        value, self.pos = read_vlong(self.data, self.pos)
        return value

    def raw(self, size: int, what: str) -> bytes:
        if size < 0:
            raise SaslError(f"negative length {size} for {what}")
        end = self.pos + size
        if end > len(self.data):
            raise SaslError(
                f"truncated {what}: {size} bytes announced, {len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def byte(self, what: str) -> int:
        return self.raw(1, what)[0]

    def text(self, what: str, limit: int = MAX_TEXT_BYTES) -> str:
        """Hadoop ``Text``: vint length, then UTF-8.

        Java's Text replaces malformed UTF-8; here it is an error, so that two different byte
        strings can never read as the same user name.
        """
        size = self.vint()
        if size > limit:
            raise SaslError(f"{what} of {size} bytes (limit {limit})")
        raw = self.raw(size, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SaslError(f"{what} is not UTF-8: {e}") from None

    def rest(self) -> bytes:
        chunk = self.data[self.pos :]
        self.pos = len(self.data)
        return chunk


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return write_vint(len(raw)) + raw


# -- DIGEST-MD5 credentials --------------------------------------------------------------------


def encode_identifier(identifier: bytes) -> str:
    """The DIGEST-MD5 username for a token: ``SaslRpcServer.encodeIdentifier`` (base64)."""
    return base64.b64encode(identifier).decode("ascii")


def decode_identifier(username: str) -> bytes:
    """The identifier bytes back from a DIGEST-MD5 username (``SaslRpcServer.decodeIdentifier``)."""
    try:
        return base64.b64decode(username.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as e:
        raise SaslError(f"DIGEST-MD5 username is not a base64 token identifier: {e}") from None


def encode_password(password: bytes) -> str:
    """The DIGEST-MD5 password for a token: ``SaslRpcServer.encodePassword`` (base64 as chars)."""
    return base64.b64encode(password).decode("ascii")


# -- The token and its identifier --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenIdentifier:
    """``AbstractDelegationTokenIdentifier`` (Hive's ``DelegationTokenIdentifier``), decoded.

    Dates are Java milliseconds since the epoch. ``trailing`` keeps bytes after the known
    fields: Java's ``readFields`` ignores them, and the metastore's password is computed over the
    whole identifier, so :meth:`to_bytes` must give back every byte it was decoded from.
    """

    owner: str
    renewer: str
    real_user: str
    issue_date: int
    max_date: int
    sequence: int
    master_key: int
    version: int = 0
    trailing: bytes = b""

    VERSION = 0  # AbstractDelegationTokenIdentifier.VERSION: anything else is refused by Java

    @classmethod
    def from_bytes(cls, data: bytes) -> TokenIdentifier:
        reader = _Reader(data)
        version = reader.byte("token identifier version")
        if version != cls.VERSION:
            raise SaslError(f"unknown delegation token identifier version {version}")
        return cls(
            owner=reader.text("token owner"),
            renewer=reader.text("token renewer"),
            real_user=reader.text("token real user"),
            issue_date=reader.vlong(),
            max_date=reader.vlong(),
            sequence=reader.vint(),
            master_key=reader.vint(),
            version=version,
            trailing=reader.rest(),
        )

    @classmethod
    def from_username(cls, username: str) -> TokenIdentifier:
        """Who a DIGEST-MD5 client claims to be: the owner of the token its username names.

        A claim only: believe it once the metastore has accepted the handshake (its COMPLETE
        with ``rspauth``), since only the metastore can check the password.
        """
        return cls.from_bytes(decode_identifier(username))

    def to_bytes(self) -> bytes:
        return b"".join(
            [
                bytes([self.version]),
                _text(self.owner),
                _text(self.renewer),
                _text(self.real_user),
                write_vlong(self.issue_date),
                write_vlong(self.max_date),
                write_vint(self.sequence),
                write_vint(self.master_key),
                self.trailing,
            ]
        )


@dataclass(frozen=True, slots=True)
class HadoopToken:
    """A Hadoop ``Token`` as ``get_delegation_token`` returns it (see the module docstring)."""

    identifier: bytes
    password: bytes
    kind: str = HIVE_DELEGATION_KIND
    service: str = ""

    @classmethod
    def decode(cls, text: str) -> HadoopToken:
        """From ``Token.encodeToUrlString``'s form: URL-safe base64, ``=`` padding optional."""
        raw = text.strip().rstrip("=")
        if len(raw) % 4 == 1:
            raise SaslError("delegation token: base64 of impossible length")
        try:
            data = base64.urlsafe_b64decode(_checked_urlsafe(raw) + "=" * (-len(raw) % 4))
        except binascii.Error as e:
            raise SaslError(f"delegation token is not URL-safe base64: {e}") from None
        return cls.from_bytes(data)

    @classmethod
    def from_bytes(cls, data: bytes) -> HadoopToken:
        """The Writable. Unlike Java, bytes after the service are an error, not ignored."""
        reader = _Reader(data)
        token = cls(
            identifier=reader.raw(reader.vint(), "token identifier"),
            password=reader.raw(reader.vint(), "token password"),
            kind=reader.text("token kind"),
            service=reader.text("token service"),
        )
        if reader.pos != len(data):
            raise SaslError(f"{len(data) - reader.pos} stray bytes after the token")
        return token

    def to_bytes(self) -> bytes:
        return b"".join(
            [
                write_vint(len(self.identifier)),
                self.identifier,
                write_vint(len(self.password)),
                self.password,
                _text(self.kind),
                _text(self.service),
            ]
        )

    def encode(self) -> str:
        """As Hadoop writes it: URL-safe base64 without padding."""
        return base64.urlsafe_b64encode(self.to_bytes()).decode("ascii").rstrip("=")

    def token_identifier(self) -> TokenIdentifier:
        return TokenIdentifier.from_bytes(self.identifier)

    @property
    def digest_username(self) -> str:
        return encode_identifier(self.identifier)

    @property
    def digest_password(self) -> str:
        return encode_password(self.password)


_URLSAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _checked_urlsafe(text: str) -> str:
    """``urlsafe_b64decode`` drops characters outside its alphabet; a token must have none."""
    bad = set(text) - _URLSAFE
    if bad:
        raise SaslError(f"delegation token has non-base64 characters {sorted(bad)!r}")
    return text
