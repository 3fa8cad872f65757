"""The pool's idle connections: kept apart by identity, and for how long and how many.

A connection runs as the identity bound to it for its whole life (see :mod:`.pool`), so an
idle one is kept under that identity and only handed out for it. Within an identity the most
recently used goes first: it is the least likely to have been closed by the metastore
meanwhile. Past ``--upstream-max-idle`` the least recently used identity's oldest goes, and
one idle for ``--upstream-idle-timeout`` (or closed under us) is closed, not handed out.
Closing is the pool's (it counts the connections open), so it is done by the pool's
``discard``, given here.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

from proxy.upstream.connection import Identity, UpstreamConnection


class IdleConnections:
    """Idle connections by identity, the least recently used identity first."""

    def __init__(
        self,
        max_idle: int,
        idle_timeout: float,
        discard: Callable[[UpstreamConnection], None],
    ) -> None:
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._discard = discard  # closes a connection for good (it stops counting as open)
        self._by_identity: OrderedDict[Identity | None, deque[UpstreamConnection]] = OrderedDict()
        self._count = 0

    @property
    def count(self) -> int:
        """How many connections are idle (read from the metrics' scrape thread too)."""
        return self._count

    def newest(self, identity: Identity | None) -> UpstreamConnection | None:
        """The connection :meth:`take` would try first for ``identity``, left in place."""
        queue = self._by_identity.get(identity)
        return queue[-1] if queue else None

    def put(self, conn: UpstreamConnection) -> None:
        """Keep ``conn``, idle from now; beyond the limit the oldest idle connections go."""
        conn.idle_since = time.monotonic()
        by_identity = self._by_identity
        queue = by_identity.get(conn.identity)
        if queue is None:
            by_identity[conn.identity] = deque((conn,))
        else:
            queue.append(conn)
            by_identity.move_to_end(conn.identity)
        self._count += 1
        while self._count > self._max_idle:
            self._discard(self.pop_oldest())

    def take(self, identity: Identity | None) -> UpstreamConnection | None:
        """A usable idle connection running as ``identity``, if there is one; the stale ones
        met on the way are closed."""
        queue = self._by_identity.get(identity)
        now = time.monotonic()
        found = None
        while queue:
            conn = queue.pop()  # most recently used first: it is the least likely to be stale
            self._count -= 1
            if conn.usable and now - conn.idle_since < self._idle_timeout:
                found = conn
                break
            self._discard(conn)
        if queue is not None and not queue:
            # No empty queues stay behind: eviction takes the oldest identity's queue, and
            # it must hold a connection (many identities, each with its own, hit this).
            del self._by_identity[identity]
        return found

    def pop_oldest(self) -> UpstreamConnection:
        """The least recently used identity's oldest idle connection, no longer kept (there
        must be one)."""
        identity, queue = next(iter(self._by_identity.items()))
        conn = queue.popleft()
        if not queue:
            del self._by_identity[identity]
        self._count -= 1
        return conn
