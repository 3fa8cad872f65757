"""The listener's shortcut for hits: a request that arrives whole while its connection is
idle, and is a hit needing no await, is answered by the connection's protocol as it arrives
(see proxy.conn.protocol). On a loopback port, or fed in the pieces a test chooses on a
fake transport (tests.unit.fake_transport) where how a request arrives is the point. Which
way a call took is told by what is observable: the hits answered with no task
(``hmsproxy_cache_hits_at_once_total``), the calls that reached the metastore, the calls
waiting in a task."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Literal

import pytest

from proxy import catalog, idl
from proxy.cache import locks
from proxy.cache.keys import Bump, TableRef, partition_field
from proxy.cache.l1 import Item
from proxy.cache.store import MemoryStore
from proxy.handler import SessionState, dispatch
from proxy.handler.session import ClientGone
from proxy.server import ThriftServer
from proxy.status import Activity
from proxy.wire.binary import REPEAT_BYTES, reseq
from proxy.wire.framing import Transport, call_without_seqid, whole_message
from tests.rig.raw import seqid_of
from tests.unit.helpers import (
    DB,
    T,
    answer_of,
    at_once,
    call_once,
    connect,
    fed,
    get_table,
    listening,
    session_tasks,
)
from tests.unit.inprocess import Client as Channel
from tests.unit.inprocess import Rig, rig
from tests.unit.inprocess import message as message_of
from tests.unit.scripted_hms import Slow, message_length, split_messages, table, until


@pytest.mark.parametrize("transport", ["buffered", "framed"])
def test_a_hit_is_answered_as_it_arrives_with_the_hms_bytes(transport: str) -> None:
    async def run() -> None:
        async with listening(client_transport=transport) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            assert await client.call(get_table(1)) == r.hms.answer(
                "get_table", 1, dbname=DB, tbl_name=T
            )
            assert at_once(r) == 0  # the miss, the ordinary way
            for seqid in range(2, 6):
                reply = await client.call(get_table(seqid))
                assert reply == r.hms.answer("get_table", seqid, dbname=DB, tbl_name=T)
            assert at_once(r) == 4  # the hits, at once
            assert r.hms.calls["get_table"] == 1
            hits = r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit")
            assert hits == 4
            assert r.requests("get_table", "ok") == 5
            served = r.sample(
                "hmsproxy_request_duration_seconds_count", method="get_table", source="cache"
            )
            assert served == 4
            missing = idl.encode_call("get_table", 7, dbname=DB, tbl_name="none")
            first = await client.call(missing)
            assert await client.call(missing) == first  # a negative hit, at once too
            assert r.hms.calls["get_table"] == 2 and at_once(r) == 5
            assert r.requests("get_table", "user_error") == 2
            await client.close()

    asyncio.run(run())


def test_pipelined_split_and_write_calls_take_the_ordinary_way_in_order() -> None:
    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            client = connection()
            client.feed(get_table(1))  # the miss
            await client.replied(1)
            client.feed(get_table(2) + get_table(3))  # two in one piece
            assert [seqid_of(reply) for reply in (await client.replied(3))[1:]] == [2, 3]
            # Hits, answered the ordinary way: none at once.
            assert r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 2
            assert at_once(r) == 0
            request = get_table(4)
            client.feed(request[:10])  # one request in two pieces
            await asyncio.sleep(0)  # (a turn of the loop between them)
            client.feed(request[10:])
            assert (await client.replied(4))[3] == answer_of(r, 4)
            assert r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 3
            assert at_once(r) == 0
            # A write through the same connection, then a read of what it changed: the
            # written table, though the read before it was a hit.
            new = table(DB, T, v="2")
            client.feed(idl.encode_call("alter_table", 5, dbname=DB, tbl_name=T, new_tbl=new))
            await client.replied(5)
            client.feed(get_table(6))
            assert (await client.replied(6))[5] == answer_of(r, 6)
            assert r.hms.calls["get_table"] == 2 and r.hms.calls["alter_table"] == 1
            client.feed(get_table(7))
            assert (await client.replied(7))[6] == answer_of(r, 7)
            assert r.hms.calls["get_table"] == 2
            assert at_once(r) == 1  # the last one was a hit at once
            await client.end()

    asyncio.run(run())


def test_the_idle_clock_runs_from_the_last_request_answered_at_once() -> None:
    async def run() -> None:
        async with listening(client_idle_timeout=0.4) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(get_table(1))
            for seqid in range(2, 12):  # a second of hits, each within the idle timeout
                await asyncio.sleep(0.1)
                assert seqid_of(await client.call(get_table(seqid))) == seqid
            assert at_once(r) == 10
            closed = await asyncio.wait_for(client.reader.read(), 30)  # then idle: closed
            assert closed == b""
            assert r.sample("hmsproxy_client_errors_total", reason="idle") == 1
            await client.close()

    asyncio.run(run())


def test_replies_over_the_immediate_limit_take_the_ordinary_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A big reply is written in slices with backpressure, never as one copy and one write.
    monkeypatch.setattr("proxy.handler.dispatch.IMMEDIATE_REPLY_BYTES", 100)

    async def run() -> None:
        async with listening() as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            for seqid in (1, 2, 3):
                reply = await client.call(get_table(seqid))
                assert reply == r.hms.answer("get_table", seqid, dbname=DB, tbl_name=T)
            assert r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit") == 2
            assert at_once(r) == 0  # (hits, answered the ordinary way)
            await client.close()

    asyncio.run(run())


def test_a_hit_arriving_while_an_earlier_call_is_answered_waits_its_turn() -> None:
    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            r.hms.add_table(DB, "u", v="1")
            client = connection()
            client.feed(get_table(1))  # cached
            await client.replied(1)
            slow = Slow()
            r.hms.script("get_table", slow)
            client.feed(idl.encode_call("get_table", 2, dbname=DB, tbl_name="u"))
            await until(lambda: r.hms.calls["get_table"] == 2, "the miss at the metastore")
            client.feed(get_table(3))  # a hit, in a piece of its own, meanwhile
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(client.replies()) == 1  # nothing answered yet
            slow.gate.set()
            assert [seqid_of(reply) for reply in (await client.replied(3))[1:]] == [2, 3]
            # The miss the ordinary way; the hit, its turn come, at once by the session's
            # task (see the next test).
            assert r.hms.calls["get_table"] == 2 and at_once(r) == 1
            await client.end()

    asyncio.run(run())


def test_a_hit_on_a_connection_of_its_own_is_answered_with_no_task() -> None:
    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")

            async def ask(*pieces: bytes) -> list[bytes]:
                """``pieces`` on a connection of its own, each as one read, with a turn of
                the loop after each; its replies; then closed (Trino's way)."""
                client = connection()
                for piece in pieces:
                    client.feed(piece)
                    await asyncio.sleep(0)
                asked = split_messages(b"".join(pieces), framed=False)
                replies = await client.replied(len(asked))
                assert session_tasks() == 0  # (none left: each call's task ends with it)
                await client.end()
                await until(lambda: session_tasks() == 0, "its task's end")
                return replies

            # A miss: the ordinary way, in a task.
            assert await ask(get_table(1)) == [answer_of(r, 1)]
            assert (r.hms.calls["get_table"], at_once(r)) == (1, 0)
            for seqid in (2, 3):  # Trino's way: one call per connection, with no task
                assert await ask(get_table(seqid)) == [answer_of(r, seqid)]
            assert (r.hms.calls["get_table"], at_once(r)) == (1, 2)
            # Then asked again on its connection: answered again, as ever, still no task.
            client = connection()
            client.feed(get_table(4))
            await client.replied(1)
            client.feed(get_table(5))
            assert await client.replied(2) == [answer_of(r, 4), answer_of(r, 5)]
            assert session_tasks() == 0 and at_once(r) == 4
            await client.end()
            # Two requests sent together with the connection, or part of one: the ordinary
            # way, in order, in a task.
            replies = await ask(get_table(6) + get_table(7))
            assert replies == [answer_of(r, 6), answer_of(r, 7)]
            assert at_once(r) == 4
            request = get_table(8)
            assert await ask(request[:10], request[10:]) == [answer_of(r, 8)]
            assert at_once(r) == 4
            hits = r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit")
            assert hits == 7 and r.hms.calls["get_table"] == 1
            # Every session ended, taskless or not: none left open, none counted.
            await until(lambda: not r.sample("hmsproxy_client_connections"), "the ends")

    asyncio.run(run())


def test_a_call_only_forwarded_on_a_connection_of_its_own_goes_with_no_task() -> None:
    async def run() -> None:
        async with fed(cache=False) as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            first = connection()  # (a pooled metastore connection stands idle after it)
            first.feed(get_table(1))
            assert await first.replied(1) == [answer_of(r, 1)]
            assert not r.sample("hmsproxy_calls_forwarded_at_once_total", method="get_table")
            await first.end()
            await until(lambda: session_tasks() == 0, "its task's end")
            alone = connection()
            alone.feed(get_table(2))
            assert await alone.replied(1) == [answer_of(r, 2)]
            assert session_tasks() == 0
            await alone.end()
            client = connection()
            client.feed(get_table(3))
            await client.replied(1)
            client.feed(get_table(4))
            assert await client.replied(2) == [answer_of(r, 3), answer_of(r, 4)]
            assert session_tasks() == 0
            assert r.requests("get_table", "ok") == 4 and r.hms.calls["get_table"] == 4
            await client.end()
            await until(lambda: not r.sample("hmsproxy_client_connections"), "the ends")

    asyncio.run(run())


def test_no_answer_at_once_on_a_pinned_connection_or_with_invalidations_pending() -> None:
    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, v="1")
            shared = SessionState("shared")
            await r.call(shared, "get_table", 1, dbname=DB, tbl_name=T)
            request = whole_message(get_table(2), Transport.BUFFERED, 1 << 20)
            assert request is not None
            out: list[bytes] = []
            assert r.handler.serve_hit_now(shared, request, out.append)
            assert out == [r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)]
            # A connection with a configuration of its own (setMetaConf) reads no cache.
            pinned = SessionState("pinned")
            await r.call(
                pinned, "setMetaConf", 3, key="hive.metastore.batch.retrieve.max", value="7"
            )
            assert pinned.pinned is not None
            assert not r.handler.serve_hit_now(pinned, request, out.append)
            # An invalidation the store has not taken yet: no hit until it is applied.
            assert r.cache is not None
            r.cache.invalidations.pending.append((None, None))  # type: ignore[arg-type]
            assert not r.handler.serve_hit_now(shared, request, out.append)
            r.cache.invalidations.pending.clear()
            assert r.handler.serve_hit_now(shared, request, out.append)
            assert len(out) == 2
            hits = r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit")
            assert hits == 2  # the refused ones were not counted

    asyncio.run(run())


