"""The GSSAPI SASL mechanism (RFC 4752, Kerberos V5), both sides, sans-I/O.

Each side is a state machine fed the peer's negotiation payloads and answering its own; the
Kerberos work is python-gssapi's (MIT krb5), whose context objects are passed in, so these
classes hold no credentials and do no I/O. After the context is established the server offers
its security layers and its receive buffer (4 bytes, wrapped without confidentiality); the
client picks exactly one and says its own buffer; the server then sends COMPLETE.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.sasl.layer import PLAIN, Layers, Qop, SaslError, SecurityLayer, at_least, qop_for_bit

MAX_BUFFER = 65536  # what the HMS offers, and what the proxy says it can receive


class Context(Protocol):
    """The part of ``gssapi.SecurityContext`` the mechanism uses."""

    @property
    def complete(self) -> bool: ...

    def step(self, token: bytes | None = None) -> bytes | None: ...

    def wrap(self, message: bytes, encrypt: bool) -> Any: ...

    def unwrap(self, message: bytes) -> Any: ...


class GssLayer:
    """``auth-int`` or ``auth-conf``: each frame is one GSS wrap token (RFC 4121)."""

    def __init__(self, context: Context, qop: Qop, max_send: int) -> None:
        self.context = context
        self.qop = qop
        self.max_send = max_send
        self._encrypt = qop is Qop.AUTH_CONF

    def wrap(self, data: bytes) -> bytes:
        return bytes(self.context.wrap(data, self._encrypt).message)

    def unwrap(self, data: bytes) -> bytes:
        try:
            result = self.context.unwrap(data)
        except Exception as exc:  # gssapi.exceptions.GSSError: a bad or replayed token
            raise SaslError(f"cannot unwrap a GSSAPI frame: {exc}") from None
        if self._encrypt and not result.encrypted:
            raise SaslError("a frame without confidentiality on an auth-conf connection")
        return bytes(result.message)


def layer_for(context: Context, qop: Qop, peer_buffer: int) -> SecurityLayer:
    if qop is Qop.AUTH:
        return PLAIN
    # The peer's buffer bounds a wrapped frame; leave room for the token's own header.
    return GssLayer(context, qop, max(1024, peer_buffer - 128) if peer_buffer else 0)


def _security_message(layers: int, max_buffer: int, authzid: bytes = b"") -> bytes:
    return struct.pack(">I", (layers << 24) | (max_buffer & 0xFFFFFF)) + authzid


def _parse_security_message(data: bytes) -> tuple[int, int, bytes]:
    if len(data) < 4:
        raise SaslError(f"GSSAPI security-layer message of {len(data)} bytes (expected 4 or more)")
    (word,) = struct.unpack_from(">I", data)
    return word >> 24, word & 0xFFFFFF, data[4:]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished negotiation: who the peer is (server side) and the frames' protection."""

    principal: str
    layer: SecurityLayer


