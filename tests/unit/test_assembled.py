"""get_partitions_by_names answered at once, unplanned, from partitions judged current
under their table's scope as it stands (proxy.cache.assembled): the metastore's bytes, and never
once anything a partition depends on changed. In process, against the scripted metastore."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from proxy import catalog, idl
from proxy.cache import assembled
from proxy.cache.keys import MEMO_LONGEST, Bump, TableRef, partition_field
from proxy.cache.store import MemoryStore
from proxy.handler import SessionState
from proxy.handler.session import ClientGone
from proxy.wire.framing import Transport, whole_message
from tests.unit.helpers import DAYS, DB, Asked, T, _flush, _lock, _pending, _untrusted, by_names
from tests.unit.inprocess import Rig, message, rig
from tests.unit.scripted_hms import partition


@pytest.fixture(autouse=True, params=["c", "python"])
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with the C pass that judges and joins remembered partitions, and with its
    Python twin (the fallback where the extension could not be built)."""
    if request.param == "python":
        monkeypatch.setattr(assembled, "answer", assembled.py_answer)
    return str(request.param)


def hms_answer(r: Rig, request: bytes) -> bytes:
    m = message(request)
    args = idl.decode_args("get_partitions_by_names", m.body)
    return r.hms.answer(
        "get_partitions_by_names", m.header.seqid, db_name=DB, tbl_name=T, names=args.names
    )


async def judged(ask: Asked) -> None:
    """Partitions d00-d05 cached, and judged current since."""
    await ask(by_names(1, *DAYS[:6]))
    await ask(by_names(2, *DAYS[:6]))


def test_a_request_never_asked_is_assembled_at_once_with_the_hms_bytes() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:10], v="1")
            ask = Asked(r)
            for first in (0, 5):  # partitions 0-9 cached (and d99, absent), judged since
                request = by_names(1, *DAYS[first : first + 5], "d99")
                await ask(request)
                await ask(request)
            lookups = r.sample("hmsproxy_cache_lookups_total", **_by_names("hit"))
            # New requests: any order, duplicates, absent partitions, another seqid.
            for request in (
                by_names(7, "d03", "d01", "d02"),
                by_names(8, "d09", "d00", "d09", "d04"),
                by_names(2**31 - 1, "d05", "d99", "d06"),
            ):
                reply, way = await ask(request)
                assert way == "assembled"
                assert reply == hms_answer(r, request)
            assert r.hms.calls["get_partitions_by_names"] == 2  # the first two only
            # Counted as the planned way counts an assembled hit.
            assert r.sample("hmsproxy_cache_lookups_total", **_by_names("hit")) == lookups + 3
            assert r.requests("get_partitions_by_names", "ok") == 7
            partitions = r.sample("hmsproxy_cache_partitions_total", result="hit")
            assert partitions >= 10

    asyncio.run(run())


def test_names_too_long_to_remember_are_assembled_all_the_same() -> None:
    """A name longer than the names memo keeps is never remembered with its partition:
    each request finds it by its key (the C pass then says it is still not remembered, and
    the Python way assembles it)."""

    async def run() -> None:
        long = [f"d{i:02d}" + "x" * (MEMO_LONGEST + 10) for i in range(4)]
        async with rig() as r:
            r.hms.add_table(DB, T, *long, v="1")
            ask = Asked(r)
            await ask(by_names(1, *long))
            await ask(by_names(2, *long))  # judged since
            for seqid, request in enumerate([(2, 0), (3, 1, 2), (0, 2)], start=3):
                asked = by_names(seqid, *(long[i] for i in request))
                reply, way = await ask(asked)
                assert way == "assembled"
                assert reply == hms_answer(r, asked)
            assert r.hms.calls["get_partitions_by_names"] == 1

    asyncio.run(run())


