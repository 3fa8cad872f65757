"""Fast paths on against off: a randomised workload and its comparison.

The workload mixes reads of every kind the scripted metastore serves (tables, table lists,
partitions whole, by name with names missing, repeated, reordered), writes (alter_table,
add_partition, drop_partition), locks, ``set_ugi`` as two users, a method the metastore does
not know, long-lived connections and Trino's connection per call. Requests arrive whole,
split at chosen points, or two coalesced in one read, in the pieces the test chooses
(:class:`FakeConnection`), so the path a call takes is chosen by the workload, not by
timing. :func:`served` runs it once on a new rig; :func:`assert_same` compares a run with
the fast paths on to one with them off (tests/unit/test_fast_paths.py on the embedded
store, tests/integration/test_fast_paths_redis.py on a real Redis)."""

from __future__ import annotations

import asyncio
import random
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy import idl
from proxy.server import ThriftServer
from tests.unit.fake_transport import FakeConnection
from tests.unit.inprocess import Rig, rig
from tests.unit.scripted_hms import partition, table

M = idl.module()
DB = "db"
TABLES = ("t0", "t1", "t2")
MISSING = "gone"
USERS = ("alice", "bob")
DAYS = tuple(f"2026-01-{d:02d}" for d in range(1, 9))

# Metric families whose counts must agree (the rest count connections, sessions and
# upstream sockets, which the two ways hold differently by design, or are times).
COMPARED = (
    "hmsproxy_requests_total",
    "hmsproxy_cache_lookups_total",
    "hmsproxy_cache_partitions_total",
    "hmsproxy_request_duration_seconds_count",
    "hmsproxy_invalidations_total",
    "hmsproxy_client_errors_total",
    "hmsproxy_cache_version_reads_total",
    "hmsproxy_upstream_requests_total",
    "hmsproxy_lock_fences_total",
    "hmsproxy_stale_replies_total",
    "hmsproxy_shared_reads_total",
)


def unknown_call(seqid: int) -> bytes:
    """A call of a method no metastore has, with no arguments."""
    name = b"no_such_method"
    return struct.pack(">Ii", 0x80010001, len(name)) + name + struct.pack(">i", seqid) + b"\0"


@dataclass
class Workload:
    """The calls one seed makes, as (connection, request bytes) in order, and how each
    arrives: ``"whole"``, ``"split"`` (at chosen offsets), or ``"coalesced"`` with the next
    call on the same connection."""

    rng: random.Random
    seqid: int = 0
    version: int = 0
    locks: int = 0  # lock ids the metastore gave (1, 2, ...)
    touched: str | None = None  # the table the last write named
    writes: int = 0
    steps: list[tuple[int, list[bytes], list[int]]] = field(default_factory=list)

    def next_seqid(self) -> int:
        self.seqid += 1
        return self.seqid

    def read(self) -> bytes:
        rng, s = self.rng, self.next_seqid()
        t = rng.choice((*TABLES, MISSING))
        names = [f"ds={d}" for d in rng.sample(DAYS, rng.randint(1, 4))]
        if rng.random() < 0.3:
            names.append("ds=2099-01-01")  # never there
        kind = rng.randrange(9)
        if kind == 0:
            return idl.encode_call("get_table", s, dbname=DB, tbl_name=t)
        if kind == 1:
            req = M.GetTableRequest(dbName=DB, tblName=t)
            return idl.encode_call("get_table_req", s, req=req)
        if kind == 2:
            tables = rng.sample((*TABLES, MISSING), 2)
            return idl.encode_call("get_table_objects_by_name", s, dbname=DB, tbl_names=tables)
        if kind == 3:
            return idl.encode_call("get_all_tables", s, db_name=DB)
        if kind == 4:
            return idl.encode_call(
                "get_partitions_by_names", s, db_name=DB, tbl_name=t, names=names
            )
        if kind == 5:
            req = M.GetPartitionsByNamesRequest(db_name=DB, tbl_name=t, names=names)
            return idl.encode_call("get_partitions_by_names_req", s, req=req)
        if kind == 6:
            return idl.encode_call("get_partitions", s, db_name=DB, tbl_name=t, max_parts=-1)
        if kind == 7:
            day = rng.choice(DAYS)
            return idl.encode_call("get_partition", s, db_name=DB, tbl_name=t, part_vals=[day])
        return idl.encode_call("get_partition_names", s, db_name=DB, tbl_name=t, max_parts=-1)

    def write(self) -> bytes:
        rng, s = self.rng, self.next_seqid()
        t = self.touched = rng.choice(TABLES)
        kind, self.writes = self.writes % 5, self.writes + 1  # (each kind in turn)
        if kind == 0:
            self.version += 1
            new = table(DB, t, v=str(self.version))
            return idl.encode_call("alter_table", s, dbname=DB, tbl_name=t, new_tbl=new)
        if kind == 1:
            new = partition(DB, t, rng.choice(DAYS))
            return idl.encode_call("add_partition", s, new_part=new)
        if kind == 2:
            day = rng.choice(DAYS)
            return idl.encode_call(
                "drop_partition", s, db_name=DB, tbl_name=t, part_vals=[day], deleteData=False
            )
        if kind == 3:
            self.locks += 1
            component = M.LockComponent(type=3, level=2, dbname=DB, tablename=t)
            req = M.LockRequest(component=[component], user="alice", hostname="h")
            return idl.encode_call("lock", s, rqst=req)
        lockid = rng.randint(1, max(1, self.locks))
        return idl.encode_call("unlock", s, rqst=M.UnlockRequest(lockid=lockid))

    def call(self) -> bytes:
        roll = self.rng.random()
        if roll < 0.01:  # (the cache is flushed: the metastore may have changed anything)
            return unknown_call(self.next_seqid())
        if roll < 0.06:  # (only forwarded)
            return idl.encode_call("getStatus", self.next_seqid())
        return self.write() if roll < 0.11 else self.read()


