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

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy import catalog, idl
from proxy.cache import locks
from proxy.config import Options
from proxy.guard import answers
from proxy.guard.calls import PARTITION_READS, PartitionRead, partition_read
from proxy.guard.counts import UNKNOWN, Estimate, PartitionCounts
from proxy.guard.limits import NO_LIMIT, Limits, Rule
from proxy.memo import BoundedMemo
from proxy.metrics import Metrics
from proxy.upstream import UpstreamError, UpstreamPool
from proxy.upstream.admission import Lane
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

COUNTS_AT_ONCE = 2  # partition counts at the metastore at once (see _count)
SAY_EVERY = 10.0  # seconds between two log lines of refusals for one reason
SET_UGI_DECODED = 64 * 1024  # set_ugi arguments read for a user name, at most

if TYPE_CHECKING:  # (the handler package imports this module)
    from proxy.handler.session import SessionState

log = logging.getLogger(__name__)


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
        self.limits = Limits(options.limits_file)
        self._counting = asyncio.Semaphore(COUNTS_AT_ONCE)
        self._said = Said()
        self._users: BoundedMemo[bytes, str] = BoundedMemo(4096, 1 << 20)

    def user(self, session: SessionState) -> str | None:
        """The user a client authenticated as, else the one its ``set_ugi`` named."""
        if session.user is not None:
            return session.user
        identity = session.identity
        if identity is None or not identity.args:
            return None
        name = self._users.get(identity.args)
        if name is None:
            name = _set_ugi_user(identity.args)
            self._users.put(identity.args, name, len(identity.args) + len(name))
        return name or None

    def tenant(self, session: SessionState) -> str:
        """Who a call is from, for fair shares and rates: ``user:NAME`` or
        ``address:HOST``."""
        user = self.user(session)
        return "user:" + user if user is not None else "address:" + address_of(session)

    def _ruled(self, session: SessionState) -> tuple[str, Rule]:
        """The caller's tenant and the rule of the limits file it falls under."""
        user, address = self.user(session), address_of(session)
        rule = self.limits.rule(user, address)
        return ("user:" + user if user is not None else "address:" + address), rule

    async def admit(self, session: SessionState, message: Message) -> Admitted:
        """Whether ``message`` may go to the metastore, and how it waits there."""
        name = message.header.name
        limits = self.limits
        limits.look(time.monotonic())
        rule = NO_LIMIT
        if limits.active and _rated(name):
            tenant, rule = self._ruled(session)
            lane = Lane(tenant, group=rule.group)
        else:  # (its tenant named only if it has to wait)
            lane = Lane(who=functools.partial(self.tenant, session))
        if rule.limits and not session.charged:
            # The call first, before it costs the metastore a count: a read charged before
            # the cache was asked (a rule that counts hits) is not charged as a call again.
            reason = limits.take(lane.tenant, rule, 0)
            if reason is not None:
                return self._over_rate(session, message, lane, rule, reason)
        estimate = UNKNOWN
        threshold = min((t for t in (self.max_per_call, self.heavy) if t), default=0)
        if rule.partitions_per_second:
            threshold = min(threshold, 1) if threshold else 1  # (every fetch is costed)
        read = partition_read(message) if threshold and name in PARTITION_READS else None
        if read is not None:
            estimate = await self.counts.estimate(read, below=threshold)
            refused = self._over_per_call(session, message, lane, read, estimate)
            if refused is not None:
                return refused
            if self.heavy and estimate.above(self.heavy):
                lane = lane.heavier()
            if rule.partitions_per_second and estimate.partitions:
                reason = limits.take(lane.tenant, rule, estimate.partitions, calls=0)
                if reason is not None:
                    return self._over_rate(session, message, lane, rule, reason)
        return Admitted(lane, estimate)

    def charge_hit(self, session: SessionState, message: Message) -> Admitted | None:
        """Under a rule that counts hits: charge a read before the cache is asked (it is
        then not charged as a call again if it goes on to the metastore); the refusal if
        the caller's bucket is empty, else ``None``."""
        session.charged = False
        limits = self.limits
        limits.look(time.monotonic())
        if not limits.counts_hits or not _rated(message.header.name):
            return None
        tenant, rule = self._ruled(session)
        if not (rule.limits and rule.count_hits):
            return None
        reason = limits.take(tenant, rule, 0)
        session.charged = reason is None  # (reset when the call is answered)
        if reason is None:
            return None
        return self._over_rate(session, message, Lane(tenant, group=rule.group), rule, reason)

    def refused(self, admitted: Admitted) -> None:
        self.metrics.refused.labels(admitted.reason, admitted.lane.group).inc()

    def _over_rate(
        self, session: SessionState, message: Message, lane: Lane, rule: Rule, reason: str
    ) -> Admitted:
        calls = reason == "calls_rate"
        per_second = rule.calls_per_second if calls else rule.partitions_per_second
        what = "calls" if calls else "partitions"
        text = answers.rate_text(lane.tenant, rule.group, per_second, what)
        self._said.say(
            reason,
            logging.INFO,
            "%s (%s): refused %s: over %g %s/s",
            session.peer,
            lane.tenant,
            message.header.name,
            per_second,
            what,
        )
        reply = answers.refusal(message.header.name, message.header.seqid, text)
        return Admitted(lane, UNKNOWN, reply, reason)

    def _over_per_call(
        self,
        session: SessionState,
        message: Message,
        lane: Lane,
        read: PartitionRead,
        estimate: Estimate,
    ) -> Admitted | None:
        if not (self.max_per_call and estimate.exact and estimate.above(self.max_per_call)):
            return None
        assert estimate.partitions is not None
        text = answers.partition_limit_text(estimate.partitions, read.where, self.max_per_call)
        self._said.say(
            "partitions_per_call",
            logging.WARNING,
            "%s (%s): refused %s of %s: %d partitions, over --max-partitions-per-call %d",
            session.peer,
            lane.tenant,
            message.header.name,
            read.where,
            estimate.partitions,
            self.max_per_call,
        )
        reply = answers.refusal(message.header.name, message.header.seqid, text)
        return Admitted(lane, estimate, reply, "partitions_per_call")

    async def _count(self, db: str, table: str, filter_text: str) -> int | None:
        """The metastore's count of ``db.table``'s partitions ``filter_text`` selects."""
        try:
            # On the connections kept for writes: one COUNT query, asked so that the calls
            # waiting on it are refused or lined up promptly, never behind the reads in line
            # (one at a time per table and filter, kept --partition-count-ttl), and at most
            # COUNTS_AT_ONCE of them, so that they never take the writes' share.
            async with self._counting:
                reply = await self.pool.ask_for_write(
                    None,
                    "get_num_partitions_by_filter",
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


class Said:
    """Refusals in the log, at most one line per reason every SAY_EVERY seconds (a client
    retrying in a loop must not flood it; each is counted in the metrics and, with
    --audit-log, has its line there), with how many were left unsaid before it."""

    def __init__(self) -> None:
        self._next: dict[str, float] = {}
        self._unsaid: dict[str, int] = {}

    def say(self, reason: str, level: int, text: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next.get(reason, 0.0):
            self._unsaid[reason] = self._unsaid.get(reason, 0) + 1
            return
        self._next[reason] = now + SAY_EVERY
        unsaid = self._unsaid.pop(reason, 0)
        if unsaid:
            text += f" (and {unsaid} more refused so since the last line)"
        log.log(level, text, *args)


def address_of(session: SessionState) -> str:
    """The client's host, without its port."""
    return str(session.peer).rsplit(":", 1)[0]


def _rated(method: str) -> bool:
    """Whether a call counts against a rate: a read, not a lock call (see .limits)."""
    spec = catalog.lookup(method)
    return spec is not None and spec.retryable and method not in locks.LOCK_METHODS


def _set_ugi_user(args: bytes) -> str:
    if len(args) > SET_UGI_DECODED:
        return ""  # (kept as no user: a name is a few dozen bytes)
    try:
        user = idl.decode_args("set_ugi", args).user_name
    except ProtocolError:
        return ""
    return user if isinstance(user, str) else ""