def test_an_assembled_hit_is_counted_once_written_and_when_the_client_is_gone() -> None:
    # Counted after its write (so the client has the reply meanwhile): as a hit, with its
    # partitions, and its request remembered as assembled once, whether or not the write
    # found the client there.
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            assert r.cache is not None
            hits = r.sample("hmsproxy_cache_lookups_total", **_by_names("hit"))
            partitions = r.sample("hmsproxy_cache_partitions_total", result="hit")
            once = len(r.cache.partitions.assembled_once)
            written: list[tuple[float, int]] = []

            def write(reply: bytes) -> None:  # what was counted when the reply was written
                counted = r.sample("hmsproxy_cache_lookups_total", **_by_names("hit"))
                written.append((counted, len(r.cache.partitions.assembled_once)))  # type: ignore[union-attr]

            def gone(reply: bytes) -> None:
                raise ConnectionError("reset")

            for seqid, days, out in ((3, ("d01", "d02"), write), (4, ("d03", "d04"), gone)):
                found = whole_message(by_names(seqid, *days), Transport.BUFFERED, 1 << 20)
                assert found is not None
                try:
                    answered = r.handler.serve_hit_now(SessionState("shared"), found, out)
                except ClientGone:
                    answered = out is gone
                assert answered is True
            assert written == [(hits, once)]
            assert r.sample("hmsproxy_cache_lookups_total", **_by_names("hit")) == hits + 2
            assert r.sample("hmsproxy_cache_partitions_total", result="hit") == partitions + 4
            assert len(r.cache.partitions.assembled_once) == once + 2
            assert r.requests("get_partitions_by_names", "client_gone") == 1

    asyncio.run(run())


def _by_names(result: str) -> dict[str, str]:
    return {"method": "get_partitions_by_names", "result": result}


def test_the_second_time_a_request_is_kept_whole_and_then_it_is_one_entry() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            request = by_names(3, "d01", "d02")
            assert (await ask(request))[1] == "assembled"
            assert (await ask(by_names(4, "d01", "d02")))[1] == "ordinary"  # kept whole now
            reply, way = await ask(by_names(5, "d01", "d02"))
            assert way == "at once" and reply == hms_answer(r, by_names(5, "d01", "d02"))

    asyncio.run(run())


async def _alter_one(r: Rig) -> None:  # another proxy's write to one partition, say
    assert r.cache is not None
    r.hms.partitions[(DB, T)]["ds=d02"].parameters["numFiles"] = "2"
    await _write(r, "alter_partition", db_name=DB, tbl_name=T, new_part=partition(DB, T, "d02"))


async def _write(r: Rig, method: str, **args: Any) -> None:
    """The invalidation a write through the proxy makes (the metastore already changed)."""
    assert r.cache is not None
    spec = catalog.lookup(method)
    assert spec is not None
    plan = r.cache.plan_write(spec, message(idl.encode_call(method, 1, **args)))
    assert await r.cache.invalidate(plan, "write")


async def _drop_one(r: Rig) -> None:
    del r.hms.partitions[(DB, T)]["ds=d02"]
    await _write(r, "drop_partition", db_name=DB, tbl_name=T, part_vals=["d02"], deleteData=True)


def _key_of(r: Rig, day: str) -> str:
    """The key of ``day``'s partition's in-process copy."""
    assert r.cache is not None and r.cache.l1 is not None
    tail = partition_field((day,))[2:]
    (key,) = [k for k in r.cache.l1._items if k.endswith(":" + tail)]
    return key


async def _evicted(r: Rig) -> None:
    assert r.cache is not None
    r.cache.l1.pop(_key_of(r, "d02"))


async def _expired(r: Rig) -> None:
    assert r.cache is not None
    for item in r.cache.l1._items.values():
        item.expires_at = time.monotonic()


