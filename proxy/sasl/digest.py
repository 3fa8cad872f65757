"""A DIGEST-MD5 client (RFC 2831) as Java's ``DigestMD5Server`` expects it, sans-I/O.

The metastore takes delegation-token connections with the JDK's DIGEST-MD5 server, protocol
``null`` and server name ``default`` (``HadoopThriftAuthBridge.Server``), so the digest-uri is
``null/default`` and the realm it offers is ``default``. On Thrift's SASL transport::

    C: START "DIGEST-MD5", OK ""            (DigestClient.initial_response)
    S: OK challenge                         realm, nonce, qop, charset, cipher, algorithm
    C: OK DigestClient.respond(challenge)   username, cnonce, response, qop, cipher, ...
    S: COMPLETE "rspauth=..."               proves the server knew the password too
       DigestClient.finish(payload) -> SecurityLayer

For a relay that passes a token client's handshake through to the metastore,
:func:`restrict_qop` narrows the protection levels a challenge offers and :func:`token_owner`
reads who a client's response claims to be.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any

from proxy.sasl.digest_layer import (
    STRONG_CIPHERS,
    DigestCipher,
    available_ciphers,
    security_layer,
)
from proxy.sasl.layer import PLAIN, Qop, SaslError, SecurityLayer
from proxy.sasl.tokens import HadoopToken, TokenIdentifier

MECHANISM = "DIGEST-MD5"
DEFAULT_MAXBUF = 65536
MAX_CHALLENGE_BYTES = 2048  # RFC 2831 2.1.1, and Java's client refuses more
MAX_RESPONSE_BYTES = 4096  # RFC 2831 2.1.2, and Java's server refuses more
_MAX_MAXBUF = 16777215  # maxbuf fits the 3 bytes GSSAPI gives it; RFC 2831 says the same
_NONCE_COUNT = "00000001"  # one authentication per connection: no subsequent authentication
_LAYER_MARKER = b":" + b"0" * 32  # A2's suffix when the layers protect frames
_LWS = b" \t\r\n"
_DEFAULT_QOPS = (Qop.AUTH_CONF, Qop.AUTH_INT, Qop.AUTH)
_QOP_NAMES = frozenset(q.value for q in Qop)  # Java reads them regardless of case


# -- RFC 2831 directives: key=value pairs, comma separated, values token or quoted-string ----


@dataclass(frozen=True, slots=True)
class _Directive:
    key: str  # lowercased: Java matches keys regardless of case
    value: bytes  # unquoted and unescaped
    start: int  # the directive's span in the payload (for rewriting one in place)
    end: int


def _skip_lws(data: bytes, i: int) -> int:
    while i < len(data) and data[i] in _LWS:
        i += 1
    return i


def _scan(payload: bytes) -> list[_Directive]:
    """Every directive in order, as Java's ``parseDirectives`` reads them, but stricter: a
    comma must separate directives (Java also takes white space alone)."""
    found: list[_Directive] = []
    n = len(payload)
    i = _skip_lws(payload, 0)
    while i < n:
        if payload[i] == 0x2C:  # an empty list element
            i = _skip_lws(payload, i + 1)
            continue
        start = i
        while i < n and payload[i] not in b'=,"' and payload[i] not in _LWS:
            i += 1
        key = payload[start:i]
        i = _skip_lws(payload, i)
        if not key or i >= n or payload[i] != 0x3D:
            raise SaslError(
                f"DIGEST-MD5: malformed directive at byte {start}: {payload[start : i + 1]!r}"
            )
        i = _skip_lws(payload, i + 1)
        if i < n and payload[i] == 0x22:
            value = bytearray()
            i += 1
            while True:
                if i >= n:
                    raise SaslError(f"DIGEST-MD5: unterminated quoted value for {key!r}")
                c = payload[i]
                if c == 0x5C:  # quoted-pair: the next byte as it is
                    if i + 1 >= n:
                        raise SaslError(f"DIGEST-MD5: unterminated quoted value for {key!r}")
                    value.append(payload[i + 1])
                    i += 2
                elif c == 0x22:
                    i += 1
                    break
                else:
                    value.append(c)
                    i += 1
            raw = bytes(value)
        else:
            begin = i
            while i < n and payload[i] != 0x2C and payload[i] not in _LWS:
                i += 1
            raw = payload[begin:i]
        end = i
        i = _skip_lws(payload, i)
        if i < n and payload[i] != 0x2C:
            raise SaslError(f"DIGEST-MD5: expected ',' after {key!r}, got {payload[i : i + 1]!r}")
        found.append(_Directive(key.decode("latin-1").lower(), raw, start, end))
    return found


def _decode(value: bytes) -> str:
    """Directive text: UTF-8 (what Java sends once charset=utf-8), else ISO-8859-1 (RFC default)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def parse_directives(payload: bytes) -> dict[str, str]:
    """A challenge's or response's directives by (lowercased) key, quoted strings unescaped.

    ``realm`` may come more than once in a challenge (the choices); the first is kept. Any other
    key twice is an error, as in Java.
    """
    out: dict[str, str] = {}
    for d in _scan(payload):
        if d.key in out:
            if d.key == "realm":
                continue
            raise SaslError(f"DIGEST-MD5: directive {d.key!r} more than once")
        out[d.key] = _decode(d.value)
    return out


