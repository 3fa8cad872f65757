"""Calls the proxy only forwards, sent as they arrive and answered from the connections'
protocol callbacks (proxy.handler.flight); whatever that way does not finish is handed to
the ordinary way on the same metastore connection. Through the real protocols, against
the scripted metastore: on a loopback port, or fed in the pieces a test chooses on a fake
transport (tests.unit.fake_transport) where what arrives while a call is in flight is the
point."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from thrift.Thrift import TApplicationException

from proxy import idl
from proxy.guard.calls import PARTITION_READS
from proxy.handler import SessionState, dispatch
from proxy.handler.session import NoReply
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.framing import Transport, whole_message
from tests.rig.raw import seqid_of
from tests.unit.fake_transport import FakeConnection
from tests.unit.helpers import (
    DB,
    Client,
    T,
    call_once,
    connect,
    fed,
    get_table,
    listening,
    serving,
    session_tasks,
)
from tests.unit.inprocess import Rig, rig
from tests.unit.scripted_hms import (
    HALF_REPLY,
    HANG,
    HANG_UP,
    Action,
    Slow,
    Split,
    Trickle,
    header_of,
    result_of,
    until,
)


def flown(r: Rig) -> list[str]:
    """The calls sent as they arrived, by method (each test below checks the way it meant
    was taken: a test of a failure in flight that ran the ordinary way would prove
    nothing), as hmsproxy_calls_forwarded_at_once_total counts them."""
    sent = []
    for metric in r.metrics.registry.collect():
        if metric.name == "hmsproxy_calls_forwarded_at_once":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    sent += [sample.labels["method"]] * int(sample.value)
    return sorted(sent)


def status(seqid: int) -> bytes:
    return idl.encode_call("getStatus", seqid)


A = TypeVar("A", bound=Action)


async def in_flight(r: Rig, port: int, action: A, taskless: bool = False) -> tuple[Client, A]:
    """A client whose ``get_table`` (seqid 2) went out as it arrived and is at the
    metastore, which answers it as ``action`` says (its connection pooled by a first
    call). ``taskless``: the first call was another connection's (the client has said
    nothing before, and has no session); else its own."""
    r.hms.add_table(DB, T, v="1")
    if taskless:
        await call_once(r, port, status(1))
    client = await connect(r, port)
    if not taskless:
        await client.call(status(1))
    r.hms.script("get_table", action)
    await client.send(get_table(2))
    await until(lambda: r.hms.calls["get_table"] == 1, "the call at the metastore")
    assert session_tasks() == 0  # (sent as it came: no task waits for it)
    return client, action


async def held_in_flight(r: Rig, port: int, taskless: bool = False) -> tuple[Client, Slow]:
    """:func:`in_flight`, held at the metastore until the gate returned is set."""
    return await in_flight(r, port, Slow(), taskless)


async def fed_in_flight(
    r: Rig, connection: Callable[[], FakeConnection], action: A, taskless: bool = False
) -> tuple[FakeConnection, A]:
    """:func:`in_flight`, on a fake transport the test feeds (:func:`fed`)."""
    r.hms.add_table(DB, T, v="1")
    if taskless:
        first = connection()
        first.feed(status(1))
        await first.replied(1)
        await first.end()
        await until(lambda: session_tasks() == 0, "its task's end")
    client = connection()
    if not taskless:
        client.feed(status(1))
        await client.replied(1)
    r.hms.script("get_table", action)
    client.feed(get_table(2))
    await until(lambda: r.hms.calls["get_table"] == 1, "the call at the metastore")
    assert session_tasks() == 0  # (sent as it came: no task waits for it)
    return client, action


def replied(client: FakeConnection) -> list[int]:
    """The seqids of the replies ``client`` was sent but for the first call's (if made)."""
    return [seqid_of(reply) for reply in client.replies() if seqid_of(reply) != 1]


TASKLESS = pytest.mark.parametrize("taskless", [False, True], ids=["task", "taskless"])


@pytest.mark.parametrize("upstream", ["buffered", "framed"])
@pytest.mark.parametrize("transport", ["buffered", "framed"])
def test_a_forwarded_call_is_answered_as_its_reply_arrives_byte_for_byte(
    transport: str, upstream: str
) -> None:
    values = {"client_transport": transport, "upstream_transport": upstream}

    async def run() -> None:
        async with listening(cache=False, **values) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            for seqid in range(1, 6):
                reply = await client.call(get_table(seqid))
                assert reply == r.hms.answer("get_table", seqid, dbname=DB, tbl_name=T)
            # The first call opened the connection the ordinary way; the others took it
            # from the pool as they arrived.
            assert flown(r) == ["get_table"] * 4
            assert r.hms.calls["get_table"] == 5 and len(r.hms.connections) == 1
            assert r.requests("get_table", "ok") == 5
            assert (
                r.sample("hmsproxy_upstream_requests_total", method="get_table", outcome="ok") == 5
            )
            timed = r.sample(
                "hmsproxy_request_duration_seconds_count", method="get_table", source="upstream"
            )
            assert timed == 5
            assert r.idle == 1 and r.active == 0  # given back each time
            missing = idl.encode_call("get_table", 9, dbname=DB, tbl_name="none")
            assert await client.call(missing) == r.hms.answer(
                "get_table", 9, dbname=DB, tbl_name="none"
            )
            assert r.requests("get_table", "user_error") == 1
            await client.close()

    asyncio.run(run())


def test_with_the_cache_on_only_calls_it_does_not_answer_or_watch_go_as_they_arrive() -> None:
    async def run() -> None:
        async with listening() as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(status(1))  # opens the connection, the ordinary way
            for seqid in (2, 3):  # getStatus: a read never cached, sent as it came
                assert result_of(await client.call(status(seqid))).success == 2
            await client.call(get_table(4))  # a miss of a cached read: the ordinary way
            new = idl.module().Table(tableName=T, dbName=DB, parameters={"v": "2"})
            await client.call(
                idl.encode_call("alter_table", 5, dbname=DB, tbl_name=T, new_tbl=new)
            )  # a write: the ordinary way (its reply waits for the invalidation)
            assert r.hms.calls["get_table"] == 1 and r.hms.calls["alter_table"] == 1
            assert flown(r) == ["getStatus", "getStatus"]
            await client.close()

    asyncio.run(run())


@TASKLESS
@pytest.mark.parametrize("size", [300_000, 600_000])  # (one read may hold 300 KB whole)
def test_a_reply_too_big_to_hold_is_streamed_the_ordinary_way(size: int, taskless: bool) -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            r.hms.add_table(DB, T, big="x" * size)
            if taskless:  # (the session's streams are made for the ordinary way's writes)
                await call_once(r, port, status(1))
            client = await connect(r, port)
            if not taskless:
                await client.call(status(1))
            reply = await client.call(get_table(2))
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert len(reply) > size
            assert flown(r) == ["get_table"]  # sent as it came (finished the ordinary way)
            assert session_tasks() == 0  # (the task that finished it has ended)
            assert r.hms.calls["get_table"] == 1 and len(r.hms.connections) == 1
            assert r.requests("get_table", "ok") == 1 and r.idle == 1
            assert seqid_of(await client.call(status(3))) == 3  # the connection goes on
            assert session_tasks() == 0
            await client.close()

    asyncio.run(run())


def test_a_pooled_connection_the_metastore_closed_is_retried_for_a_read() -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(status(1))
            r.hms.script("get_table", HANG_UP)  # as an HMS drops an idle connection
            reply = await client.call(get_table(2))
            assert flown(r) == ["get_table"]
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert len(r.hms.connections) == 2  # the stale one, then a fresh one
            assert r.requests("get_table", "ok") == 1
            assert r.idle == 1 and r.active == 0
            await client.close()

    asyncio.run(run())