def test_a_hit_judged_once_is_judged_again_after_any_change_to_what_it_depends_on() -> None:
    # Repeated hits reuse their judgement while the scope of the versions they read stands (see
    # WholeReads.judged_now); each change below must end that, or a stale reply is served.
    async def run() -> None:
        store = MemoryStore(1 << 24, max_version_hashes=2)
        async with rig(store=store) as r:
            r.hms.add_table(DB, T, v="1")
            r.hms.add_table(DB, "u", v="1")
            shared = SessionState("shared")
            key = r.cache.naming.versions(TableRef.of(DB, T).tag)  # type: ignore[union-attr]
            request = whole_message(get_table(2), Transport.BUFFERED, 1 << 20)
            assert request is not None
            out: list[bytes] = []

            async def judged_again() -> bool:
                await r.call(shared, "get_table", 1, dbname=DB, tbl_name=T)  # (re)filled
                assert r.handler.serve_hit_now(shared, request, out.append)
                assert r.handler.serve_hit_now(shared, request, out.append)  # reused
                return True

            await judged_again()
            await store.bump([Bump(key, "table", "table")])  # a write (another's, say)
            assert not r.handler.serve_hit_now(shared, request, out.append)
            await judged_again()
            lock = locks.LOCK_PREFIX + "x:table"
            await store.mark([(key, lock)], time.time() + 60)  # a lock fences it
            assert not r.handler.serve_hit_now(shared, request, out.append)
            await store.unmark([(key, lock)])
            assert r.handler.serve_hit_now(shared, request, out.append)
            # Its version hash evicted (two at most here), then made anew with a new epoch.
            await r.call(shared, "get_table", 3, dbname=DB, tbl_name="u")
            await store.ensure_epochs([r.cache.naming.versions("db.v"), key])  # type: ignore[union-attr]
            assert not r.handler.serve_hit_now(shared, request, out.append)
            await judged_again()
            await store.flush()
            assert not r.handler.serve_hit_now(shared, request, out.append)
            assert r.hms.calls["get_table"] == 4  # T three times, u once

    asyncio.run(run())


def serve_known(
    r: Rig, session: SessionState, repeat: tuple[bytes, int], write: Callable[[bytes], None]
) -> Item | Literal[False] | None:
    """A call answered by its bytes, as a connection does (``False``: not known by them)."""
    assert r.handler.known is not None
    call = r.handler.known.get(session, repeat[0])
    if call is None:
        return False
    return r.handler.serve_known_now(call, repeat[1], write)


def test_a_repeated_call_is_known_by_its_bytes_and_per_user_caches_keep_users_apart() -> None:
    async def run() -> None:
        async with rig(per_user=True) as r:
            r.hms.add_table(DB, T, v="1")
            alice, bob = SessionState("a", user="alice"), SessionState("b", user="bob")
            await r.call(alice, "get_table", 1, dbname=DB, tbl_name=T)  # alice's entry
            data = get_table(2)
            repeat = call_without_seqid(data, Transport.BUFFERED)
            message = whole_message(data, Transport.BUFFERED, 1 << 20)
            assert repeat is not None and message is not None
            out: list[bytes] = []
            # Its plan was kept by its bytes when the awaited path made it.
            assert isinstance(serve_known(r, alice, repeat, out.append), Item)
            again = call_without_seqid(get_table(9), Transport.BUFFERED)
            assert again is not None and again[0] == repeat[0]
            assert isinstance(serve_known(r, alice, again, out.append), Item)
            assert out == [
                r.hms.answer("get_table", seqid, dbname=DB, tbl_name=T) for seqid in (2, 9)
            ]
            # The same bytes from bob: alice's plan is not his, and neither is her entry.
            assert serve_known(r, bob, again, out.append) is False  # not known
            assert not r.handler.serve_hit_now(bob, message, out.append, repeat[0])
            assert len(out) == 2
            # Not a small strict call: not known by its bytes (the ordinary checks decide).
            assert call_without_seqid(data[:-1], Transport.FRAMED) is None
            framed = struct.pack(">i", len(data)) + data
            assert call_without_seqid(framed, Transport.FRAMED) == repeat
            assert call_without_seqid(framed + b"\x00", Transport.FRAMED) is None
            big = idl.encode_call("get_table", 3, dbname=DB, tbl_name="x" * REPEAT_BYTES)
            assert call_without_seqid(big, Transport.BUFFERED) is None

    asyncio.run(run())


def test_a_hit_answered_at_once_is_counted_once_its_reply_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its look-up, the status page's count and its reply are counted after the write (the
    client has the reply meanwhile), once, whichever way it was known; a client gone at the
    write still made its look-up; a hit not answered at once is not counted here, as the
    ordinary way that answers it counts it."""

    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            seen = r.cache.hits.seen = Activity(show_names=True)
            r.hms.add_table(DB, T, v="1")
            session = SessionState("shared")
            await r.call(session, "get_table", 1, dbname=DB, tbl_name=T)  # the miss

            def counts() -> tuple[float, float, int]:
                return (
                    r.sample("hmsproxy_cache_lookups_total", method="get_table", result="hit"),
                    r.requests("get_table", "ok"),
                    seen.busiest()[0][1],
                )

            at_write: list[tuple[float, float, int]] = []

            def write(reply: bytes) -> None:
                at_write.append(counts())

            before = counts()
            message = whole_message(get_table(2), Transport.BUFFERED, 1 << 20)
            repeat = call_without_seqid(get_table(2), Transport.BUFFERED)
            assert message is not None and repeat is not None
            assert isinstance(r.handler.serve_hit_now(session, message, write, repeat[0]), Item)
            assert at_write == [before]
            assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1)
            # Known by its bytes the next time: the same.
            again = call_without_seqid(get_table(3), Transport.BUFFERED)
            assert again is not None
            before = counts()
            assert isinstance(serve_known(r, session, again, write), Item)
            assert at_write[1] == before
            assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1)

            def gone(reply: bytes) -> None:
                raise ConnectionResetError("the client went away")

            before = counts()
            with pytest.raises(ClientGone):
                serve_known(r, session, again, gone)
            assert counts() == (before[0] + 1, before[1], before[2] + 1)
            assert r.requests("get_table", "client_gone") == 1

            # An answer that cannot be prepared: not answered at once, nothing counted.
            def broken(reply: object) -> None:
                raise ValueError("not a reply to prepare")

            r.cache.l1.clear()  # (its prepared answer goes with its copy)
            await r.call(session, "get_table", 4, dbname=DB, tbl_name=T)  # copied again
            monkeypatch.setattr(dispatch.again, "prepared", broken)
            before = counts()
            assert serve_known(r, session, again, write) is None
            assert counts() == before
            assert len(at_write) == 2

    asyncio.run(run())


@pytest.mark.parametrize("late", [False, True], ids=["protocol", "task"])
def test_a_bug_answering_at_once_before_the_reply_closes_the_connection(
    late: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The client is not left waiting for a reply that will not come: the request read as
    it arrives, by the connection's protocol, or (``late``) by the session's task, having
    arrived while a miss was answered."""

    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            r.hms.add_table(DB, "u", v="1")
            first = connection()
            first.feed(get_table(1))  # cached
            await first.replied(1)
            await first.end()

            def bug(*args: Any) -> None:
                raise KeyError("a bug")

            client = connection()
            if late:  # the request comes while a miss is answered: the task reads it
                slow = Slow()
                r.hms.script("get_table", slow)
                client.feed(idl.encode_call("get_table", 9, dbname=DB, tbl_name="u"))
                await until(lambda: r.hms.calls["get_table"] == 2, "the miss at the metastore")
            monkeypatch.setattr(r.handler, "serve_known_now", bug)
            client.feed(get_table(2))
            if late:
                await asyncio.sleep(0)
                assert client.replies() == [] and not client.transport.lost  # (its turn waits)
                slow.gate.set()
            await until(lambda: client.transport.lost, "the connection's end")
            # Closed, with no reply to it (the miss before it answered).
            assert [seqid_of(reply) for reply in client.replies()] == ([9] if late else [])
            assert "internal error answering at once: closing the connection" in caplog.text

    asyncio.run(run())


def test_a_bug_after_a_reply_written_at_once_keeps_the_connection(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        async with listening() as (r, port):
            assert r.cache is not None
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(get_table(1))  # cached

            def bug(item: Item) -> None:
                raise KeyError("a bug in counting")

            monkeypatch.setattr(r.cache, "count_now", bug)
            assert await client.call(get_table(2)) == answer_of(r, 2)  # at once, then the bug
            assert "internal error after answering at once" in caplog.text
            monkeypatch.undo()
            assert await client.call(get_table(3)) == answer_of(r, 3)  # the same connection
            await client.close()

    asyncio.run(run())


def test_under_uvloop_a_connection_per_call_is_answered_at_once() -> None:
    """The real ordering: a client in a thread connects, sends at once, reads, closes."""
    uvloop = pytest.importorskip("uvloop")

    def trino(port: int, calls: int) -> list[bytes]:
        replies = []
        for seqid in range(2, 2 + calls):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(get_table(seqid))
                reply = b""
                while message_length(reply) is None:
                    data = sock.recv(1 << 16)
                    assert data
                    reply += data
                replies.append(reply)
        return replies

    async def run() -> None:
        async with listening() as (r, port):
            r.hms.add_table(DB, T, v="1")
            await call_once(r, port, get_table(1))  # cached
            replies = await asyncio.to_thread(trino, port, 30)
            assert replies == [answer_of(r, seqid) for seqid in range(2, 32)]
            # At once, all of them.
            assert at_once(r) == 30 and r.hms.calls["get_table"] == 1

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_accepted_connections_have_no_nagle_delay(loop: str) -> None:
    """The event loop's TCP transport sets TCP_NODELAY (the proxy no longer sets it again):
    a small reply is never held back waiting for an acknowledgement."""
    factory = asyncio.new_event_loop
    if loop == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop

    async def run() -> None:
        async with rig(listen="127.0.0.1:0") as r:
            server = ThriftServer(r.options, r.handler, r.metrics)
            await server.start()
            try:
                client = await connect(r, server.ports[0])
                try:
                    await until(lambda: server.connections() == 1, "the connection")
                    (protocol,) = server._connections
                    assert protocol.transport is not None
                    sock = protocol.transport.get_extra_info("socket")
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                finally:
                    await client.close()
            finally:
                await server.stop(0)

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())


def by_names(seqid: int, *values: str) -> bytes:
    names = [f"ds={v}" for v in values]
    return idl.encode_call("get_partitions_by_names", seqid, db_name=DB, tbl_name=T, names=names)