def workload(seed: int, calls: int) -> tuple[list[str | None], list[tuple[int, bytes, str]]]:
    """The users of the long-lived connections 0-2 (``None``: never says who), and the
    calls: (connection, request, how it arrives); connection -1 is one of its own, closed
    after its reply (Trino's way)."""
    rng = random.Random(seed)
    users: list[str | None] = [*USERS, None]  # (two users and one that never says)
    w = Workload(rng)
    out = []
    for n in range(calls):
        conn = rng.choice((-1, -1, 0, 1, 2))
        # (one unknown call at least, halfway: it flushes the cache)
        request = unknown_call(w.next_seqid()) if n == calls // 2 else w.call()
        # A call repeated at once, as engines repeat theirs: what the fast paths are for.
        how = rng.choice(("whole", "whole", "split", "coalesced"))
        touched, w.touched = w.touched, None
        if touched is None:
            out.append((conn, request, how))
        else:
            # A write between reads of its table, the same bytes each time: kept to be
            # answered again before it, they must not be after it.
            reader = rng.choice((-1, 0, 1, 2))
            days = [f"ds={d}" for d in rng.sample(DAYS, 3)]
            reads = [
                idl.encode_call("get_table", w.next_seqid(), dbname=DB, tbl_name=touched),
                idl.encode_call(
                    "get_partitions_by_names",
                    w.next_seqid(),
                    db_name=DB,
                    tbl_name=touched,
                    names=days,
                ),
            ]
            out += [(reader, read, "whole") for read in reads * 2]
            out.append((conn, request, "whole"))
            out += [(reader, read, "whole") for read in reads]
        if rng.random() < 0.5:
            out.append((conn, request, rng.choice(("whole", "split"))))
    return users, out


async def run_workload(r: Rig, server: ThriftServer, seed: int, calls: int) -> list[bytes]:
    """Every reply, in the order the calls were made."""
    framed = r.options.client_transport == "framed"
    rng = random.Random(seed * 7 + 1)  # (where requests are split)
    users, steps = workload(seed, calls)

    def wire(request: bytes) -> bytes:
        return struct.pack(">i", len(request)) + request if framed else request

    port = 40000
    longs: list[FakeConnection] = []
    counts: list[int] = []
    replies: list[bytes] = []
    for user in users:
        port += 1
        conn = FakeConnection(server, port, framed=framed)
        longs.append(conn)
        counts.append(0)
        if user is not None:
            conn.feed(wire(idl.encode_call("set_ugi", 0, user_name=user, group_names=["g"])))
            counts[-1] = 1
            replies += (await conn.replied(1))[-1:]
    i = 0
    while i < len(steps):
        index, request, how = steps[i]
        batch = [request]
        if how == "coalesced" and i + 1 < len(steps) and steps[i + 1][0] == index >= 0:
            batch.append(steps[i + 1][1])
            i += 1
        i += 1
        if index < 0:
            port += 1
            conn, before = FakeConnection(server, port, framed=framed), 0
        else:
            conn, before = longs[index], counts[index]
        data = b"".join(wire(b) for b in batch)
        if how == "split":
            cuts = sorted(rng.sample(range(1, len(data)), min(2, len(data) - 1)))
            pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            for piece in pieces:
                conn.feed(piece)
                for _ in range(rng.randint(0, 3)):  # (some turns of the loop between)
                    await asyncio.sleep(0)
        else:
            conn.feed(data)
        got = await conn.replied(before + len(batch))
        replies += got[before : before + len(batch)]
        if index < 0:
            await conn.end()
        else:
            counts[index] = before + len(batch)
    for conn in longs:
        await conn.end()
    return replies


