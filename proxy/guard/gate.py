"""The one decision before a client's call goes to the metastore: refused, or sent, as
which tenant and through which lane.

Every call the proxy sends on for a client passes here (:meth:`.Forwarder.call`); hits
from the cache never do. A call for partition objects is costed first (:mod:`.counts`):

* over ``--max-partitions-per-call`` (counted exactly: by name, a whole table, a filter the
  metastore counted) it is refused with the HMS's own MetaException, as the HMS refuses
  calls over ``hive.metastore.limit.partition.request``; a call whose count is only a bound
  (an expression, partial values) is never refused by it;
* over ``--heavy-partitions`` (or possibly over: a bound) it is heavy, and waits in the
  heavy line (:mod:`proxy.upstream.admission`).

Its tenant, for fair shares, is the user it authenticated as, else the user its
``set_ugi`` named, else its address.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from proxy import idl
from proxy.config import Options
from proxy.guard import answers
from proxy.guard.calls import PARTITION_READS, partition_read
from proxy.guard.counts import UNKNOWN, Estimate, PartitionCounts
from proxy.handler.session import SessionState
from proxy.memo import BoundedMemo
from proxy.metrics import Metrics
from proxy.upstream import UpstreamError, UpstreamPool
from proxy.upstream.admission import Lane
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# The proxy's own questions (partition counts) wait their turn as this tenant.
PROXY_LANE = Lane("proxy:counts")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call let through (``refusal`` is ``None``) in ``lane``, or refused: ``refusal`` is
    its reply, ``reason`` the metrics label. ``estimate``: its partitions, if costed."""

    lane: Lane
    estimate: Estimate = UNKNOWN
    refusal: bytes | None = None
    reason: str = ""


class Gate:
    def __init__(self, options: Options, pool: UpstreamPool, metrics: Metrics) -> None:
        self.pool = pool
        self.metrics = metrics
        self.max_per_call = options.max_partitions_per_call
        self.heavy = options.heavy_partitions if options.heavy_max_concurrent else 0
        self.counts = PartitionCounts(self._count, options.partition_count_ttl)
        self._users: BoundedMemo[bytes, str] = BoundedMemo(4096, 1 << 20)

    def tenant(self, session: SessionState) -> str:
        """Who a call is from, for fair shares: ``user:NAME`` or ``address:HOST``."""
        if session.user is not None:
            return "user:" + session.user
        identity = session.identity
        if identity is not None and identity.args:
            name = self._users.get(identity.args)
            if name is None:
                name = _set_ugi_user(identity.args)
                self._users.put(identity.args, name, len(identity.args) + len(name))
            if name:
                return "user:" + name
        host = str(session.peer).rsplit(":", 1)[0]
        return "address:" + host

    def lane(self, session: SessionState) -> Lane:
        """The caller's lane, its tenant named only if it has to wait."""
        return Lane(who=functools.partial(self.tenant, session))

    async def admit(self, session: SessionState, message: Message) -> Admitted:
        """Whether ``message`` may go to the metastore, and how it waits there."""
        lane = self.lane(session)
        name = message.header.name
        threshold = min((t for t in (self.max_per_call, self.heavy) if t), default=0)
        if not threshold or name not in PARTITION_READS:
            return Admitted(lane)
        read = partition_read(message)
        if read is None:
            return Admitted(lane)
        estimate = await self.counts.estimate(read, below=threshold)
        if self.max_per_call and estimate.exact and estimate.above(self.max_per_call):
            assert estimate.partitions is not None
            text = answers.partition_limit_text(estimate.partitions, read.where, self.max_per_call)
            log.warning(
                "%s (%s): refused %s of %s: %d partitions, over --max-partitions-per-call %d",
                session.peer,
                lane.tenant,
                name,
                read.where,
                estimate.partitions,
                self.max_per_call,
            )
            reply = answers.refusal(name, message.header.seqid, text)
            return Admitted(lane, estimate, reply, "partitions_per_call")
        if self.heavy and estimate.above(self.heavy):
            lane = lane.heavier()
        return Admitted(lane, estimate)

    def refused(self, admitted: Admitted) -> None:
        self.metrics.refused.labels(admitted.reason, admitted.lane.group).inc()

    async def _count(self, db: str, table: str, filter_text: str) -> int | None:
        """The metastore's count of ``db.table``'s partitions ``filter_text`` selects."""
        try:
            reply = await self.pool.ask(
                None,
                "get_num_partitions_by_filter",
                None,
                lane=PROXY_LANE,
                db_name=db,
                tbl_name=table,
                filter=filter_text,
            )
            count = None
            if reply.header.type == MessageType.REPLY:
                count = idl.decode_result("get_num_partitions_by_filter", reply.body).success
        except (UpstreamError, ProtocolError) as exc:
            log.info("no partition count for %s.%s from the metastore: %s", db, table, exc)
            count = None
        ok = isinstance(count, int)
        self.metrics.partition_counts.labels("ok" if ok else "failed").inc()
        return count if ok else None


def _set_ugi_user(args: bytes) -> str:
    try:
        user = idl.decode(idl.args_class("set_ugi"), args).user_name
    except ProtocolError:
        return ""
    return user if isinstance(user, str) else ""