def _tokens(value: bytes) -> list[str]:
    """A list directive (qop, cipher) split as Java's StringTokenizer(", \\t\\n") does."""
    return [
        t
        for t in _decode(value).replace("\t", ",").replace("\n", ",").replace(" ", ",").split(",")
        if t
    ]


def _quote(value: bytes) -> bytes:
    """A quoted-string's content (RFC 2831 7.2): '"', '\\', DEL and controls but HT, LF, CR
    escaped, as Java escapes them."""
    out = bytearray()
    for c in value:
        if c in (0x22, 0x5C, 0x7F) or (c < 0x20 and c not in (0x09, 0x0A, 0x0D)):
            out.append(0x5C)
        out.append(c)
    return bytes(out)


def restrict_qop(challenge: bytes, allowed: Set[Qop]) -> bytes:
    """The challenge with its qop options cut down to ``allowed`` (in the challenge's order).

    For a relay between a token client and the metastore: the qop list is not part of the
    digest (only the one the client picks is), so narrowing it leaves the handshake valid. The
    other directives are left byte for byte. A relay must still check the qop the client's
    response picks (``parse_directives(response).get("qop", "auth")``): a client may ignore the
    list. Raises SaslError if nothing offered is allowed.
    """
    if len(challenge) > MAX_CHALLENGE_BYTES:
        raise SaslError(f"DIGEST-MD5 challenge of {len(challenge)} bytes")
    qops = [d for d in _scan(challenge) if d.key == "qop"]
    if len(qops) > 1:
        raise SaslError("DIGEST-MD5: directive 'qop' more than once")
    offered = _tokens(qops[0].value) if qops else [Qop.AUTH.value]
    kept = [q for q in offered if q.lower() in {a.value for a in allowed}]
    if not kept:
        raise SaslError(f"DIGEST-MD5: the server offers {offered}, none of them allowed")
    if not qops:
        return challenge  # "auth" by default, and it is allowed
    d = qops[0]
    replacement = b'qop="' + ",".join(kept).encode("ascii") + b'"'
    return challenge[: d.start] + replacement + challenge[d.end :]


def token_owner(response: bytes) -> str:
    """The owner of the delegation token a client's digest-response names (its username).

    A claim until the metastore completes the handshake: only the metastore can check the
    response against the token's password.
    """
    username = parse_directives(response).get("username")
    if username is None:
        raise SaslError("DIGEST-MD5 response without a username")
    return TokenIdentifier.from_username(username).owner