CHANGES: dict[str, Callable[[Rig], Awaitable[None]]] = {
    "a partition altered": _alter_one,
    "a partition dropped": _drop_one,
    "a lock": functools.partial(_lock, field="partitions"),
    "a flush": _flush,
    "a partition's copy evicted": _evicted,
    "the copies expired": _expired,
    "the versions in process untrusted": _untrusted,
    "an invalidation pending": _pending,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_nothing_is_assembled_at_once_after_a_change_to_what_it_depends_on(change: str) -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            assert (await ask(by_names(3, "d01", "d02")))[1] == "assembled"
            await CHANGES[change](r)
            request = by_names(4, "d02", "d03")
            reply, way = await ask(request)
            assert way != "assembled"
            assert reply == hms_answer(r, request)

    asyncio.run(run())


def test_what_the_planner_would_not_plan_per_partition_is_not_assembled() -> None:
    from proxy.cache import partitions as parts
    from proxy.wire.binary import MessageType, TType, encode_header

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            cases = {
                # Both parse to d01's values (the planner keys partitions by values): the
                # HMS, partitioned by ds, returns d01 once.
                "two spellings of one partition": ["ds=d01", "dt=d01"],
                "a name not escaped as Hive escapes it": ["ds=%64%30%31", "ds=d02"],
                "a name that does not parse": ["ds=d01", "DS=d02"],
                "a partition never planned": ["ds=d01", "ds=d07"],
                "no names": [],
            }
            for what, names in cases.items():
                request = by_names(3, names=names)
                reply, way = await ask(request)
                assert way != "assembled", what
                assert reply == hms_answer(r, request), what
            # Names the decoders would not read as text: not UTF-8, or not strings at all.
            body = message(by_names(4, "d01", "d02")).body
            _, value, end = parts.locate(body, (3,)) or (0, 0, 0)
            first = value + 1 + 4 + 4  # (element type, count, the first name's length)
            not_utf8 = body[:first] + b"\xff" + body[first + 1 :]
            as_i32s = body[:value] + bytes([TType.I32]) + struct.pack(">iii", 2, 1, 2) + body[end:]
            for what, args in (("not UTF-8", not_utf8), ("not strings", as_i32s)):
                request = encode_header("get_partitions_by_names", MessageType.CALL, 4) + args
                found = whole_message(request, Transport.BUFFERED, 1 << 20)
                assert found is not None
                written: list[bytes] = []
                assert r.handler.serve_hit_now(ask.session, found, written.append) is None, what

    asyncio.run(run())


@pytest.mark.parametrize("clock", ["monotonic", "wall"])
def test_one_expired_partition_among_current_ones_is_not_assembled(clock: str) -> None:
    # Its in-process copy's time (monotonic), or the store's entry's (Unix time), is up.
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            assert (await ask(by_names(3, "d01", "d02", "d03")))[1] == "assembled"
            assert r.cache is not None and r.cache.l1 is not None
            item = r.cache.l1._items[_key_of(r, "d02")]
            if clock == "monotonic":
                item.expires_at = time.monotonic()
            else:
                item.entry = dataclasses.replace(item.entry, expires_at=time.time())
            request = by_names(4, "d01", "d02", "d04")
            reply, way = await ask(request)
            assert way != "assembled"
            assert reply == hms_answer(r, request)

    asyncio.run(run())


def test_a_request_of_partitions_not_in_process_is_planned_then_assembled_once_they_are() -> None:
    # The assembled way stops at the first name new to it whose partition is not in
    # process: the planner answers (what that costs is bench.cache's "names new" case).
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS, v="1")
            ask = Asked(r)
            await judged(ask)
            request = by_names(3, *DAYS[10:20])
            reply, way = await ask(request)
            assert way == "ordinary" and reply == hms_answer(r, request)
            # The first six remembered and current, d20-d29 new: planned.
            request = by_names(4, *DAYS[:6], *DAYS[20:30])
            reply, way = await ask(request)
            assert way == "ordinary" and reply == hms_answer(r, request)
            # d10-d19 were filled (current since), d20-d29 too: now all assembled.
            request = by_names(5, *DAYS[10:30])
            reply, way = await ask(request)
            assert way == "assembled" and reply == hms_answer(r, request)

    asyncio.run(run())


