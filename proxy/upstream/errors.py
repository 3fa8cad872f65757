"""How an exchange with the metastore can fail; ``outcome`` is each one's metrics label."""

from __future__ import annotations


class UpstreamError(Exception):
    """The exchange with the metastore failed; ``outcome`` is the metrics label.

    ``stale``: it failed before any reply byte on a connection that had served calls before,
    the signature of a pooled connection the HMS closed while idle. ``started_reply``: part
    of the reply had already gone to the client.
    """

    outcome = "connection_error"
    stale = False
    started_reply = False


class UpstreamUnavailable(UpstreamError):
    """No metastore connection to be had (none reachable, or all in use)."""


class UpstreamUnreachable(UpstreamUnavailable):
    """No metastore could be connected to (each failure is logged by the pool, once)."""


class UpstreamAuthFailed(UpstreamUnavailable):
    """The metastore refused the proxy's SASL negotiation (or the proxy could not log in).
    ``retry``: a new connection may succeed (a delegation token the HMS forgot was dropped)."""

    outcome = "auth_failed"

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


class UpstreamTimeout(UpstreamError):
    outcome = "timeout"


class UpstreamClosed(UpstreamError):
    """The connection ended mid-call. ``stale``: before any reply byte, on a reused one."""

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


class UpstreamProtocolError(UpstreamError):
    outcome = "protocol_error"


def started(exc: UpstreamError, started_reply: bool) -> UpstreamError:
    """``exc``, marked with whether part of the reply had already gone to the client."""
    exc.started_reply = started_reply
    return exc


class ReplyTooLarge(UpstreamProtocolError):
    """The metastore's reply grew past ``limit`` bytes, the largest a client takes
    (``--max-reply-bytes``) before any of it went out: the client gets an error saying so,
    the connection (its reply half read) is closed, and the call is not sent again."""

    outcome = "reply_too_large"

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit
