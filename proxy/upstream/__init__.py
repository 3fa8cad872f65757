"""The metastore side: a pool of connections (:mod:`.pool`; its limits and waiting line in
:mod:`.admission`, its idle connections in :mod:`.idle`, the metastores it connects to in
:mod:`.endpoints`), one call on one of them (:mod:`.relay`), and how such a call fails
(:mod:`.errors`)."""

from proxy.upstream.connection import Identity, UpstreamConnection
from proxy.upstream.endpoints import Opener
from proxy.upstream.errors import (
    UpstreamAuthFailed,
    UpstreamClosed,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from proxy.upstream.pool import UpstreamPool, set_ugi_succeeded
from proxy.upstream.relay import ClientChannel, Timeouts, exchange, relay, result_outcome

__all__ = [
    "ClientChannel",
    "Identity",
    "Opener",
    "Timeouts",
    "UpstreamAuthFailed",
    "UpstreamClosed",
    "UpstreamConnection",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamProtocolError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "UpstreamUnreachable",
    "exchange",
    "relay",
    "result_outcome",
    "set_ugi_succeeded",
]
