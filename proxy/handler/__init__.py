"""The request path: one client call at a time, from the catalog to a reply.

:mod:`.dispatch` picks the way for each call; :mod:`.reads`, :mod:`.writes` and
:mod:`.identity` are those ways; :mod:`.forward` sends a call to the metastore and relays
its reply; :mod:`.session` is what the proxy knows of a client connection.
"""

from proxy.handler.dispatch import CallHandler
from proxy.handler.forward import upstream_request
from proxy.handler.session import ClientGone, SessionState
from proxy.upstream import ClientChannel, result_outcome

__all__ = [
    "CallHandler",
    "ClientChannel",
    "ClientGone",
    "SessionState",
    "result_outcome",
    "upstream_request",
]