def test_a_write_whose_connection_ends_is_not_sent_again_and_its_client_sees_the_end() -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(status(1))
            r.hms.script("alter_table", HANG_UP)
            new = idl.module().Table(tableName=T, dbName=DB, parameters={"v": "2"})
            await client.send(idl.encode_call("alter_table", 2, dbname=DB, tbl_name=T, new_tbl=new))
            assert await asyncio.wait_for(client.reader.read(), 30) == b""
            assert r.hms.calls["alter_table"] == 1  # never twice: it may have been applied
            assert flown(r) == ["alter_table"]
            assert r.active == 0
            await client.close()

    asyncio.run(run())


def test_a_reply_cut_short_closes_the_client_connection() -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(status(1))
            r.hms.script("get_table", HALF_REPLY)
            await client.send(get_table(2))
            # What a client talking to that metastore sees: part of the reply (streamed as
            # it came, the ordinary way), then the end of the connection.
            got = b""
            while chunk := await asyncio.wait_for(client.reader.read(1 << 16), 30):
                got += chunk
            whole = r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert len(got) < len(whole) and whole.startswith(got)
            assert flown(r) == ["get_table"]
            assert r.active == 0 and r.idle == 0
            await client.close()

    asyncio.run(run())


def test_a_silent_metastore_is_answered_with_an_error_at_the_read_timeout() -> None:
    async def run() -> None:
        async with listening(cache=False, upstream_read_timeout=0.3) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(status(1))
            r.hms.script("get_table", HANG)
            reply = await asyncio.wait_for(client.call(get_table(2)), 30)
            assert header_of(reply).type == MessageType.EXCEPTION and seqid_of(reply) == 2
            assert flown(r) == ["get_table"]
            error = result_of(reply)
            assert isinstance(error, TApplicationException)
            assert "sent nothing for 0.3 s" in str(error.message)
            outcome = "timeout"
            assert (
                r.sample("hmsproxy_upstream_requests_total", method="get_table", outcome=outcome)
                == 1
            )
            assert r.active == 0 and r.idle == 0  # its reply may still come: closed
            assert result_of(await client.call(status(3))).success == 2  # a new one
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_reply_in_pieces_is_answered_once_whole(taskless: bool) -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            client, split = await in_flight(r, port, Split(), taskless)
            for _ in range(20):
                await asyncio.sleep(0.001)
            assert not client.reader._buffer  # half a reply is not sent
            split.gate.set()
            reply = await client.reply()
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert flown(r) == ["get_table"]
            await client.close()

    asyncio.run(run())


def test_a_request_arriving_while_a_call_is_in_flight_is_answered_after_it() -> None:
    async def run() -> None:
        async with fed(cache=False) as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            client, other = connection(), connection()
            held = Slow()  # two calls at once: two pooled connections
            r.hms.script("getStatus", held)
            other.feed(status(7))
            await until(lambda: r.hms.calls["getStatus"] == 1, "the first call")
            client.feed(status(1))
            await client.replied(1)
            held.gate.set()
            assert [seqid_of(reply) for reply in await other.replied(1)] == [7]
            await until(lambda: r.idle == 2, "two idle connections")
            slow = Slow()
            r.hms.script("get_table", slow)
            client.feed(get_table(2))
            await until(lambda: r.hms.calls["get_table"] == 1, "the call at the metastore")
            client.feed(status(3))  # a pipelining client, in a piece of its own
            for _ in range(20):
                await asyncio.sleep(0)
            assert replied(client) == []
            assert flown(r) == ["get_table"]
            assert r.hms.calls["getStatus"] == 2  # it waits for the call in flight
            slow.gate.set()
            await client.replied(3)
            assert replied(client) == [2, 3]
            await client.end()
            await other.end()

    asyncio.run(run())


def test_a_removed_method_found_out_in_flight_is_bridged() -> None:
    async def run() -> None:
        async with listening(cache=False, removed=("get_table",)) as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            await client.call(status(1))
            for seqid in (2, 3):  # found out in flight, then known: the ordinary way
                reply = await client.call(get_table(seqid))
                assert header_of(reply).type == MessageType.REPLY
                assert result_of(reply).success.tableName == T
            assert r.hms.calls["get_table"] == 1 and r.hms.calls["get_table_req"] == 2
            assert flown(r) == ["get_table"]
            await client.close()

    asyncio.run(run())