def test_another_users_request_is_not_assembled_from_a_per_user_cache() -> None:
    async def run() -> None:
        async with rig(per_user=True) as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            alice = Asked(r, SessionState("a", user="alice"))
            await alice(by_names(1, *DAYS[:6]))
            await alice(by_names(2, *DAYS[:6]))
            assert (await alice(by_names(3, "d01", "d02")))[1] == "assembled"
            bob = Asked(r, SessionState("b", user="bob"))
            _, way = await bob(by_names(4, "d01", "d03"))
            assert way == "ordinary" and r.hms.calls["get_partitions_by_names"] == 2

    asyncio.run(run())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replies_assembled_at_once_are_the_hms_replies_whatever_the_writes(seed: int) -> None:
    # Random requests over a table's partitions, with partitions altered, added and dropped
    # between them (through the proxy's invalidation, as a write through it makes): every
    # reply, whichever way it took, is what the metastore answers at that moment.
    rng = random.Random(seed)

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:20], v="1")
            ask = Asked(r)
            ways: dict[str, int] = {}
            for step in range(400):
                if rng.random() < 0.08:
                    await _random_write(r, rng)
                days = rng.sample(DAYS, rng.randint(1, 8))
                request = by_names(step, *days)
                reply, way = await ask(request)
                ways[way] = ways.get(way, 0) + 1
                assert reply == hms_answer(r, request), (step, way, days)
            assert ways.get("assembled", 0) > 50, ways  # the path was taken, often

    asyncio.run(run())


async def _random_write(r: Rig, rng: random.Random) -> None:
    have = r.hms.partitions[(DB, T)]
    day = rng.choice(DAYS)
    name = f"ds={day}"
    if name in have and rng.random() < 0.3:
        del have[name]
        await _write(r, "drop_partition", db_name=DB, tbl_name=T, part_vals=[day], deleteData=True)
    elif name in have:
        have[name].parameters["numFiles"] = str(rng.randint(2, 99))
        await _write(r, "alter_partition", db_name=DB, tbl_name=T, new_part=have[name])
    else:
        have[name] = partition(DB, T, day)
        await _write(r, "add_partition", new_part=have[name])


class HeldStore(MemoryStore):
    """The embedded store, whose look-ups can be held after reading (a shared store's
    reply on its way while the stream delivers a change)."""

    def __init__(self) -> None:
        super().__init__(1 << 24)
        self.gate: asyncio.Event | None = None
        self.read = asyncio.Event()

    async def lookup(self, versions: Any, entries: Any, *, fresh: bool = False) -> Any:
        found = await super().lookup(versions, entries, fresh=fresh)
        if self.gate is not None:
            self.read.set()
            await self.gate.wait()
        return found


def test_a_partition_judged_on_versions_read_before_a_change_is_not_assembled_after_it() -> None:
    # Its stamp is its table's mark read before its versions: the change, heard while the
    # look-up was on its way, has moved it (stamped after, the old bytes would be served).
    async def run() -> None:
        store = HeldStore()
        async with rig(store=store) as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            await _evicted(r)  # d02's copy: the next look-up of it reads the store
            store.gate = asyncio.Event()
            held = asyncio.ensure_future(ask(by_names(3, "d01", "d02")))
            await asyncio.wait_for(store.read.wait(), 10)
            # Another proxy's write: its bump reaches this one's versions, not its copies.
            r.hms.partitions[(DB, T)]["ds=d01"].parameters["numFiles"] = "7"
            assert r.cache is not None
            key = r.cache.naming.versions(TableRef.of(DB, T).tag)
            await store.bump([Bump(key, partition_field(("d01",)), "partitions")])
            store.gate.set()
            await held  # (answered with what it read: it was asked before the write ended)
            store.gate = None
            request = by_names(4, "d01")  # (only partitions that look-up judged)
            reply, way = await ask(request)
            assert way != "assembled"
            assert reply == hms_answer(r, request)

    asyncio.run(run())


