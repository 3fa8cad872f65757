"""Read-through for ``get_partitions_by_names``: partition by partition.

Engines ask for overlapping sets of partitions (a query's pruned list, the next query's
slightly different one), so these replies are cached one partition at a time, each under
its own version (see :mod:`.keys`), and a reply is assembled from them. What is cached is
served; only the partitions that are not are fetched, with a request naming just those.

The HMS returns these partitions in partition-name order; an assembled reply keeps that
order, so it is the reply the HMS would have sent. If the metastore is ever seen answering in
another order, assembly stops for the life of the process and the calls are cached whole.

A reply that cannot be cut into standalone partitions (Hive 4's ``dictionary`` beside them,
which the partitions' file metadata refers into, or any other shape) is cached whole, as
:mod:`.reads` caches any reply: under the request's own key, served again only for the same
request bytes. The look-up reads that key in the same round trip as the partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from proxy.cache import assembled
from proxy.cache import entry as codec
from proxy.cache import partitions as parts
from proxy.cache.decide import (
    Result,
    Verdict,
    fenced_fields,
    judge,
    judge_partition,
    partition_fingerprint,
)
from proxy.cache.dictionaries import Dictionaries
from proxy.cache.keys import EPOCH, Naming, TableRef, partition_field
from proxy.cache.l1 import L1, Item
from proxy.cache.plan import PartitionPlan, ReadPlan
from proxy.cache.reads import Pending, ReadCall, Served, WholeReads
from proxy.cache.scopes import Scope
from proxy.cache.store import CacheUnavailable, Found, Store
from proxy.memo import BoundedMemo
from proxy.metrics import Metrics, method_label
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.framing import Message

log = logging.getLogger(__name__)

# Requests assembled once, by their arguments' hash (see PartitionReads._keep_whole): an
# int beyond the memo's ITEM_OVERHEAD, ~235 bytes an item in all as tracemalloc measures a
# full memo with turnover (3.7 MiB at ONCE_ENTRIES, under ONCE_BYTES).
ONCE_ENTRIES = 16_384
ONCE_BYTES = 4 << 20
ONCE_ITEM_BYTES = 75

Values = tuple[str, ...]
Known = dict[Values, codec.Payload | None]  # None: the metastore does not have that partition


@dataclass(slots=True)
class PartitionLookup:
    result: Result
    known: Known = field(default_factory=dict)  # the partitions found current, by values
    versions: dict[str, bytes | None] = field(default_factory=dict)  # the table's, as read
    whole: Verdict | None = None  # the request's whole-reply entry, judged (None: bypass)
    expires_at: float = float("inf")  # the soonest expiry of the partitions found current
    absent: bool = False  # one of them is a partition the metastore does not have
    # The mark of the table's scope read before the versions, with the scope (None: not
    # kept in process): what the partitions judged current, or filled under these
    # versions, are stamped with.
    stamp: tuple[int, Scope] | None = None


class AssembledHit(NamedTuple):
    """A reply assembled at once (:meth:`PartitionReads.assembled_now`), counted once it is
    written (:meth:`PartitionReads.count_assembled`)."""

    reply: bytes
    method: str
    table: TableRef
    partitions: int  # how many it holds
    once: int | None  # its request's hash, to remember as assembled once (None: not)


class PartitionReads:
    def __init__(
        self,
        store: Store,
        naming: Naming,
        metrics: Metrics,
        dictionaries: Dictionaries,
        l1: L1 | None,
        *,
        pending: Pending,
        dictionary_ttl: float,
        whole: WholeReads,
    ) -> None:
        self.store = store
        self.whole_reads = whole  # replies kept whole: filled as any other read's
        self.naming = naming
        self.metrics = metrics
        self.dictionaries = dictionaries
        self.l1 = l1
        self.pending = pending
        self.dictionary_ttl = dictionary_ttl
        self.assemble = True  # False once the metastore was seen to answer out of order
        # Requests assembled once: the second time one is, it is kept whole (_keep_whole),
        # so that requests asked once do not crowd the partitions out of the front. Known by
        # the hash of their arguments' bytes, made before anything is judged (see
        # assembled_now): whoever asked (with --cache-scope user too: it says a request is
        # asked again, and each user's whole reply is still its own entry), and a collision
        # only sends a request the planned way, or keeps it whole one call early.
        self.assembled_once: BoundedMemo[int, None] = BoundedMemo(ONCE_ENTRIES, ONCE_BYTES)
        # Requests' arguments but the names, as planned: for assembling unplanned requests.
        self.variants = assembled.Variants(naming)

    async def read(self, plan: ReadPlan, call: ReadCall) -> Served:
        pp = plan.partitions
        assert pp is not None
        look = await self.lookup(plan)
        result, known = look.result, look.known
        self.metrics.cache_lookups.labels(method_label(plan.method), result.value).inc()
        seen = self.whole_reads.hits.seen
        if seen is not None:
            seen.looked_up(pp.table, result is Result.HIT)
        if result is Result.BYPASS:
            return Served(await call.forward(None, None), "upstream")
        if look.whole is not None and look.whole.hit:
            return Served(await call.serve(look.whole.reply), "cache")
        self.metrics.cache_partitions.labels("hit").inc(len(known))
        self.metrics.cache_partitions.labels("miss").inc(len(pp.values) - len(known))
        seqid = call.message.header.seqid
        if result is Result.HIT:
            assembled = self._assembled(plan, seqid, known)
            self._keep_whole(plan, look, assembled, hash(call.message.body))
            return Served(await call.send(assembled), "cache")
        missing = [v for v in pp.values if v not in known]
        versions = await self._fill_versions(pp, look.versions)
        whole = len(missing) == len(pp.values)
        # Should the reply turn out not to cut into partitions, it is kept whole: under the
        # versions read before the call (epochs made now, as for any fill).
        whole_fp = None
        if whole and look.whole is not None and look.whole.result is Result.MISS and versions:
            whole_fp = await self.whole_reads.fill_fingerprint(
                plan, _with_epoch(plan, look.whole, self.naming.versions(pp.tag), versions)
            )
        request = None
        if not whole:
            names = [n for n, v in zip(pp.names, pp.values, strict=True) if v not in known]
            args = parts.with_names(call.message.body, pp.names_path, names)
            request = encode_header(plan.method, MessageType.CALL, seqid) + args
        reply = await call.fetch(request)
        if isinstance(reply, str):  # the client already has its error
            return Served(reply, "upstream")
        got = self._fetched(pp, reply, missing)
        if got is None:
            if whole:
                if whole_fp is not None:  # the metastore's reply to these very bytes
                    await self.whole_reads.fill(plan, whole_fp, reply)
                return Served(await call.send(reply.data), "upstream")
            # Unexpected shape for a subset: let the HMS answer the whole request instead.
            return Served(await call.forward(None, None), "upstream")
        if versions is not None:
            # (Versions made now, an epoch, moved the table's scope: the stamp then says
            # nothing, as it should.)
            await self.fill(plan, versions, missing, got, stamp=look.stamp)
        if whole:
            return Served(await call.send(reply.data), "upstream")
        return Served(await call.send(self._assembled(plan, seqid, {**known, **got})), "upstream")

    def assembled_now(
        self, method: str, args: bytes, who: bytes, seqid: int, largest: int
    ) -> AssembledHit | None:
        """The reply to a request never planned, if it can be assembled at once from
        partitions judged current under their table's scope as it stands (see :mod:`.assembled`),
        to count with :meth:`count_assembled`; ``None``: plan it. ``who``: the user as the
        planner takes it."""
        l1 = self.l1
        if not self.assemble or l1 is None or self.pending.pending:
            return None
        # Asked before: the planned way keeps it whole (_keep_whole), or has. (By a hash of
        # bytes just copied, ~1 us: its entry key, a digest, took ~18 us from cold memory.)
        asked = hash(args)
        if asked in self.assembled_once:
            return None
        if not self.store.in_process():
            return None
        known = self.variants.of(method, args, who)
        if known is None:
            return None
        variant, names = known
        scope = self.store.standing.scopes.held((variant.versions,))
        if scope is None:  # (no partition of the table is judged under anything)
            return None
        mark = scope.mark
        now, wall = time.monotonic(), time.time()
        framing = (encode_header(method, MessageType.REPLY, seqid), *parts.result_framing(method))
        # The items the names had last time, judged and joined in one step (C); the names
        # not remembered yet first found by their keys and remembered...
        found = variant.found
        got = assembled.answer(found, names, mark, now, wall, *framing, largest)
        if isinstance(got, list):
            if self.variants.remember(variant, [names[at] for at in got], l1.peek) is None:
                return None  # (a name not held, or of other columns: plan it)
            got = assembled.answer(found, names, mark, now, wall, *framing, largest)
        count = len(names)
        if not isinstance(got, tuple):
            # ... else found by their keys; if those are not all current, or one is named
            # twice, once more by the keys of the names without repeats (a partition kept
            # again since is another item: the old one is retired, so never judged current).
            items = self.variants.items(variant, names, l1.peek)
            if items is None:
                return None
            got = assembled.answer_items(names, items, mark, now, wall, *framing, largest)
            if got is None:
                names = list(dict.fromkeys(names))  # (a name asked twice: one partition, once)
                items = self.variants.items(variant, names, l1.peek, afresh=True)
                if items is None:
                    return None
                got = assembled.answer_items(names, items, mark, now, wall, *framing, largest)
                if got is None:
                    return None
            count = len(items)
        reply, whole = got
        if reply is None:
            return None
        once = asked if whole else None  # (one absent: never kept whole, see _keep_whole)
        return AssembledHit(reply, method, variant.table, count, once)

    def count_assembled(self, hit: AssembledHit) -> None:
        """Count ``hit`` as :meth:`read` counts an assembled hit, and remember its request as
        assembled once: once its reply is written, so the client has it meanwhile."""
        if hit.once is not None:
            self.assembled_once.put(hit.once, None, ONCE_ITEM_BYTES)
        hits = self.whole_reads.hits
        hits.count(hits.of(method_label(hit.method), Result.HIT.value, hit.table, True))
        self.metrics.cache_partitions.labels("hit").inc(hit.partitions)

    def hit_now(self, plan: ReadPlan, largest: int) -> Item | None:
        """The repeated request's whole reply, if it is a hit that needs no await (as
        :meth:`WholeReads.hit_now`); ``None``: take :meth:`read`."""
        pp = plan.partitions
        assert pp is not None
        if not self.assemble:
            return None
        # Its whole reply, judged so.
        return self.whole_reads.judged_now(plan, largest, pp.table, negative_seen_as_hit=False)

    async def lookup(self, plan: ReadPlan) -> PartitionLookup:
        pp = plan.partitions
        assert pp is not None
        if not self.assemble or (self.pending.pending and not await self.pending.settled()):
            return PartitionLookup(Result.BYPASS)
        key = self.naming.versions(pp.tag)
        # Read before the versions: a partition judged current is so at this mark of its
        # table's scope at least (a change since moves it), which the assembled path reads
        # (.assembled). Judged from the table's hash alone (judge_partition); were the plan
        # to read others, nothing would be stamped, and each request would be judged.
        stamp = self._stamp(key) if len(pp.wanted_fields) == 1 else None
        wanted = pp.wanted_fields
        entry_keys = pp.entry_keys
        l1 = self.l1
        whole_front = l1.get(plan.key) if l1 is not None else None
        known = self.store.local(wanted)  # the versions, if kept in process (see .mirror)
        if whole_front is not None and known is not None:
            # The repeated request, with its versions in process: no partition entries needed.
            whole = await self._judge_whole(plan, known, whole_front, None)
            if whole.hit:
                self.store.used_local_versions()
                return PartitionLookup(whole.result, versions=known[key], whole=whole)
        fronts = l1.items_of(entry_keys) if l1 is not None else {}
        found: Found
        if known is not None and len(fronts) == len(entry_keys):
            # Every partition and every version in process: judged without a round trip (a
            # whole reply in the store would be these partitions' bytes again).
            versions, found = known, {}
            self.store.used_local_versions()
        else:
            try:
                versions, found = await self.store.lookup(
                    wanted,
                    [k for k in entry_keys if k not in fronts]
                    + ([plan.key] if whole_front is None else []),
                )
            except CacheUnavailable:
                return PartitionLookup(Result.BYPASS)
        # A copy: the versions kept in process are the mirror's own dictionaries, which a
        # later look-up may update while this read's fetch is in flight, and a fill must be
        # made under the versions read before it (see WholeReads).
        current = dict(versions[key])
        if fenced_fields(wanted, versions):
            return PartitionLookup(Result.BYPASS)
        # Stamps say "current while the scope stands": only of versions kept in process,
        # whose every change moves it (a hash Redis answered for and the mirror did not
        # learn, a cluster slot without a stream of ours, would not).
        if known is None and self.store.local(wanted) is None:
            stamp = None
        out = PartitionLookup(Result.MISS, versions=current, stamp=stamp)
        out.whole = await self._judge_whole(plan, versions, whole_front, found.get(plan.key))
        if out.whole.hit:
            out.result = out.whole.result
            return out
        if current.get(EPOCH) is None:
            return out
        await self.dictionaries.load(
            pp.tag, {codec.dictionary_id(v) for v in found.values() if v is not None}
        )
        now = time.time()
        for values, ekey, version_field in zip(pp.values, entry_keys, pp.fields, strict=True):
            item = fronts.get(ekey)
            entry = item.entry if item is not None else None
            from_store = entry is None
            if entry is None:
                value = found.get(ekey)
                if value is None:
                    continue
                try:
                    entry = codec.decode(value, self.dictionaries.get(codec.dictionary_id(value)))
                except codec.EntryError:
                    continue
            current_entry, payload = judge_partition(entry, current, version_field, now)
            if not current_entry:
                continue
            if item is not None and stamp is not None:
                item.stamp(*stamp)
            out.known[values] = payload
            out.expires_at = min(out.expires_at, entry.expires_at)
            out.absent = out.absent or payload is None
            if from_store and l1 is not None:
                self._keep(ekey, entry, entry.ttl, stamp)
        if len(out.known) == len(pp.values):
            out.result = Result.HIT
        return out

    def _stamp(self, key: str) -> tuple[int, Scope] | None:
        """What partitions judged from the table's version hash ``key`` now are stamped
        with: its scope's mark, with the scope (``None``: versions not kept in process)."""
        if not self.store.in_process():
            return None
        scope = self.store.standing.scopes.of((key,))
        if self.l1 is not None:
            self.l1.fit()  # (the scope may be new: its bytes count)
        return scope.mark, scope

    def _keep(
        self, key: str, entry: codec.Entry, ttl: float, stamp: tuple[int, Scope] | None
    ) -> None:
        """Keep a partition's entry in process, judged current at ``stamp`` if given."""
        if self.l1 is None:
            return
        if stamp is None:
            self.l1.put(key, entry, ttl)
        else:
            self.l1.put(key, entry, ttl, judged_under=stamp[0], scope=stamp[1])

    def _keep_whole(self, plan: ReadPlan, look: PartitionLookup, reply: bytes, asked: int) -> None:
        """Keep an assembled reply whole in process, so that the same request is next
        served as one entry (see :meth:`hit_now`), not assembled again. Only if every
        partition is one the metastore has: each was current under the table's epoch, its
        ``pgen`` and its own version, which are exactly the plan's refs, so the whole is
        judged current exactly while each of its partitions would be (an absent one
        depends on ``partset`` too, which the refs do not name). Never stored in Redis:
        the partitions are, once each."""
        pp = plan.partitions
        assert pp is not None
        if look.absent:  # (assembled again each time: asked before says nothing of it)
            self.assembled_once.pop(asked)
            return
        if self.l1 is None or not look.known:
            return
        if asked not in self.assembled_once:  # (``asked``: the hash of its arguments' bytes)
            self.assembled_once.put(asked, None, ONCE_ITEM_BYTES)
            return
        key = self.naming.versions(pp.tag)
        if any(r.key != key for r in plan.refs):
            return
        values = [look.versions.get(r.field) for r in plan.refs]  # (never bumped: None)
        ttl = look.expires_at - time.time()
        if look.versions.get(EPOCH) is None or ttl <= 0:
            return
        entry = codec.Entry(codec.fingerprint(values), 0, reply, look.expires_at)
        self.l1.put(plan.key, entry, ttl)

    async def _judge_whole(
        self,
        plan: ReadPlan,
        versions: dict[str, dict[str, bytes | None]],
        front: codec.Entry | None,
        value: bytes | None,
    ) -> Verdict:
        """The request's whole-reply entry (the in-process copy, or the store's), judged as
        :mod:`.reads` judges one."""
        entry = front
        if entry is None and value is not None:
            try:
                entry = codec.decode(value, await self.dictionaries.for_value(value, plan.tag))
            except codec.EntryError:
                entry = None
        verdict = judge(plan.refs, versions, entry, now=time.time(), serve_iceberg=True)
        if verdict.hit and front is None and entry is not None and self.l1 is not None:
            self.l1.put(plan.key, entry, entry.ttl)
        return verdict

    async def _fill_versions(
        self, pp: PartitionPlan, seen: dict[str, bytes | None]
    ) -> dict[str, bytes | None] | None:
        """Versions to fill partitions under: those read before the upstream call, with an
        epoch made if the table had none."""
        if seen.get(EPOCH) is not None:
            return seen
        key = self.naming.versions(pp.tag)
        try:
            epochs = await self.store.ensure_epochs([key])
        except CacheUnavailable:
            return None
        return {**seen, EPOCH: epochs.get(key)}

    async def fill(
        self,
        plan: ReadPlan,
        versions: dict[str, bytes | None],
        asked: Sequence[Values],
        got: dict[Values, bytes],
        *,
        stamp: tuple[int, Scope] | None = None,
    ) -> None:
        """Store what the HMS returned for ``asked``, and remember the rest as absent;
        ``stamp``: the mark of the table's scope read before ``versions`` were (see
        :class:`PartitionLookup`), at which the in-process copies are current."""
        pp = plan.partitions
        assert pp is not None
        if stamp is not None and self.store.local(pp.wanted_fields) is None:
            stamp = None  # (no longer kept in process: see lookup)
        compress = self.store.compress
        sample = next(iter(got.values()), None)
        # The embedded store keeps entries uncompressed: no dictionary to make or keep.
        dictionary = self.dictionaries.of_table(pp.tag, sample) if compress else None
        # The in-process copies carry their expiry like decoded ones: look-ups check it.
        expires = time.time() + plan.ttl
        items = []
        for values in asked:
            present = values in got
            fp = partition_fingerprint(versions, partition_field(values), present=present)
            ekey = self.naming.partition_entry(pp.tag, pp.variant, values)
            if present:
                entry = codec.Entry(fp, 0, got[values], expires)
                value = codec.encode(
                    fp, 0, got[values], plan.ttl, compress=compress, dictionary=dictionary
                )
            else:
                entry = codec.Entry(fp, codec.ABSENT, b"", expires)
                value = codec.encode(fp, codec.ABSENT, b"", plan.ttl, compress=False)
            items.append((ekey, value, plan.ttl))
            self._keep(ekey, entry, plan.ttl, stamp)
        if dictionary is not None:
            dkey = self.naming.dictionary(pp.tag, dictionary[0].hex())
            items.append((dkey, dictionary[1], self.dictionary_ttl))
        try:
            await self.store.save(items, [self.naming.versions(pp.tag)])
        except CacheUnavailable:
            return
        self.metrics.cache_stored_bytes.inc(sum(len(value) for _, value, _ in items))

    def _fetched(
        self, pp: PartitionPlan, reply: Message, missing: list[Values]
    ) -> dict[Values, bytes] | None:
        """The partitions of a reply by their values, if the reply is what was expected."""
        if reply.header.type != MessageType.REPLY:
            return None
        split = parts.split(reply.header.name, reply.body)
        if split is None:
            return None
        wanted = set(missing)
        got: dict[Values, bytes] = {}
        for vals, data in split.partitions:
            if vals not in wanted or vals in got:
                return None  # not a partition we asked for, or twice: do not guess
            got[vals] = data
        # Checked on every reply, a subset's too: an assembled reply is sorted by name.
        name_of = dict(zip(pp.values, pp.names, strict=True))
        order = [name_of[v] for v, _ in split.partitions]
        if order != sorted(order):
            log.warning(
                "the metastore does not return get_partitions_by_names in partition-name "
                "order; partitions are no longer cached one by one"
            )
            self.assemble = False
            if self.l1 is not None:
                self.l1.clear()  # replies assembled in name order, kept whole (_keep_whole)
            return None
        return got

    @staticmethod
    def _assembled(plan: ReadPlan, seqid: int, known: Known) -> bytes:
        """The reply the HMS sends for these partitions: those it has, in name order."""
        pp = plan.partitions
        assert pp is not None
        present = [
            (n, data) for n, v in zip(pp.names, pp.values, strict=True) if (data := known.get(v))
        ]
        return parts.reply(plan.method, seqid, present)


def _with_epoch(
    plan: ReadPlan, miss: Verdict, key: str, versions: dict[str, bytes | None]
) -> Verdict:
    """``miss`` with the table's epoch as just made (if it had none): not made twice."""
    values = [
        versions.get(EPOCH) if value is None and (r.key, r.field) == (key, EPOCH) else value
        for r, value in zip(plan.refs, miss.values, strict=True)
    ]
    return Verdict(miss.result, values=values)