# A reply that is no message (a bad protocol version), and one to another call.
BAD = b"\x80\x09\x00\x02\x00\x00\x00\x09getStatus\x00\x00\x00\x02\x00"


@pytest.mark.parametrize(
    "reply", [lambda seqid: BAD, lambda seqid: idl.encode_call("getStatus", seqid + 1)]
)
def test_a_bad_reply_is_answered_with_an_error_and_its_connection_closed(
    reply: Callable[[int], bytes],
) -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            client = await connect(r, port)
            await client.call(status(1))
            r.hms.raw_replies["getStatus"] = reply
            answer = await asyncio.wait_for(client.call(status(2)), 30)
            error = result_of(answer)
            assert isinstance(error, TApplicationException) and seqid_of(answer) == 2
            assert flown(r) == ["getStatus"]
            assert "metastore call failed" in str(error.message)
            failed = r.sample(
                "hmsproxy_upstream_requests_total", method="getStatus", outcome="protocol_error"
            )
            assert failed == 1
            assert r.active == 0 and r.idle == 0
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_stopping_server_lets_a_call_in_flight_finish_then_closes_its_connection(
    taskless: bool,
) -> None:
    async def run() -> None:
        async with serving(cache=False) as (r, port, server):
            client, slow = await held_in_flight(r, port, taskless)
            stopping = asyncio.create_task(server.stop(30))
            await asyncio.sleep(0.05)
            assert not stopping.done()
            assert flown(r) == ["get_table"]
            slow.gate.set()
            assert seqid_of(await client.reply()) == 2
            await until(stopping.done, "the stop, once the call in flight was answered")
            assert await asyncio.wait_for(client.reader.read(), 30) == b""
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_call_in_flight_longer_than_the_idle_timeout_keeps_its_connection(taskless: bool) -> None:
    async def run() -> None:
        async with listening(cache=False, client_idle_timeout=0.2) as (r, port):
            client, slow = await held_in_flight(r, port, taskless)
            await asyncio.sleep(0.6)
            slow.gate.set()
            assert flown(r) == ["get_table"]
            assert seqid_of(await client.reply()) == 2
            assert r.sample("hmsproxy_client_errors_total", reason="idle") == 0
            await client.close()

    asyncio.run(run())


def test_a_flight_is_what_answers_these_calls() -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            client = await connect(r, port)
            for seqid in (1, 2, 3):
                await client.call(status(seqid))
            assert flown(r) == ["getStatus", "getStatus"]  # (the first opened the connection)
            await client.close()

    asyncio.run(run())


@pytest.mark.parametrize("size", [0, 600_000])  # held whole, or handed over to be streamed
def test_the_read_timeout_bounds_each_silence_not_the_whole_reply(size: int) -> None:
    async def run() -> None:
        async with listening(cache=False, upstream_read_timeout=0.3) as (r, port):
            r.hms.add_table(DB, T, big="x" * size)
            client = await connect(r, port)
            await client.call(status(1))
            r.hms.script("get_table", Trickle(parts=4, gap=0.2))  # 0.8 s in all
            reply = await asyncio.wait_for(client.call(get_table(2)), 30)
            assert reply == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert flown(r) == ["get_table"]
            assert r.requests("get_table", "ok") == 1 and r.idle == 1
            took = r.sample(
                "hmsproxy_request_duration_seconds_sum", method="get_table", source="upstream"
            )
            assert took >= 0.8  # timed from when it went out, whichever way finished it
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_stop_sends_nothing_a_client_pipelined_behind_a_call_in_flight(taskless: bool) -> None:
    async def run() -> None:
        async with fed(cache=False) as (r, server, connection):
            client, slow = await fed_in_flight(r, connection, Slow(), taskless)
            new = idl.module().Table(tableName=T, dbName=DB, parameters={"v": "2"})
            write = idl.encode_call("alter_table", 3, dbname=DB, tbl_name=T, new_tbl=new)
            client.feed(write)  # pipelined behind it, in a piece of its own
            await asyncio.sleep(0)
            stopping = asyncio.create_task(server.stop(30))
            await until(lambda: server.stopping, "the stop begun")
            slow.gate.set()
            await until(stopping.done, "the stop")
            await until(lambda: client.transport.lost, "the connection's end")
            # The call in flight answered, then the connection closed, as the ordinary way
            # stops after the call it is answering: the write never went out.
            assert replied(client) == [2]
            assert client.replies()[-1] == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert r.hms.calls["alter_table"] == 0
            assert flown(r) == ["get_table"]

    asyncio.run(run())


