"""A hit answered at once, answered again on its connection with no look-up at all.

Engines ask the same thing again and again on one connection (Spark's ``get_table`` while
it plans a query, a pooled connection's look-ups of one table). The call a connection had
answered last at once (see :meth:`.dispatch.CallHandler.serve_hit_now`) is kept as an
:class:`Again`: the next request is compared with it in place, its bytes but for the seqid,
and answered while the hit that answered it holds (:meth:`CacheEngine.hit_again`: the
store's version generation it was judged under, before the entry's expiry, its in-process
copy still kept, no invalidation pending), with the reply's parts prepared once. Otherwise
a call is found by its copied bytes in a memo, then its plan, then its entry; on a machine
whose other processes keep evicting the proxy's memory from the CPU's caches, each of those
steps costs several times what it costs warm, and the whole hit several times the floor.

The session drops its :class:`Again` as soon as a call takes another way: that call may
change what this connection would be answered (``set_ugi``, a pinned connection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from proxy.cache.entry import Payload
from proxy.cache.ready import Ready
from proxy.handler.session import ClientGone
from proxy.loop_metrics import Count, Observed
from proxy.upstream import result_outcome
from proxy.wire.binary import reseq
from proxy.wire.framing import Transport

# What a connection writes: raises ConnectionError when the client is gone.
Write = Callable[[bytes], None]


def prepared(reply: Payload) -> tuple[bytes, Payload, str]:
    """A cached reply's parts as every hit on it writes them: its header up to the seqid,
    the rest after the seqid (a view, not a copy), and its outcome label."""
    _, at, mtype = reseq(reply, 0)
    outcome = result_outcome(mtype, bytes(reply[at : at + 3]))
    return bytes(reply[: at - 4]), memoryview(reply)[at:], outcome


def answer(ready: Ready, seqid: bytes, write: Write) -> str:
    """Write ``ready``'s reply, its parts :func:`prepared`, with ``seqid`` (its four
    bytes); the outcome label."""
    assert ready.answer is not None
    head, rest, outcome = ready.answer
    write(head + seqid + rest)
    return outcome


class Again:
    __slots__ = (
        "after",
        "at",
        "before",
        "duration",
        "gone",
        "head",
        "hit_again",
        "length",
        "parts",
        "ready",
        "requests",
        "rest",
    )

    def __init__(
        self,
        request: bytes,
        at: int,
        transport: Transport,
        ready: Ready,
        hit_again: Callable[[Ready], bool],
        requests: Count,
        duration: Observed,
        gone: Count,
    ) -> None:
        parts = ready.answer
        assert parts is not None  # (prepared when it was answered)
        self.length = len(request)
        self.at = at  # where the request's seqid is
        self.before = request[:at]
        self.after = request[at + 4 :]
        self.ready = ready
        self.parts = parts  # the reply's, as prepared (another once it is retired)
        self.head = transport.prefix(len(ready.reply)) + parts[0]  # framed, on a framed one
        self.rest = parts[1]
        self.hit_again = hit_again
        self.requests = requests  # hmsproxy_requests{method, outcome} of its reply
        self.duration = duration  # hmsproxy_request_duration_seconds{method, "cache"}
        self.gone = gone  # hmsproxy_requests{method, "client_gone"}

    def answer(self, data: bytes, transport: asyncio.WriteTransport) -> bool:
        """Answer ``data`` on ``transport`` (open, nothing waiting to be written) if it is
        the same call, but for its seqid, and the same hit still answers it; ``False``:
        nothing was written or counted."""
        if (
            len(data) != self.length
            or not data.startswith(self.before)
            or not data.endswith(self.after)
        ):
            return False
        started = time.perf_counter()
        ready = self.ready
        if ready.answer is not self.parts or not self.hit_again(ready):
            return False
        at = self.at
        try:
            transport.write(self.head + data[at : at + 4] + self.rest)
        except (ConnectionError, RuntimeError) as exc:  # (uvloop's, on a closed transport)
            self.gone.inc()
            raise ClientGone(f"client connection lost: {exc}") from exc
        self.requests.inc()
        self.duration.observe(time.perf_counter() - started)
        return True