class GssapiServer:
    """Accepts one client. ``step`` takes each client payload and returns the reply payload
    and whether it is the last (send it as COMPLETE)."""

    def __init__(self, context: Context, offered: Sequence[Qop]) -> None:
        if not offered:
            raise ValueError("no protection offered")
        self.context = context
        self.offered = frozenset(offered)
        self._state = "establishing"
        self.outcome: Outcome | None = None
        self._initiator = ""

    def step(self, token: bytes, initiator: Any = None) -> tuple[bytes, bool]:
        """``initiator``: a callable giving the client's principal once the context is
        established (``lambda: str(ctx.initiator_name)``); kept apart for tests."""
        if self._state == "establishing":
            try:
                out = self.context.step(token)
                # python-gssapi may return an error token and raise only at the next look at
                # the context: look inside the same guard.
                complete = self.context.complete
                if complete:
                    self._initiator = str(initiator()) if initiator else ""
            except Exception as exc:  # GSSError: bad ticket, wrong service, clock skew, ...
                raise SaslError(f"Kerberos authentication failed: {_first_line(exc)}") from None
            if not complete:
                return out or b"", False
            if out:  # mutual authentication: the client answers this with an empty message
                self._state = "confirming"
                return out, False
            return self._offer(), False
        if self._state == "confirming":
            return self._offer(), False
        if self._state == "offered":
            return self._choose(token), True
        raise SaslError("GSSAPI negotiation already complete")

    def _offer(self) -> bytes:
        self._state = "offered"
        bits = 0
        for qop in self.offered:
            bits |= qop.bit
        wrapped = self.context.wrap(_security_message(bits, MAX_BUFFER), False).message
        return bytes(wrapped)

    def _choose(self, token: bytes) -> bytes:
        try:
            chosen = self.context.unwrap(token).message
        except Exception as exc:
            raise SaslError(f"cannot unwrap the client's security layer: {exc}") from None
        bit, peer_buffer, authzid = _parse_security_message(bytes(chosen))
        qop = qop_for_bit(bit)
        if qop not in self.offered:
            raise SaslError(
                f"the client chose {qop}, which is not offered "
                f"(--sasl-qop: {', '.join(sorted(self.offered))})"
            )
        if authzid and authzid.decode("utf-8", "replace") != self._initiator:
            # As Hadoop's server: a Kerberos client may not ask to act as someone else.
            raise SaslError(
                f"{self._initiator} asked to act as {authzid.decode('utf-8', 'replace')!r}"
            )
        self._state = "done"
        self.outcome = Outcome(self._initiator, layer_for(self.context, qop, peer_buffer))
        return b""


class GssapiClient:
    """Authenticates to a server. ``first()`` is the initial response (after START), then
    ``step`` answers each server payload until the server says COMPLETE (``finish``)."""

    def __init__(self, context: Context, allowed: Sequence[Qop]) -> None:
        self.context = context
        self.allowed = list(allowed)
        self._chosen: tuple[Qop, int] | None = None

    def first(self) -> bytes:
        try:
            return self.context.step() or b""
        except Exception as exc:  # no ticket, KDC unreachable, unknown service principal
            raise SaslError(f"Kerberos: cannot start a context: {_first_line(exc)}") from None

    def step(self, token: bytes) -> bytes:
        try:
            if not self.context.complete:
                out = self.context.step(token) or b""
                self.context.complete  # noqa: B018 - raises what step() deferred
                return out
        except Exception as exc:
            raise SaslError(f"Kerberos: the server's reply failed: {_first_line(exc)}") from None
        try:
            offer = bytes(self.context.unwrap(token).message)
        except Exception as exc:
            raise SaslError(f"cannot unwrap the server's security layers: {exc}") from None
        bits, peer_buffer, _ = _parse_security_message(offer)
        qop = choose(bits, self.allowed)
        self._chosen = (qop, peer_buffer)
        reply = _security_message(qop.bit, MAX_BUFFER if qop is not Qop.AUTH else 0)
        return bytes(self.context.wrap(reply, False).message)

    def finish(self) -> SecurityLayer:
        if self._chosen is None or not self.context.complete:
            raise SaslError("the server completed the GSSAPI negotiation early")
        qop, peer_buffer = self._chosen
        return layer_for(self.context, qop, peer_buffer)


def choose(offered_bits: int, allowed: Sequence[Qop]) -> Qop:
    """The weakest offered protection at least as strong as the weakest allowed: the server
    decides what it requires ("privacy" means privacy), the proxy's ``--sasl-qop`` what it
    accepts at least."""
    offered = [q for q in (Qop.AUTH, Qop.AUTH_INT, Qop.AUTH_CONF) if offered_bits & q.bit]
    for qop in at_least(allowed):
        if qop in offered:
            return qop
    names = ", ".join(q.value for q in offered) or "none"
    raise SaslError(
        f"no common protection: the server offers {names}, --sasl-qop asks for at least "
        f"{min(allowed, key=lambda q: q.strength).value}"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["Layers", "Outcome"]