def test_partitions_just_fetched_are_assembled_at_once_for_the_next_request() -> None:
    # A fill is current at the table's mark read before its versions (the same rule as
    # a fill's fingerprint): the next request of those partitions needs no judging first.
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:12], v="1")
            ask = Asked(r)
            await ask(by_names(1, "d00"))  # the table's versions made (its epoch)
            await ask(by_names(2, "d10", "d11", "d04"))  # fetched and filled
            request = by_names(3, "d11", "d04")
            reply, way = await ask(request)
            assert way == "assembled" and reply == hms_answer(r, request)
            assert r.hms.calls["get_partitions_by_names"] == 2

    asyncio.run(run())


class Unlearned(MemoryStore):
    """The embedded store, as a shared store is for a hash its copy in process does not
    follow (the mirror refused to learn it: a cluster slot no stream of ours hears): every
    look-up a round trip, and another proxy's write moving no scope here."""

    def __init__(self) -> None:
        super().__init__(1 << 24)

    def local(self, versions: Any) -> Any:
        return None

    def others_write(self, key: str, field: str) -> None:
        fields = self._versions[key]
        fields[field] = str(int(fields.get(field) or 0) + 1).encode()


def test_partitions_judged_on_versions_not_kept_in_process_are_not_assembled() -> None:
    # A stamp says "current while the scope stands": only true of versions whose every
    # change moves the scope, those kept in process.
    async def run() -> None:
        store = Unlearned()
        async with rig(store=store) as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)  # (on versions read from the store)
            assert r.cache is not None
            r.hms.partitions[(DB, T)]["ds=d01"].parameters["numFiles"] = "7"
            store.others_write(r.cache.naming.versions(TableRef.of(DB, T).tag), "p:x")
            store.others_write(
                r.cache.naming.versions(TableRef.of(DB, T).tag), partition_field(("d01",))
            )
            request = by_names(3, "d01", "d02")
            reply, way = await ask(request)
            assert way != "assembled" and reply == hms_answer(r, request)

    asyncio.run(run())


def test_a_names_field_that_is_not_one_list_is_not_read_as_the_names() -> None:
    # The decoders (thriftpy2, the HMS's Java) skip a field of another type than the IDL's
    # and keep the last of a field sent twice: the planned way decides such requests.
    from proxy.cache import partitions as parts
    from proxy.wire.binary import MessageType, encode_header

    base = message(by_names(1, *DAYS[:6])).body
    six = [f"ds={d}" for d in DAYS[:6]]

    def twice(first: list[str], second: list[str]) -> bytes:
        one = parts.with_names(base, (3,), first)
        other = parts.with_names(base, (3,), second)
        _, _, end = parts.locate(one, (3,)) or (0, 0, 0)
        start2, _, end2 = parts.locate(other, (3,)) or (0, 0, 0)
        return one[:end] + other[start2:end2] + one[end:]

    def call(seqid: int, args: bytes) -> bytes:
        return encode_header("get_partitions_by_names", MessageType.CALL, seqid) + args

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            for seqid in (1, 2):  # planned: the variant of [d00][six], its six judged
                await ask(call(seqid, twice(["ds=d00"], six)))
            start, _, _ = parts.locate(base, (3,)) or (0, 0, 0)
            as_a_set = base[:start] + bytes([14]) + base[start + 1 :]
            for args in (twice(["ds=d01"], six), as_a_set):
                reply, way = await ask(call(7, args))
                assert way != "assembled"
                names = idl.decode_args("get_partitions_by_names", args).names
                expected = r.hms.answer(
                    "get_partitions_by_names", 7, db_name=DB, tbl_name=T, names=names
                )
                assert reply == expected

    asyncio.run(run())