# -- The client ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Challenge:
    """A server's digest-challenge, checked as Java's DigestMD5Client checks it."""

    nonce: bytes
    realms: tuple[str, ...]
    qops: tuple[Qop, ...]  # in the server's order; unknown names dropped
    ciphers: tuple[str, ...]  # as offered, unknown names too
    maxbuf: int
    utf8: bool

    @classmethod
    def parse(cls, payload: bytes) -> Challenge:
        if len(payload) > MAX_CHALLENGE_BYTES:
            raise SaslError(f"DIGEST-MD5 challenge of {len(payload)} bytes")
        realms: list[bytes] = []
        single: dict[str, bytes] = {}
        for d in _scan(payload):
            if d.key == "realm":
                realms.append(d.value)
            elif d.key in single:
                raise SaslError(f"DIGEST-MD5: directive {d.key!r} more than once in the challenge")
            else:
                single[d.key] = d.value
        if "rspauth" in single:
            raise SaslError("DIGEST-MD5: rspauth in the first challenge")
        charset = single.get("charset")
        if charset is not None and charset.lower() != b"utf-8":
            raise SaslError(f"DIGEST-MD5: charset {charset!r} (only utf-8 may be named)")
        if single.get("algorithm") != b"md5-sess":
            raise SaslError(f"DIGEST-MD5: algorithm {single.get('algorithm')!r}, not md5-sess")
        nonce = single.get("nonce")
        if not nonce:
            raise SaslError("DIGEST-MD5: challenge without a nonce")
        qops = (
            tuple(Qop(t) for t in map(str.lower, _tokens(single["qop"])) if t in _QOP_NAMES)
            if "qop" in single
            else (Qop.AUTH,)
        )
        raw_maxbuf = single.get("maxbuf", str(DEFAULT_MAXBUF).encode())
        if not raw_maxbuf.isdigit() or not 0 < int(raw_maxbuf) <= _MAX_MAXBUF:
            raise SaslError(f"DIGEST-MD5: maxbuf {raw_maxbuf!r}")
        ciphers = tuple(_tokens(single["cipher"])) if "cipher" in single else ()
        utf8 = charset is not None
        try:
            names = tuple(r.decode("utf-8" if utf8 else "latin-1") for r in realms)
        except UnicodeDecodeError:
            raise SaslError("DIGEST-MD5: a realm is not UTF-8") from None
        return cls(nonce, names, qops, ciphers, int(raw_maxbuf), utf8)