def test_an_assembled_by_names_reply_is_kept_whole_until_one_of_its_partitions_changes() -> None:
    async def run() -> None:
        async with rig() as r:
            assert r.cache is not None
            r.hms.add_table(DB, T, "a", "b", "c", v="1")
            shared = SessionState("shared")
            out: list[bytes] = []

            def now(request: bytes) -> bool:
                message = whole_message(request, Transport.BUFFERED, 1 << 20)
                assert message is not None
                return r.handler.serve_hit_now(shared, message, out.append)

            async def ordinary(request: bytes) -> bytes:
                client = Channel()
                await r.handler.handle(shared, message_of(request), client)
                return client.reply()

            def answer(seqid: int, *values: str) -> bytes:
                names = [f"ds={v}" for v in values]
                return r.hms.answer(
                    "get_partitions_by_names", seqid, db_name=DB, tbl_name=T, names=names
                )

            assert await ordinary(by_names(1, "a", "b")) == answer(1, "a", "b")  # the miss
            for seqid in (2, 3):  # assembled from its partitions, twice: then kept whole
                assert not now(by_names(seqid, "a", "b"))
                assert await ordinary(by_names(seqid, "a", "b")) == answer(seqid, "a", "b")
            assert now(by_names(3, "a", "b"))  # ... and answered whole
            assert out == [answer(3, "a", "b")]
            # One of its partitions changes (another proxy's write, say): not served whole.
            r.hms.partitions[(DB, T)]["ds=b"].parameters["numFiles"] = "2"
            key = r.cache.naming.versions(TableRef.of(DB, T).tag)
            await r.store.bump([Bump(key, partition_field(("b",)), "partitions")])
            assert not now(by_names(4, "a", "b"))
            assert await ordinary(by_names(4, "a", "b")) == answer(4, "a", "b")  # b again
            assert await ordinary(by_names(5, "a", "b")) == answer(5, "a", "b")  # assembled
            assert now(by_names(6, "a", "b"))
            head, at, _ = reseq(out[0], 6)
            assert out[-1] == answer(6, "a", "b") != head + out[0][at:]  # b's new bytes
            # A request naming a partition the metastore does not have is never kept whole
            # (whether one is added later depends on a version its refs do not name).
            for seqid in (7, 8, 9):
                assert await ordinary(by_names(seqid, "a", "zz")) == answer(seqid, "a", "zz")
            # (Answered at once all the same: assembled from its partitions, see the next
            # test, never from a whole reply.)
            assert now(by_names(10, "a", "zz"))
            assert out[-1] == answer(10, "a", "zz")
            spec = catalog.lookup("get_partitions_by_names")
            assert spec is not None
            plan = r.cache.plan_read(spec, message_of(by_names(10, "a", "zz")), None)
            assert plan is not None and r.cache.l1.get(plan.key) is None  # not kept whole
            assert r.hms.calls["get_partitions_by_names"] == 3  # a+b, then b, then zz

    asyncio.run(run())


class MirroredStore(MemoryStore):
    """The embedded store, handing out its versions as the mirror does (proxy.cache.mirror):
    the same dictionary for a hash every time, updated in place as newer values are
    learned."""

    def __init__(self) -> None:
        super().__init__(1 << 24)
        self.views: dict[str, dict[str, bytes | None]] = {}

    def local(self, versions: Any) -> Any:
        got = self._current(versions)
        for key, fields in got.items():
            view = self.views.setdefault(key, {})
            view.update(fields)
            got[key] = view
        return got


def test_a_partition_fetched_before_a_write_is_not_filled_under_the_versions_after_it() -> None:
    async def run() -> None:
        store = MirroredStore()
        async with rig(store=store) as r:
            assert r.cache is not None
            r.hms.add_table(DB, T, "a", v="1")
            shared = SessionState("shared")
            args = {"db_name": DB, "tbl_name": T, "names": ["ds=a"]}
            key = r.cache.naming.versions(TableRef.of(DB, T).tag)
            field = partition_field(("a",))
            params = r.hms.partitions[(DB, T)]["ds=a"].parameters

            async def write(files: str) -> None:  # another proxy's alter_partition, say
                params["numFiles"] = files
                await store.bump([Bump(key, field, "partitions")])
                store.local({key: [field]})  # ... whose versions this proxy learns

            await r.call(shared, "get_partitions_by_names", 1, **args)  # in process now
            await write("2")
            # Its entry is judged in process, against the versions kept there: stale, so
            # fetched; the fetch is held while a second write lands and is learned into
            # the very dictionary that judgement read.
            slow = Slow()
            r.hms.script("get_partitions_by_names", slow)
            read = asyncio.ensure_future(r.call(shared, "get_partitions_by_names", 2, **args))
            await until(lambda: r.hms.calls["get_partitions_by_names"] == 2, "the fetch")
            before_second_write = r.hms.answer("get_partitions_by_names", 2, **args)
            await write("3")
            params["numFiles"] = "2"  # what the held fetch read, before the second write
            slow.gate.set()
            assert await read == before_second_write
            params["numFiles"] = "3"
            after = await r.call(shared, "get_partitions_by_names", 3, **args)
            assert after == r.hms.answer("get_partitions_by_names", 3, **args)

    asyncio.run(run())