@TASKLESS
def test_a_stop_that_gives_up_on_a_call_in_flight_closes_its_connection(taskless: bool) -> None:
    async def run() -> None:
        async with serving(cache=False) as (r, port, server):
            client, slow = await held_in_flight(r, port, taskless)
            if not taskless:  # (kept behind the call in flight)
                await client.send(status(3))
            await asyncio.sleep(0.01)
            await server.stop(0.1)  # the drain timeout passes first
            await asyncio.sleep(0.05)
            assert session_tasks() == 0  # (an ended session starts no task for it)
            assert flown(r) == ["get_table"]
            assert r.active == 0 and r.idle == 0  # its reply may still come: closed
            slow.gate.set()
            await asyncio.sleep(0.05)
            assert r.active == 0 and r.idle == 0 and r.hms.calls["getStatus"] == 1
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_client_that_ends_its_side_after_its_call_still_gets_the_reply(taskless: bool) -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            client, slow = await held_in_flight(r, port, taskless)
            client.writer.write_eof()
            await asyncio.sleep(0.01)
            slow.gate.set()
            got = b""
            while chunk := await asyncio.wait_for(client.reader.read(1 << 16), 30):
                got += chunk
            assert got == r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert flown(r) == ["get_table"] and r.idle == 1
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_request_begun_during_a_call_in_flight_has_its_time_from_the_reply(
    taskless: bool,
) -> None:
    async def run() -> None:
        async with fed(cache=False, client_message_timeout=0.3) as (r, _server, connection):
            client, slow = await fed_in_flight(r, connection, Slow(), taskless)
            second = status(3)
            client.feed(second[:5])  # a request begun, in a piece of its own
            await asyncio.sleep(0.5)  # longer than a request may take to arrive
            slow.gate.set()
            await until(lambda: replied(client) == [2], "the reply in flight")
            client.feed(second[5:])  # the rest of it, after that reply
            await until(lambda: replied(client) == [2, 3], "the second reply")
            assert r.sample("hmsproxy_client_errors_total", reason="timeout") == 0
            assert flown(r) == ["get_table"]
            await client.end()

    asyncio.run(run())


@TASKLESS
def test_a_client_gone_before_its_reply_leaves_the_connection_pooled(taskless: bool) -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            client, slow = await held_in_flight(r, port, taskless)
            await client.close()
            await asyncio.sleep(0.01)
            slow.gate.set()
            await until(lambda: r.idle == 1, "the connection given back")
            assert flown(r) == ["get_table"] and r.active == 0
            # (the reply written to a socket the client closed may yet be taken by the
            # kernel: "ok" or "client_gone", as the ordinary way would count it)
            counted = r.requests("get_table", "ok") + r.requests("get_table", "client_gone")
            assert counted == 1

    asyncio.run(run())