def test_the_request_form_is_assembled_and_its_names_field_checked_inside() -> None:
    # get_partitions_by_names_req (Hive 3/4 engines): the names sit inside the request
    # struct; sent twice there, the planned way decides.
    from proxy.cache import partitions as parts
    from proxy.wire.binary import MessageType, encode_header
    from proxy.wire.fields import encode_string_list_field

    method, path = "get_partitions_by_names_req", (1, 3)

    def req(seqid: int, *days: str) -> bytes:
        ask = idl.module().GetPartitionsByNamesRequest(
            db_name=DB, tbl_name=T, names=[f"ds={d}" for d in days]
        )
        return idl.encode_call(method, seqid, req=ask)

    def expected(r: Rig, request: bytes) -> bytes:
        m = message(request)
        return r.hms.answer(method, m.header.seqid, req=idl.decode_args(method, m.body).req)

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:8], v="1")
            ask = Asked(r)
            for seqid in (1, 2):  # planned, judged
                await ask(req(seqid, *DAYS[:8]))
            for request in (req(5, "d06", "d01", "d03"), req(6, "d07", "d00", "d07")):
                reply, way = await ask(request)
                assert way == "assembled"
                assert reply == expected(r, request)
            body = message(req(7, "d02")).body
            found = parts.locate(body, path)
            assert found is not None
            again = encode_string_list_field(3, ["ds=d04"])  # (the decoders keep this one)
            twice = body[: found[2]] + again + body[found[2] :]
            twice = encode_header(method, MessageType.CALL, 7) + twice
            assert idl.decode_args(method, message(twice).body).req.names == ["ds=d04"]
            reply, way = await ask(twice)
            assert way != "assembled"
            assert reply == expected(r, twice)

    asyncio.run(run())


def test_a_request_asked_again_goes_the_planned_way_before_anything_is_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Known as asked before by the hash of its arguments, made first: not judged and joined
    # only to be let go (its entry key, a digest made after the join, was how it was known).
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            joined = 0
            original = assembled.answer  # (C or its twin, as the fixture set it)

            def counted(*args: Any) -> Any:
                nonlocal joined
                joined += 1
                return original(*args)

            monkeypatch.setattr(assembled, "answer", counted)
            ways = []
            for seqid in (3, 4, 5):
                request = by_names(seqid, "d01", "d02")
                reply, way = await ask(request)
                assert reply == hms_answer(r, request)
                ways.append(way)
            # Assembled, then the planned way keeps it whole, then that whole answers it.
            assert ways == ["assembled", "ordinary", "at once"]
            assert joined == 1
            assert r.hms.calls["get_partitions_by_names"] == 1  # judged's miss only

    asyncio.run(run())


def test_a_request_assembled_whole_then_naming_a_dropped_partition_is_assembled_again() -> None:
    # Remembered as asked once it was assembled whole; once it names a partition the
    # metastore no longer has, the planned way never keeps it whole and forgets it was
    # asked, so it is assembled each time again (as one named so from the start is).
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            ways = []
            for seqid in range(3, 8):
                if seqid == 4:
                    await _drop_one(r)  # d02
                request = by_names(seqid, "d01", "d02")
                reply, way = await ask(request)
                assert reply == hms_answer(r, request)
                ways.append(way)
            # (4: d02 fetched again, found gone; 5: judged, absent: forgotten as asked.)
            assert ways == ["assembled", "ordinary", "ordinary", "assembled", "assembled"]

    asyncio.run(run())


def test_the_same_request_of_another_user_is_never_answered_from_the_first_users() -> None:
    # Asked before is told by the request's bytes whoever asks: Bob's first ask of what
    # Alice had assembled goes the planned way, to his own entries (the metastore asked
    # again), and is then kept whole for him; every reply is the metastore's to him.
    async def run() -> None:
        async with rig(per_user=True) as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            alice = Asked(r, SessionState("a", user="alice"))
            await judged(alice)
            assert (await alice(by_names(3, "d01", "d02")))[1] == "assembled"
            calls = r.hms.calls["get_partitions_by_names"]
            bob = Asked(r, SessionState("b", user="bob"))
            ways = []
            for seqid in range(4, 8):
                request = by_names(seqid, "d01", "d02")
                reply, way = await bob(request)
                assert reply == hms_answer(r, request)
                ways.append(way)
            assert ways[0] == "ordinary" and "assembled" not in ways and ways[-1] == "at once"
            assert r.hms.calls["get_partitions_by_names"] == calls + 1  # bob's own miss

    asyncio.run(run())


