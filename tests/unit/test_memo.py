"""Everything a client's bytes can fill is bounded in bytes, not only in entries."""

from __future__ import annotations

import asyncio
import gc
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import generate_latest

from proxy import catalog, idl
from proxy.cache import keys, resp
from proxy.cache.entry import Entry
from proxy.cache.l1 import L1
from proxy.cache.scopes import SCOPE_BYTES, Scopes
from proxy.cache.store import MemoryStore
from proxy.handler import SessionState
from proxy.handler.known_calls import KNOWN_CALL_BYTES, KNOWN_CALL_LARGEST, KnownCalls
from proxy.memo import ITEM_OVERHEAD, BoundedMemo
from proxy.upstream import Identity, UpstreamPool
from proxy.upstream.pool import MAX_POOLED_IDENTITY, UGI_REPLY_BYTES
from proxy.wire.binary import MessageType, encode_header, parse_header
from proxy.wire.framing import Message
from tests.unit.helpers import engine

MiB = 1 << 20


def message(method: str, body: bytes) -> Message:
    data = encode_header(method, MessageType.CALL, 1) + body
    header = parse_header(data, 0, len(data))
    assert header is not None
    return Message(header, data)


def padded_get_table(i: int, pad: int) -> bytes:
    body = idl.encode(idl.args_class("get_table")(dbname="db", tbl_name=f"t{i}"))
    return body[:-1] + struct.pack(">bhi", 11, 99, pad) + b"x" * pad + body[-1:]


def test_a_bounded_memo_keeps_its_budget_and_refuses_what_would_crowd_it_out() -> None:
    memo: BoundedMemo[int, bytes] = BoundedMemo(max_entries=1000, max_bytes=64 * 1024)
    for i in range(10_000):
        memo.put(i, b"x" * 500, 500)
        assert memo.bytes <= 64 * 1024
    assert len(memo) == 64 * 1024 // (500 + ITEM_OVERHEAD)
    assert memo.get(9_999) is not None and memo.get(0) is None  # least recent went first
    assert not memo.put(-1, b"", 64 * 1024 // 16 + 1)  # too big for it: not kept
    small: BoundedMemo[int, bytes] = BoundedMemo(max_entries=1000, max_bytes=1 << 30)
    for i in range(5_000):
        small.put(i, b"", 0)
    assert len(small) == 1000  # and at most this many, however small


def planned(e: Any, known: KnownCalls, method: str, body: bytes) -> Any:
    """The plan of a call, kept as the request path keeps it."""
    spec = catalog.lookup(method)
    assert spec is not None
    request = message(method, body)
    return known.plan(SessionState("s"), request, lambda: e.plan(spec, request, None))


def test_plans_of_distinct_padded_requests_stay_within_the_known_calls_budget() -> None:
    e, known = engine(), KnownCalls(per_user=False)
    for i in range(3_000):
        plan = planned(e, known, "get_table", padded_get_table(i, 100_000))
        assert plan is not None  # planned as usual: the padding is skipped
    # 3,000 x 100 KB went by; the table keeps a digest and the plan of each, not the bytes.
    assert known.footprint()[0] == 3_000
    assert known.bytes < 3_000 * 1_500
    assert known.bytes <= KNOWN_CALL_BYTES


def test_requests_that_fail_to_decode_are_not_kept() -> None:
    e, known = engine(), KnownCalls(per_user=False)
    for i in range(1_000):  # a string whose length runs past the end of the request
        bad = struct.pack(">bhi", 11, 1, 1_000 + i) + b"short\x00"
        assert planned(e, known, "get_table", bad) is None
    assert known.footprint() == (0, 0)


def test_one_call_never_takes_more_than_its_share_of_the_known_calls() -> None:
    e, known = engine(), KnownCalls(per_user=False)
    for i in range(100):
        assert planned(e, known, "get_table", padded_get_table(i, 10)) is not None
    names = [f"ds=2024-01-01/hour={j:05d}" for j in range(20_000)]
    body = idl.encode(
        idl.args_class("get_partitions_by_names")(db_name="db", tbl_name="t", names=names)
    )
    plan = planned(e, known, "get_partitions_by_names", body)
    assert plan is not None and plan.approx_size() > KNOWN_CALL_LARGEST  # planned, not kept
    assert known.footprint()[0] == 100 and known.bytes < KNOWN_CALL_LARGEST


def test_many_plans_of_many_partitions_stop_at_the_budget() -> None:
    e, known = engine(), KnownCalls(per_user=False)
    for i in range(2_000):
        names = [f"ds={i}-{j}-{'x' * 20}" for j in range(100)]
        body = idl.encode(
            idl.args_class("get_partitions_by_names")(db_name="db", tbl_name="t", names=names)
        )
        planned(e, known, "get_partitions_by_names", body)
    assert known.bytes <= KNOWN_CALL_BYTES
    assert known.footprint()[0] < 2_000


def test_the_embedded_cache_counts_keys_as_well_as_values() -> None:
    async def run() -> None:
        store = MemoryStore(max_bytes=4 * MiB)
        for i in range(100_000):  # tiny values (partitions remembered as absent) by long keys
            await store.save([(f"hmsc:1:{{t:abcdef}}:p:{i:090d}", b"x" * 22, 60)], [])
        assert store.stored_bytes <= 4 * MiB
        assert store.entry_count < 4 * MiB // 300

    asyncio.run(run())


def test_encoded_redis_commands_are_bounded() -> None:
    resp._ENCODED.clear()
    for i in range(5_000):
        resp.encode(("MGET", *(f"hmsc:1:{{t:x}}:p:{i}:{j:040d}" for j in range(30))))
    assert resp._ENCODED.bytes <= resp._ENCODED.max_bytes
    long = ("MGET", *(f"key-{j:060d}" for j in range(1_000)))  # 70 KB: not kept
    resp.encode(long)
    assert long not in resp._ENCODED


def test_set_ugi_replies_are_bounded_and_huge_identities_not_kept() -> None:
    from proxy.config import load
    from proxy.metrics import Metrics

    async def run() -> None:
        pool = UpstreamPool(load({"upstream": "thrift://h:1"}, {}), Metrics())
        reply = message("set_ugi", b"\x00")
        for i in range(5_000):
            pool.remember_ugi_reply(Identity(b"u" * 8_000 + str(i).encode()), reply)
        assert pool._ugi_replies.bytes <= UGI_REPLY_BYTES
        huge = Identity(b"g" * (MAX_POOLED_IDENTITY + 1))
        pool.remember_ugi_reply(huge, reply)
        assert pool.ugi_reply(huge) is None

    asyncio.run(run())


def test_invalidations_pending_through_a_long_outage_stay_bounded() -> None:
    from proxy.cache.engine import MAX_PENDING, Result
    from tests.unit.helpers import GET_TABLE, TABLE, FlakyStore, fill, write_plan
    from tests.unit.helpers import engine as make

    async def run() -> None:
        store = FlakyStore()
        e = make(store)
        await fill(e, TABLE)
        store.down = True
        m = idl.module()
        for i in range(3 * MAX_PENDING):  # a write to a different table each time
            plan = write_plan("alter_table", dbname="db", tbl_name=f"t{i}", new_tbl=m.Table())
            await e.invalidate(plan, "write")
        assert len(e.invalidations.pending) <= MAX_PENDING
        store.down = False
        assert (await e.lookup(GET_TABLE)).result is Result.MISS  # flushed, then looked up
        assert not e.invalidations.pending

    asyncio.run(run())


def test_partition_name_memos_keep_only_short_names() -> None:
    # A client chooses partition and table names: long ones are worked out each time, so the
    # memos' size is bounded by their entry counts times a short name.
    from proxy.cache import keys

    long_value = "x" * (keys.MEMO_LONGEST + 1)
    fields, parses, tags, names = (
        keys._remembered_field.cache_info().currsize,
        keys._remembered_parse.cache_info().currsize,
        keys._remembered_table_tag.cache_info().currsize,
        len(keys._TAILS),
    )
    assert keys.partition_field([long_value]) == keys._field_of((long_value,))
    many = [""] * (keys.MEMO_PARTS + 1)  # short in characters, long in values
    assert keys.partition_field(many) == keys._field_of(tuple(many))
    assert keys.parse_partition_name("/".join(["a=1"] * (keys.MEMO_PARTS + 1)))
    assert keys.parse_partition_name(f"ds={long_value}")[1] == (long_value,)
    assert keys.TableRef.of("db", long_value).tag == keys._table_tag("db", long_value)
    assert keys._remembered_field.cache_info().currsize == fields
    assert keys._remembered_parse.cache_info().currsize == parses
    assert keys._remembered_table_tag.cache_info().currsize == tags
    tail = keys.partition_field([long_value])[2:]
    assert keys.columns_and_tail(f"ds={long_value}".encode()) == ("ds", tail)
    assert len(keys._TAILS) == names
    keys.partition_field(["2024-01-01"])
    assert keys._remembered_field.cache_info().currsize <= keys.MEMO_NAMES


def test_the_names_memo_stays_within_its_count_and_keeps_no_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from proxy.cache import keys

    monkeypatch.setattr(keys, "_TAILS", {})
    monkeypatch.setattr(keys, "MEMO_NAMES", 8)
    names = [f"ds={i}".encode() for i in range(20)]
    for at in range(0, 20, 3):
        chunk = names[at : at + 3]
        known = [keys.columns_and_tail(raw) for raw in [*chunk, b"not a name", b"ds=\xff"]]
        assert known[-2:] == [None, None]
        assert known[:-2] == [("ds", keys.partition_field([n.decode()[3:]])[2:]) for n in chunk]
        assert [keys._TAILS.get(raw) for raw in chunk] == known[:-2]
        assert len(keys._TAILS) <= 8
    assert b"not a name" not in keys._TAILS and b"ds=\xff" not in keys._TAILS
    assert names[19] in keys._TAILS and names[0] not in keys._TAILS  # the older went


def test_every_memo_is_on_metrics_with_the_bytes_it_counts() -> None:
    """A soak tells the memos' growth from a leak by these gauges (bench/load.py)."""
    from prometheus_client.parser import text_string_to_metric_families

    from proxy.app import Proxy
    from proxy.config import load
    from proxy.metrics import Metrics

    def scraped(metrics: Metrics) -> dict[tuple[str, str], float]:
        text = generate_latest(metrics.registry).decode()
        return {
            (s.name, s.labels["memo"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name.startswith("hmsproxy_memo_")
            for s in family.samples
        }

    async def run() -> None:
        metrics = Metrics()
        proxy = Proxy.build(load({"upstream": "thrift://h:1"}, {}), metrics)
        assert proxy.cache is not None
        spec = catalog.lookup("get_table")
        assert spec is not None
        before = scraped(metrics)
        assert {memo for _, memo in before} == {
            "cache", "partition_variants", "redis_commands", "set_ugi_replies", "dictionaries",
            "lock_fences", "fingerprints", "known_calls",
        }  # fmt: skip
        session = SessionState("s")
        for i in range(10):
            request = message("get_table", padded_get_table(i, 10))
            proxy.thrift.handler.plan_of(session, request, spec)
        proxy.pool.remember_ugi_reply(Identity(b"someone"), message("set_ugi", b"\x00"))
        after = scraped(metrics)
        entries = ("hmsproxy_memo_entries", "known_calls")
        assert after[entries] == before[entries] + 10
        known = proxy.thrift.handler.known
        assert known is not None
        assert after["hmsproxy_memo_bytes", "known_calls"] == known.bytes > 0
        assert after["hmsproxy_memo_bytes", "set_ugi_replies"] > 0

    asyncio.run(run())


def test_hits_answered_at_once_charge_what_they_keep_to_the_in_process_copy() -> None:
    # A hit answered at once keeps its judgement and its prepared reply with the entry's
    # in-process copy (proxy.cache.l1.Item): counted in the front's bytes, or a client naming
    # many small tables could make the front hold several times its budget.
    import gc
    import tracemalloc

    from proxy.handler import SessionState
    from proxy.wire.framing import Transport, whole_message
    from tests.unit.inprocess import rig

    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            shared = SessionState("shared")
            calls = []
            for i in range(1000):  # negative entries: a small reply each
                await r.call(shared, "get_table", 1, dbname="db", tbl_name=f"missing_{i:05d}")
                data = idl.encode_call("get_table", 2, dbname="db", tbl_name=f"missing_{i:05d}")
                found = whole_message(data, Transport.BUFFERED, 1 << 20)
                assert found is not None
                calls.append(found)
            for m in calls:  # plans made; the hits that follow only judge and prepare
                r.cache.plan_read(catalog.lookup("get_table"), m, None)  # type: ignore[arg-type]
            counted = r.cache.l1.held_bytes()
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            for m in calls:
                assert r.handler.serve_hit_now(shared, m, lambda reply: None)
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            # (Fingerprints of the versions judged are a memo of their own, on /metrics.)
            memo = ("proxy/cache/decide.py", "proxy/cache/entry.py")
            kept = sum(
                d.size_diff
                for d in after.compare_to(before, "filename")
                if not d.traceback[0].filename.endswith(memo)
            )
            charged = r.cache.l1.held_bytes() - counted
            assert len(r.cache.l1) == 1000  # (nothing evicted: a 2 MiB front here)
            assert 0 < kept <= charged, (kept / 1000, charged / 1000)

    asyncio.run(run())


def test_names_remembered_with_their_partitions_stay_within_their_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from proxy.cache import assembled
    from tests.unit.helpers import DAYS, DB, Asked, T, by_names
    from tests.unit.inprocess import rig

    monkeypatch.setattr(assembled, "FOUND_NAMES", 8)

    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            r.hms.add_table(DB, T, *DAYS[:20], v="1")
            ask = Asked(r)
            await ask(by_names(1, "d00"))  # the table's versions made (its epoch)
            await ask(by_names(2, *DAYS[:20]))  # all 20 cached and judged
            variants = r.cache.partitions.variants
            for seqid, first in enumerate(range(0, 18, 3), start=3):
                assert (await ask(by_names(seqid, *DAYS[first : first + 3])))[1] == "assembled"
                (variant,) = variants.memo.values()
                assert len(variant.found) == variants.found_names <= 8
            assert b"ds=d17" in variant.found  # (forgetting made room for the latest)
            plans = r.cache.memos()["partition_variants"]()
            assert plans[1] >= variants.found_names * assembled.FOUND_NAME_BYTES > 0

    asyncio.run(run())


def _variant() -> tuple[Any, Any, Any, str]:
    """(Variants, a variant of table db.t partitioned by ds, an L1, its entries' prefix)."""
    from proxy.cache.assembled import Variant, Variants
    from proxy.cache.keys import Naming, TableRef
    from proxy.cache.l1 import L1

    prefix = "hmsc:1:{t:x}:p:v:"
    return (
        Variants(Naming()),
        Variant(TableRef.of("db", "t"), "t:x", "t:x:v", prefix, "ds"),
        L1(1 << 22),
        prefix,
    )


def _held(l1: Any, prefix: str, *names: bytes) -> None:
    from proxy.cache.entry import Entry
    from proxy.cache.keys import columns_and_tail

    for name in names:
        known = columns_and_tail(name)
        assert known is not None
        l1.put(prefix + known[1], Entry(b"fp", 0, b"x", time.time() + 60), 60)


def test_names_are_remembered_with_their_items_weakly_and_only_short_ones() -> None:
    variants, variant, l1, prefix = _variant()
    short, long = b"ds=d01", b"ds=" + b"x" * keys.MEMO_LONGEST
    _held(l1, prefix, short, long)
    found = variants.items(variant, [short, long], l1.peek)
    assert found is not None and list(variant.found) == [short]
    assert variant.found[short]() is found[0] and variants.found_names == 1
    del found
    l1.clear()
    gc.collect()
    assert variant.found[short]() is None  # (the memo kept no item alive)


def test_one_request_never_takes_the_names_memo_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from proxy.cache import assembled

    monkeypatch.setattr(assembled, "FOUND_NAMES", 8)
    variants, variant, l1, prefix = _variant()
    names = [f"ds=d{i:02d}".encode() for i in range(50)]
    _held(l1, prefix, *names)
    assert variants.items(variant, names, l1.peek) is not None
    assert len(variant.found) <= variants.found_names <= 8


def test_calls_known_by_their_bytes_count_what_they_hold() -> None:
    # hmsproxy_memo_bytes{memo="known_calls"} and its 12 MiB bound rest on each call's bytes
    # as KnownCalls counts them: no less than what the call, its key, its place and the
    # Again that answers it again hold.
    import gc
    import tracemalloc

    from proxy.cache.l1 import Item
    from proxy.handler import SessionState
    from proxy.wire.framing import Transport, call_without_seqid, whole_message
    from tests.unit.inprocess import rig

    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            known = KnownCalls(per_user=False)  # (the handler's keeps the plans made below)
            shared = SessionState("shared")
            made = []
            for i in range(500):  # negative entries: a small reply each
                await r.call(shared, "get_table", 1, dbname="db", tbl_name=f"missing_{i:05d}")
            for i in range(500):
                data = idl.encode_call("get_table", 2, dbname="db", tbl_name=f"missing_{i:05d}")
                found = whole_message(data, Transport.BUFFERED, 1 << 20)
                repeat = call_without_seqid(data, Transport.BUFFERED)
                assert found is not None and repeat is not None
                item = r.handler.serve_hit_now(shared, found, lambda reply: None)
                assert isinstance(item, Item)
                plan = r.cache.plan_read(catalog.lookup("get_table"), found, None)  # type: ignore[arg-type]
                assert plan is not None
                made.append((data, repeat[0], item, plan, found))
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            for data, repeat, item, plan, found in made:
                known.plan(shared, found, lambda plan=plan: plan, repeat)
                call = known.get(shared, repeat)
                again = r.handler.again(item, data, Transport.BUFFERED)
                assert call is not None and again is not None
                known.answer_with(call, again)
            del again, call, data, repeat, item, plan, found
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            held = sum(d.size_diff for d in after.compare_to(before, "filename"))
            entries, counted = known.footprint()
            assert entries == 500
            assert 0 < held <= counted, (held / 500, counted / 500)

    asyncio.run(run())


def test_the_scopes_of_judgements_charge_what_they_keep() -> None:
    # Each item judged in process holds a scope (proxy.cache.scopes): a client naming many
    # tables makes one each, counted in L1's budget by Scopes.bytes.
    import tracemalloc

    def kept(make: Callable[[Scopes], list[object]]) -> tuple[int, int]:
        scopes = Scopes()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        held = make(scopes)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        size = sum(d.size_diff for d in after.compare_to(before, "filename"))
        return size - 8 * len(held), scopes.bytes  # (but the list the test holds them in)

    names = [f"hmsc:1:{{t:db.table_{i:05d}}}:v" for i in range(3000)]
    one, charged = kept(lambda scopes: [scopes.of((name,)) for name in names])
    assert one / len(names) > SCOPE_BYTES // 2 and one <= charged, one / len(names)
    wide = [tuple(names[i : i + 3]) for i in range(0, 3000, 3)]
    three, charged = kept(lambda scopes: [scopes.of(keys) for keys in wide])
    assert three <= charged, three / len(wide)


def test_the_in_process_copy_lets_items_go_for_the_bytes_of_their_scopes() -> None:
    scopes = Scopes()
    l1 = L1(100 * (300 + SCOPE_BYTES), scopes)
    for i in range(200):  # each judged under a scope of its own (a table each)
        l1.put(f"k{i:03d}", Entry(b"", 0, b"x" * 10, time.time() + 60), 60)
        item = l1.peek(f"k{i:03d}")
        assert item is not None
        scope = scopes.of((f"t{i}",))
        item.stamp(scope.mark, scope)
    # (The last scope, made after the last put, is counted at the next one.)
    assert l1.held_bytes() <= l1.max_bytes + SCOPE_BYTES and len(scopes) == len(l1) < 200