def _credential(text: str, utf8: bool) -> bytes:
    """A username, realm or password as it enters H(A1) (RFC 2831 2.1.2.1, Java's
    ``stringToByte_8859_1``): ISO-8859-1 when every character fits, UTF-8 only when one does
    not and the server said charset=utf-8."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        if utf8:
            return text.encode("utf-8")
        raise SaslError("DIGEST-MD5: credentials beyond ISO-8859-1 need charset=utf-8") from None


def _hex(data: bytes) -> bytes:
    return hashlib.md5(data).hexdigest().encode("ascii")


class DigestClient:
    """One DIGEST-MD5 authentication, client side.

    ``qops`` are the protection levels the caller accepts, most wanted first; the client takes
    the first of them that the server offers (Java's rule: ``javax.security.sasl.qop`` is a
    preference list), skipping ``auth-conf`` when no cipher is shared. The default prefers the
    strongest. ``ciphers``, likewise in preference order, are those ``auth-conf`` may use; the
    default is Java's choice among its strong ones (3des, then rc4). ``maxbuf`` is what this
    side says it can take per frame (advisory: Java's peers never split frames by it).
    ``cnonce`` is for tests (RFC 2831's example).
    """

    mechanism = MECHANISM
    initial_response = b""  # DIGEST-MD5 has none: the server speaks first

    def __init__(
        self,
        username: str,
        password: str,
        *,
        qops: Sequence[Qop] = _DEFAULT_QOPS,
        ciphers: Sequence[DigestCipher] = STRONG_CIPHERS,
        protocol: str = "null",
        server_name: str = "default",
        realm: str | None = None,
        authzid: str | None = None,
        maxbuf: int = DEFAULT_MAXBUF,
        cnonce: str | None = None,
    ) -> None:
        if not qops:
            raise ValueError("no protection level allowed")
        self.username = username
        self.qops = tuple(qops)
        self.ciphers = tuple(DigestCipher(c) for c in ciphers)
        self.digest_uri = f"{protocol}/{server_name}"
        self.authzid = authzid
        self.maxbuf = maxbuf
        self._password = password
        self._realm = realm
        self._cnonce = (cnonce or base64.b64encode(secrets.token_bytes(30)).decode()).encode()
        self._challenge: Challenge | None = None
        self._done = False
        self.qop: Qop | None = None  # what was chosen, once respond() ran
        self.cipher: DigestCipher | None = None
        self.realm: str | None = None

    @classmethod
    def for_token(cls, token: HadoopToken, **options: Any) -> DigestClient:
        """A client with a delegation token's credentials, as Hadoop encodes them."""
        return cls(token.digest_username, token.digest_password, **options)

    def _choose(self, challenge: Challenge) -> tuple[Qop, DigestCipher | None]:
        usable = [
            c for c in self.ciphers if c.value in challenge.ciphers and c in available_ciphers()
        ]
        for qop in self.qops:
            if qop not in challenge.qops:
                continue
            if qop is not Qop.AUTH_CONF:
                return qop, None
            if usable:
                return qop, usable[0]
        ours = [c.value for c in self.ciphers if c in available_ciphers()]
        raise SaslError(
            "DIGEST-MD5: no common protection: the server offers "
            f"{[q.value for q in challenge.qops]} (ciphers {list(challenge.ciphers)}), "
            f"this client allows {[q.value for q in self.qops]} (ciphers {ours})"
        )

    def _digest(self, method: bytes) -> tuple[bytes, bytes]:
        """(response-value in hex, binary H(A1)) for method "AUTHENTICATE" or "" (rspauth)."""
        ch, qop = self._challenge, self.qop
        assert ch is not None and qop is not None and self.realm is not None
        secret = hashlib.md5(
            b":".join(_credential(s, ch.utf8) for s in (self.username, self.realm, self._password))
        ).digest()
        a1 = [secret, ch.nonce, self._cnonce]
        if self.authzid is not None:
            a1.append(self.authzid.encode("utf-8"))
        ha1 = hashlib.md5(b":".join(a1)).digest()
        a2 = method + b":" + self.digest_uri.encode("utf-8")
        if qop is not Qop.AUTH:
            a2 += _LAYER_MARKER
        kd = [
            ha1.hex().encode(),
            ch.nonce,
            _NONCE_COUNT.encode(),
            self._cnonce,
            qop.value.encode(),
            _hex(a2),
        ]
        return _hex(b":".join(kd)), ha1

    def respond(self, challenge: bytes) -> bytes:
        """The digest-response to the server's challenge."""
        if self._challenge is not None:
            raise SaslError(
                "DIGEST-MD5: a second challenge (subsequent authentication is not supported)"
            )
        ch = Challenge.parse(challenge)
        self.qop, self.cipher = self._choose(ch)
        if self._realm is not None:
            self.realm = self._realm
        else:
            self.realm = ch.realms[0] if ch.realms else ""
        self._challenge = ch
        value = self._digest(b"AUTHENTICATE")[0]  # first: it checks the credentials' charset
        charset = "utf-8" if ch.utf8 else "latin-1"

        def quoted(text: str | bytes) -> bytes:
            raw = text if isinstance(text, bytes) else text.encode(charset)
            return b'"' + _quote(raw) + b'"'

        # Java's DigestMD5Client order, so that a trace reads the same.
        parts: list[bytes] = []
        if ch.utf8:
            parts.append(b"charset=utf-8")
        parts.append(b"username=" + quoted(self.username))
        if self.realm:
            parts.append(b"realm=" + quoted(self.realm))
        parts += [
            b"nonce=" + quoted(ch.nonce),
            b"nc=" + _NONCE_COUNT.encode(),
            b"cnonce=" + quoted(self._cnonce),
            b"digest-uri=" + quoted(self.digest_uri),
            b"maxbuf=" + str(self.maxbuf).encode(),
            b"response=" + value,
            b"qop=" + self.qop.value.encode(),
        ]
        if self.cipher is not None:
            parts.append(b"cipher=" + quoted(self.cipher.value))
        if self.authzid is not None:
            parts.append(b"authzid=" + quoted(self.authzid.encode("utf-8")))
        response = b",".join(parts)
        if len(response) > MAX_RESPONSE_BYTES:
            raise SaslError(f"DIGEST-MD5 response of {len(response)} bytes (a server takes 4096)")
        return response

    def finish(self, payload: bytes) -> SecurityLayer:
        """Check the server's ``rspauth`` (the COMPLETE message's payload); the frames' layer."""
        if self._challenge is None or self._done:
            raise SaslError("DIGEST-MD5: rspauth out of turn")
        self._done = True
        rspauth = parse_directives(payload).get("rspauth")
        if rspauth is None:
            raise SaslError(
                f"DIGEST-MD5: the server's last message has no rspauth: {payload[:100]!r}"
            )
        expected, ha1 = self._digest(b"")
        self._password = ""  # not needed any more (Java clears its copy here too)
        if not hmac.compare_digest(rspauth.encode("utf-8", "replace"), expected):
            raise SaslError("DIGEST-MD5: the server's rspauth does not match: not the real server")
        assert self.qop is not None
        layer = security_layer(self.qop, ha1, self._challenge.maxbuf, self.cipher)
        return PLAIN if layer is None else layer


__all__ = [
    "MECHANISM",
    "Challenge",
    "DigestCipher",
    "DigestClient",
    "parse_directives",
    "restrict_qop",
    "token_owner",
]