def test_a_request_with_an_absent_partition_is_assembled_every_time() -> None:
    # The planned way never keeps it whole (whether one is added later depends on a version
    # its refs do not name): the unplanned way answers it each time, and remembers nothing.
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await ask(by_names(1, *DAYS[:6], "d99"))
            await ask(by_names(2, *DAYS[:6], "d99"))
            assert r.cache is not None
            once = len(r.cache.partitions.assembled_once)
            for seqid in range(10, 14):
                request = by_names(seqid, "d01", "d99")
                reply, way = await ask(request)
                assert way == "assembled" and reply == hms_answer(r, request)
            assert len(r.cache.partitions.assembled_once) == once

    asyncio.run(run())


def test_a_partition_kept_anew_is_assembled_with_its_new_bytes_not_the_item_remembered() -> None:
    # Its name is remembered with the item it had (assembled.Variant.found); once the
    # partition changes and is fetched again, that item is retired, never judged current:
    # the next request finds the new one by its key, and remembers that.
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            assert (await ask(by_names(3, "d01", "d02")))[1] == "assembled"
            assert r.cache is not None and r.cache.l1 is not None
            old = r.cache.l1.peek(_key_of(r, "d02"))  # (alive: a weak reference still works)
            await _alter_one(r)
            # d00-d03 judged anew (d02 fetched again: another item).
            assert (await ask(by_names(4, "d00", "d01", "d02", "d03")))[1] == "ordinary"
            new = r.cache.l1.peek(_key_of(r, "d02"))
            assert old is not None and new is not None and new is not old
            for seqid, days in ((6, ("d02", "d01")), (7, ("d03", "d02", "d01"))):
                request = by_names(seqid, *days)
                reply, way = await ask(request)
                assert way == "assembled" and reply == hms_answer(r, request)
                assert b"numFiles\x00\x00\x00\x012" in reply  # (d02's, altered: the only 2)
            variant = next(iter(r.cache.partitions.variants.memo.values()))
            assert variant.found[b"ds=d02"]() is new

    asyncio.run(run())


def test_a_name_asked_twice_is_one_partition_as_the_metastore_answers() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)
            # (The second time, its names are remembered.)
            for seqid, days in ((3, ("d01", "d04", "d01")), (4, ("d04", "d01", "d04", "d01"))):
                request = by_names(seqid, *days)
                reply, way = await ask(request)
                assert way == "assembled" and reply == hms_answer(r, request)
                assert reply.count(b"ds=d01") == reply.count(b"ds=d04") == 1

    asyncio.run(run())


@pytest.mark.parametrize("first", ["the other columns' name", "the table's own"])
def test_a_name_of_other_columns_is_never_answered_with_the_tables_partition(first: str) -> None:
    # The metastore matches a name whole: ``zz=d01`` names no partition of a table
    # partitioned by ``ds``, though its values are ``ds=d01``'s. Neither way answers one
    # for the other, and neither's answer is kept for the other (the empty answer to
    # ``zz=d01`` once stood for ds=d01 being absent, in every later request of it).
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:6], v="1")
            ask = Asked(r)
            await judged(ask)  # ds=d00-d05 cached and current: the assembled way is open
            wrong, right = ["zz=d01"], ["ds=d01"]
            order = [wrong, right] if first == "the other columns' name" else [right, wrong]
            # Then names of both sets, of one partition's values and of two partitions'.
            mixed = [["ds=d01", "zz=d01"], ["ds=d01", "zz=d02"], ["zz=d02", "ds=d01"]]
            for seqid, names in enumerate([*order, *order, *order, *mixed, *mixed]):
                request = by_names(10 + seqid, names=names)
                reply, _ = await ask(request)
                assert reply == hms_answer(r, request), (seqid, names)
            assert b"ds=d01" not in hms_answer(r, by_names(1, names=wrong))  # (the premise)

    asyncio.run(run())