@pytest.mark.parametrize("cache", [True, False])
def test_what_goes_as_it_arrives_is_exactly_what_handle_only_forwards(
    cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every method of the IDL, and one it does not know, as a two-way call, as a oneway
    call, and on a pinned session: forwards_plainly holds exactly when handle() takes its
    plain forward (its other ways recorded instead of run)."""
    taken: list[str] = []

    async def plain(*args: Any, **kwargs: Any) -> str:
        taken.append("plain")
        return "ok"

    def other(way: str) -> Callable[..., Any]:
        async def record(*args: Any, **kwargs: Any) -> Any:
            taken.append(way)
            return "ok"

        return record

    async def run() -> None:
        async with rig(cache=cache) as r:
            handler = r.handler
            monkeypatch.setattr(handler, "_forward", plain)
            for name in ("set_ugi", "delegation_token", "pinned_call"):
                monkeypatch.setattr(handler.identities, name, other(name))
            if handler.writes is not None:
                monkeypatch.setattr(handler.writes, "locking", other("locking"))
                monkeypatch.setattr(handler.writes, "write", other("write"))
            monkeypatch.setattr(dispatch, "cached_read", other("cached"))
            names = [*sorted(idl.method_names()), "no_such_method"]
            pinned = SessionState("pinned")
            pinned.pinned = object()  # type: ignore[assignment]
            checked = 0
            for name in names:
                for kind in (MessageType.CALL, MessageType.ONEWAY):
                    for session in (SessionState("plain"), pinned):
                        data = encode_header(name, kind, 1) + b"\x00"
                        message = whole_message(data, Transport.BUFFERED, 1 << 20)
                        assert message is not None
                        taken.clear()
                        plainly = handler.forwards_plainly(session, message.header)
                        await handler.handle(session, message, NoReply(Transport.BUFFERED))
                        way = taken[0] if len(taken) == 1 else None
                        oneway = kind == MessageType.ONEWAY or name in idl.oneway_methods()
                        simply = way == "plain" and not oneway and session is not pinned
                        # (A call for partitions is costed before it goes: proxy.guard.)
                        simply = simply and name not in PARTITION_READS
                        assert plainly == simply, (name, kind, session.peer, way)
                        checked += 1
            assert checked == 4 * len(names)

    asyncio.run(run())


def test_fast_paths_off_takes_the_ordinary_way_for_every_call() -> None:
    async def run() -> None:
        async with listening(cache=False, fast_paths="off") as (r, port):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            for seqid in (1, 2, 3):
                reply = await client.call(get_table(seqid))
                assert reply == r.hms.answer("get_table", seqid, dbname=DB, tbl_name=T)
            assert flown(r) == []
            await client.close()

    asyncio.run(run())


@TASKLESS
def test_a_call_in_flight_whose_client_is_gone_ends_the_session_with_nothing_more_sent(
    taskless: bool,
) -> None:
    async def run() -> None:
        async with fed(cache=False) as (r, server, connection):
            client, _split = await fed_in_flight(r, connection, Split(), taskless)
            new = idl.module().Table(tableName=T, dbName=DB, parameters={"v": "2"})
            write = idl.encode_call("alter_table", 3, dbname=DB, tbl_name=T, new_tbl=new)
            client.feed(write)  # pipelined behind it, in a piece of its own
            await asyncio.sleep(0)
            r.hms.connections[0].close()  # the metastore hangs up halfway through the reply
            await until(lambda: client.transport.lost, "the connection's end")
            await until(lambda: not server._connections, "the connection's end")
            for _ in range(20):  # (what it sent by then reaches the metastore)
                await asyncio.sleep(0)
            # Part of the reply (streamed as it came, the ordinary way), then the end.
            got = bytes(client.transport.written)
            if not taskless:
                first = r.hms.answer("getStatus", 1)
                assert got.startswith(first)
                got = got[len(first) :]
            whole = r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)
            assert len(got) < len(whole) and whole.startswith(got)
            assert flown(r) == ["get_table"]
            assert r.hms.calls["alter_table"] == 0  # as the ordinary way, which ends there

    asyncio.run(run())


@TASKLESS
def test_a_client_that_resets_its_connection_in_flight_is_counted_gone(taskless: bool) -> None:
    async def run() -> None:
        async with listening(cache=False) as (r, port):
            client, slow = await held_in_flight(r, port, taskless)
            sock = client.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.writer.transport.abort()  # a reset, not an end
            await asyncio.sleep(0.05)
            slow.gate.set()
            await until(lambda: r.idle == 1, "the connection given back, its reply read")
            assert flown(r) == ["get_table"]
            assert r.requests("get_table", "client_gone") == 1 and r.active == 0

    asyncio.run(run())