def metric_counts(r: Rig) -> Counts:
    r.metrics.settle()
    counts: Counts = Counter()
    names = {s.name for f in r.metrics.registry.collect() for s in f.samples}
    unknown = [n for n in COMPARED if n not in names and n != "hmsproxy_client_errors_total"]
    assert not unknown, f"no such metrics: {unknown}"  # (a typo would compare nothing)
    for family in r.metrics.registry.collect():
        for sample in family.samples:
            if sample.name in COMPARED and sample.value:
                counts[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return counts


Counts = Counter[tuple[str, tuple[tuple[str, str], ...]]]


async def served(
    fast_paths: str,
    seed: int,
    calls: int,
    *,
    ready: Callable[[Rig], Awaitable[None]] | None = None,
    **options: Any,
) -> tuple[list[bytes], Counts, Counter[str]]:
    """The replies, the compared metric counts (and the hits answered at once, as
    ``("at once", ())``) and the metastore's calls of one run; ``ready``: waited for
    before the workload starts (a store's connection); ``options``: the rig's."""
    per_user = options.get("cache_scope") == "user"
    async with rig(fast_paths=fast_paths, per_user=per_user, **options) as r:
        r.hms.tell_user = True  # (a reply served to the wrong user differs)
        for t in TABLES:
            r.hms.add_table(DB, t, *DAYS[:5], v="0")
        if ready is not None:
            await ready(r)
        server = ThriftServer(r.options, r.handler, r.metrics)
        try:
            replies = await run_workload(r, server, seed, calls)
        finally:
            await server.stop(0)
        counts = metric_counts(r)
        counts[("at once", ())] = r.sample("hmsproxy_cache_hits_at_once_total")
        return replies, counts, r.hms.calls


def assert_same(
    fast: tuple[list[bytes], Counts, Counter[str]],
    ordinary: tuple[list[bytes], Counts, Counter[str]],
    *,
    at_least_at_once: int = 10,
) -> None:
    """The two runs gave the same bytes for every call, the same metric counts and the same
    calls to the metastore; the fast paths answered at least ``at_least_at_once`` hits and
    the ordinary way none; the workload had hits, misses, writes, locks and an unknown
    method."""
    fast_replies, ordinary_replies = fast[0], ordinary[0]
    assert len(fast_replies) == len(ordinary_replies)
    for n, (a, b) in enumerate(zip(fast_replies, ordinary_replies, strict=True)):
        assert a == b, f"reply {n} differs"
    fast_counts, ordinary_counts = Counter(fast[1]), Counter(ordinary[1])
    fast_at_once = fast_counts.pop(("at once", ()))
    assert fast_at_once >= at_least_at_once and ordinary_counts.pop(("at once", ())) == 0
    differ = {
        k: (fast_counts[k], ordinary_counts[k])
        for k in fast_counts.keys() | ordinary_counts.keys()
        if fast_counts[k] != ordinary_counts[k]
    }
    assert not differ, f"metric counts (fast, ordinary) differ: {differ}"
    assert fast[2] == ordinary[2]  # the same calls reached the metastore
    lookups: Counter[str] = Counter()
    for (name, labels), value in fast_counts.items():
        if name == "hmsproxy_cache_lookups_total":
            lookups[dict(labels)["result"]] += int(value)
    assert lookups["hit"] > 20 and lookups["miss"] > 20, lookups
    assert all(fast[2][m] for m in ("alter_table", "lock", "no_such_method")), fast[2]
