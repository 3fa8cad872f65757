"""A client connection's protocol (proxy.conn.protocol): a connection whose calls are
answered as they arrive, with no task and often no session, keeps the listener's promises
(the idle timeout, the connection limit, a stop, the connection gauge) as one whose calls
wait in tasks does; and a stop closes the connections with no session yet. On a loopback
port (a request in parts: fed on a fake transport, tests.unit.fake_transport)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from thrift.Thrift import TApplicationException

from proxy import idl
from proxy.conn.protocol import ClientProtocol
from proxy.handler.again import Again
from proxy.handler.session import PeerName
from proxy.sasl.negotiation import Status, encode
from proxy.server import ThriftServer
from tests.rig.raw import seqid_of
from tests.unit.helpers import (
    DB,
    Client,
    T,
    acceptor,
    at_once,
    call_once,
    connect,
    fed,
    get_table,
    serving,
    session_tasks,
)
from tests.unit.inprocess import Rig, rig
from tests.unit.scripted_hms import Slow, result_of, until


def test_the_idle_timeout_closes_a_taskless_connection_silent_or_done_asking() -> None:
    async def run() -> None:
        async with serving(client_idle_timeout=0.4) as (r, port, _server):
            r.hms.add_table(DB, T, v="1")
            await call_once(r, port, get_table(1))  # cached
            silent = await connect(r, port)
            asking = await connect(r, port)
            for seqid in range(2, 12):  # a second of hits, each within the idle timeout
                await asyncio.sleep(0.1)
                assert seqid_of(await asking.call(get_table(seqid))) == seqid
            assert session_tasks() == 0 and at_once(r) == 10
            assert await asyncio.wait_for(silent.reader.read(), 30) == b""  # (long closed)
            assert r.sample("hmsproxy_client_errors_total", reason="idle") == 1
            assert await asyncio.wait_for(asking.reader.read(), 30) == b""  # then idle too
            assert r.sample("hmsproxy_client_errors_total", reason="idle") == 2
            await until(lambda: not r.sample("hmsproxy_client_connections"), "the ends")
            for client in (silent, asking):
                await client.close()

    asyncio.run(run())


def test_taskless_connections_count_against_the_connection_limit() -> None:
    async def run() -> None:
        async with serving(max_client_connections=2) as (r, port, _server):
            r.hms.add_table(DB, T, v="1")
            await call_once(r, port, get_table(1))  # cached
            await until(lambda: not r.sample("hmsproxy_client_connections"), "its end")
            first, second = await connect(r, port), await connect(r, port)
            for seqid, client in enumerate((first, second), start=2):
                assert seqid_of(await client.call(get_table(seqid))) == seqid
            assert session_tasks() == 0 and r.sample("hmsproxy_client_connections") == 2
            third = await connect(r, port)
            refused = result_of(await third.call(get_table(4)))
            assert isinstance(refused, TApplicationException)
            assert "too many client connections (limit 2)" in str(refused.message)
            assert await asyncio.wait_for(third.reader.read(), 30) == b""
            await first.close()
            await until(lambda: r.sample("hmsproxy_client_connections") == 1, "its end")
            assert await call_once(r, port, get_table(5)) == r.hms.answer(
                "get_table", 5, dbname=DB, tbl_name=T
            )
            for client in (second, third):
                await client.close()

    asyncio.run(run())


def test_a_stop_closes_taskless_connections_at_once() -> None:
    async def run() -> None:
        async with serving() as (r, port, server):
            r.hms.add_table(DB, T, v="1")
            await call_once(r, port, get_table(1))  # cached
            clients = [await connect(r, port) for _ in range(3)]
            for seqid, client in enumerate(clients, start=2):
                assert seqid_of(await client.call(get_table(seqid))) == seqid
            assert session_tasks() == 0
            # (a drain timeout the stop must not wait for: nothing is in flight)
            stopping = asyncio.create_task(server.stop(3600))
            for client in clients:
                assert await asyncio.wait_for(client.reader.read(), 30) == b""
            await asyncio.wait_for(stopping, 30)
            await until(lambda: not server._connections, "the connections' ends")
            assert not r.sample("hmsproxy_client_connections")
            for client in clients:
                await client.close()

    asyncio.run(run())


def test_a_stop_closes_connections_that_have_no_session_yet() -> None:
    """Connections negotiating SASL are served by a task from the start, with no session
    yet: a stop closes them at once (their own negotiation timeout, an hour here, would
    be the only other end) and has ended their tasks when it returns."""

    async def run() -> None:
        async with rig(
            listen="127.0.0.1:0", max_client_connections=2, client_message_timeout=3600
        ) as r:
            server = ThriftServer(r.options, r.handler, r.metrics, acceptor())
            await server.start()
            port = server.ports[0]
            negotiating = await connect(r, port)
            await negotiating.send(encode(Status.START, b"GSSAPI") + encode(Status.OK, b"AP"))
            reply = await asyncio.wait_for(negotiating.reader.read(100), 30)
            assert reply.endswith(b"AP-REP")  # (the acceptor waits for the engine's next)
            second = await connect(r, port)
            await until(lambda: server._negotiating == 2, "the second negotiating")
            stopping = asyncio.create_task(server.stop(3600))
            for client in (negotiating, second):
                assert await asyncio.wait_for(client.reader.read(), 30) == b""
            await asyncio.wait_for(stopping, 30)
            assert not server._streamed and server._negotiating == 0
            for client in (negotiating, second):
                await client.close()

    asyncio.run(run())


def test_a_stop_closes_a_connection_over_the_limit_still_waiting_to_be_refused() -> None:
    """A plain connection over the limit waits (up to 5 s) for its first call, to be told
    why it is refused: a stop closes it at once, not left to its own 5 s."""

    async def run() -> None:
        async with serving(max_client_connections=1, client_message_timeout=3600) as (
            r,
            port,
            server,
        ):
            r.hms.add_table(DB, T, v="1")
            held = await connect(r, port)
            assert seqid_of(await held.call(get_table(1))) == 1  # the one session
            over = await connect(r, port)  # nothing said: its refusal waits for a call
            await until(lambda: len(server._refusing) == 1, "its refusal waiting")
            await asyncio.wait_for(server.stop(3600), 30)
            await until(lambda: not server._refusing, "its end")  # (not left to its own 5 s)
            assert await asyncio.wait_for(over.reader.read(), 30) == b""
            assert r.sample("hmsproxy_client_errors_total", reason="connection_limit") == 1
            for client in (held, over):
                await client.close()

    asyncio.run(run())


def test_a_bug_answering_a_call_in_its_task_ends_the_connection_and_nothing_after_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A call that broke in its task is never followed by the calls the client pipelined
    behind it: a write after it could reach the metastore with the client never told."""
    from proxy.handler import CallHandler

    handle = CallHandler.handle

    async def broken(self: Any, session: Any, message: Any, *args: Any) -> Any:
        if message.header.name == "get_table":
            raise KeyError("a bug")
        return await handle(self, session, message, *args)

    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            monkeypatch.setattr(CallHandler, "handle", broken)
            client = connection()
            new = idl.module().Table(tableName=T, dbName=DB, parameters={"v": "2"})
            write = idl.encode_call("alter_table", 2, dbname=DB, tbl_name=T, new_tbl=new)
            client.feed(get_table(1) + write)  # a miss, and a write behind it
            await until(lambda: client.transport.lost, "the connection's end")
            assert "internal error serving the connection" in caplog.text
            assert client.replies() == [] and r.hms.calls["alter_table"] == 0
            await until(lambda: not r.sample("hmsproxy_client_connections"), "its end")

    asyncio.run(run())


def test_a_request_pipelined_past_what_is_kept_is_read_once_its_turn_comes() -> None:
    """Reading pauses while a call is answered and a request's worth (at most 1 MiB) is
    kept behind it; it resumes when the call is answered, and the rest is read."""

    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            slow = Slow()
            r.hms.script("get_table", slow)
            client = connection()
            client.feed(get_table(1))  # a miss, held at the metastore
            await until(lambda: r.hms.calls["get_table"] == 1, "the call at the metastore")
            padded = _padded(get_table(2), 3 << 20)
            for at in range(0, len(padded) - 1000, 1 << 16):  # behind it, as reads come
                if client.transport.reading:
                    client.feed(padded[at : at + (1 << 16)])
                else:
                    break
            assert not client.transport.reading  # (paused: 1 MiB kept)
            slow.gate.set()
            await until(lambda: len(client.replies()) == 1, "the first reply")
            assert client.transport.reading  # (resumed: its turn has come)
            client.feed(padded[at:])
            assert [seqid_of(reply) for reply in await client.replied(2)] == [1, 2]
            await client.end()

    asyncio.run(run())


def test_a_connection_over_the_limit_is_answered_from_its_calls_header() -> None:
    """Over the limit, a connection is read only for its first call's header (not a whole
    request held in memory), and told why it is refused."""

    async def run() -> None:
        async with fed(max_client_connections=1) as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            held = connection()
            held.feed(get_table(1))
            await held.replied(1)
            over = connection()
            big = _padded(get_table(2), 10 << 20)
            over.feed(big[:4096])  # its header, and the start of 10 MB
            await until(lambda: over.transport.lost, "its end")
            (reply,) = over.replies()
            refused = result_of(reply)
            assert isinstance(refused, TApplicationException)
            assert "too many client connections (limit 1)" in str(refused.message)
            assert r.sample("hmsproxy_client_errors_total", reason="connection_limit") == 1
            await held.end()

    asyncio.run(run())


def _padded(request: bytes, size: int) -> bytes:
    """``request`` with a field the IDL does not know (id 99, a string) making it ``size``
    bytes long: the metastore skips it."""
    import struct

    pad = size - len(request) - 7
    return request[:-1] + struct.pack(">bhi", 11, 99, pad) + b"x" * pad + b"\x00"


def test_a_pause_of_writing_before_the_session_holds_after_it() -> None:
    """The transport told the protocol to stop writing (a client that reads nothing)
    before its session was made: a task's writes wait for the resume all the same."""

    async def run() -> None:
        async with fed() as (r, _server, connection):
            r.hms.add_table(DB, T, v="1")
            first = connection()
            first.feed(get_table(1))  # cached
            await first.replied(1)
            await first.end()
            client = connection()
            protocol = client.transport.get_protocol()
            assert isinstance(protocol, ClientProtocol) and protocol.state is None
            protocol.pause_writing()  # (as the transport would)
            request = get_table(2)
            client.feed(request[:10])  # in parts: a task answers it
            client.feed(request[10:])
            await until(lambda: len(client.replies()) == 1, "its reply written")
            for _ in range(20):
                await asyncio.sleep(0)
            assert session_tasks() == 1  # (waiting for the transport to drain)
            protocol.resume_writing()
            await until(lambda: session_tasks() == 0, "the task's end")
            await client.end()

    asyncio.run(run())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sessions_address_for_the_log_is_made_when_written_and_holds_after_the_close(
    loop: str,
) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")

    async def run() -> None:
        async with serving() as (r, port, server):
            r.hms.add_table(DB, T, v="1")
            client = await connect(r, port)
            assert seqid_of(await client.call(get_table(1))) == 1
            (conn,) = server._connections
            assert conn.state is not None  # (a miss: its task needed one)
            peer = conn.state.peer
            assert isinstance(peer, PeerName) and peer._name is None  # (not made yet)
            host, client_port = client.writer.get_extra_info("sockname")
            await client.close()
            await until(lambda: conn.over, "the connection's end")
            assert str(peer) == f"{host}:{client_port}"

    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run())
    else:
        asyncio.run(run())


@pytest.mark.parametrize("transport", ["buffered", "framed"])
def test_a_call_answered_as_kept_needs_no_session_and_its_connection_is_counted(
    transport: str,
) -> None:
    """Trino's calls after the first hit: each connection answered by the answer kept for
    its call, with no session made; counted as a connection while open, and not after."""

    async def run() -> None:
        async with serving(client_transport=transport) as (r, port, server):
            r.hms.add_table(DB, T, v="1")
            await call_once(r, port, get_table(1))  # a miss: cached
            await call_once(r, port, get_table(2))  # a hit: its answer kept
            await until(lambda: not r.sample("hmsproxy_client_connections"), "their ends")
            await until(lambda: not server._connections, "their ends")
            for seqid in (3, 4, 5, 6):
                client = await connect(r, port)
                assert seqid_of(await client.call(get_table(seqid))) == seqid
                assert r.sample("hmsproxy_client_connections") == 1
                assert all(conn.state is None for conn in server._connections)  # (none made)
                await client.close()
                await until(lambda: not r.sample("hmsproxy_client_connections"), "its end")
            assert not server._connections
            assert r.sample("hmsproxy_requests_total", method="get_table", outcome="ok") == 6
            assert at_once(r) == 5 and r.hms.calls["get_table"] == 1

    asyncio.run(run())


def test_a_bug_answering_a_connection_with_no_session_is_logged_and_closes_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Any, data: bytes, transport: Any) -> bool:
        raise KeyError("a bug")

    async def run() -> None:
        async with serving() as (r, port, _server):
            r.hms.add_table(DB, T, v="1")
            await call_once(r, port, get_table(1))  # a miss: cached
            await call_once(r, port, get_table(2))  # a hit: its answer kept
            monkeypatch.setattr(Again, "answer", broken)
            client = await connect(r, port)
            await client.send(get_table(3))
            assert await asyncio.wait_for(client.reader.read(), 30) == b""  # closed, not hung
            assert "internal error answering at once: closing the connection" in caplog.text
            await until(lambda: not r.sample("hmsproxy_client_connections"), "its end")
            await client.close()
            monkeypatch.undo()
            assert seqid_of(await call_once(r, port, get_table(4))) == 4  # the next one

    asyncio.run(run())


async def answered_by_an_again_let_go(
    r: Rig, port: int, server: ThriftServer, monkeypatch: pytest.MonkeyPatch
) -> tuple[Client, list[bytes], tuple[float, float, float]]:
    """A connection with no session whose call t is answered again by t's answer kept for
    every connection; then t is let go for every connection (a hit on u, kept, takes its
    place) and the connection asks t twice more, answered by t's answer no longer kept. The
    connection, u's calls (seqids 2 and 7 unasked) and the counts before the hit on u."""
    from proxy.handler import known_calls
    from tests.unit.helpers import _counted

    r.hms.add_table(DB, T, v="1")
    r.hms.add_table(DB, "u", v="1")
    other = [idl.encode_call("get_table", s, dbname=DB, tbl_name="u") for s in (1, 2, 7)]
    await call_once(r, port, other[0])  # u cached
    await call_once(r, port, get_table(1))  # t cached
    await call_once(r, port, get_table(2))  # t: a hit, its answer kept
    client = await connect(r, port)
    for seqid in (3, 4):
        assert seqid_of(await client.call(get_table(seqid))) == seqid
    assert all(conn.state is None for conn in server._connections)  # (answered with none)
    r.metrics.settle()
    before = _counted(r)
    monkeypatch.setattr(known_calls, "KNOWN_CALLS", 1)
    await call_once(r, port, other[1])  # u: a hit, kept; t, the other call, goes
    for seqid in (5, 6):  # answered by t's answer, no longer kept
        assert seqid_of(await client.call(get_table(seqid))) == seqid
    return client, other, before


def test_a_connection_with_no_session_counts_what_answered_it_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It keeps what answered its last call (its calls asked again are compared with it
    # first); if that is let go for every connection meanwhile, the answers it gives after
    # are counted when the connection ends.
    from tests.unit.helpers import _counted, _until

    async def run() -> None:
        async with serving() as (r, port, server):
            client, _, before = await answered_by_an_again_let_go(r, port, server, monkeypatch)
            assert _counted(r)[1] == before[1] + 1  # (u's hit only)
            await client.close()
            await _until(lambda: _counted(r)[1] == before[1] + 3)

    asyncio.run(run())


def test_a_connection_with_no_session_counts_what_answered_it_when_it_moves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its last call's answer, let go for every connection meanwhile, answers it again; then
    # another call's answer does: the first one's answers are counted then, not lost.
    from tests.unit.helpers import _counted, _until

    async def run() -> None:
        async with serving() as (r, port, server):
            client, other, before = await answered_by_an_again_let_go(r, port, server, monkeypatch)
            assert seqid_of(await client.call(other[2])) == 7  # by u's, kept
            assert all(conn.state is None for conn in server._connections)
            assert _counted(r)[:2] == (before[0] + 3, before[1] + 3)  # (u's hit, t's two)
            await client.close()
            r.metrics.settle()
            await _until(lambda: _counted(r)[:2] == (before[0] + 4, before[1] + 4))

    asyncio.run(run())


def test_a_client_that_ends_its_side_and_reads_nothing_more_is_not_counted_open() -> None:
    """Its last reply cannot all go out (the client reads nothing more): the transport's
    close waits for that, and with it the connection's end; the connection is ended at
    once instead, neither counted open nor waited for by a stop."""

    async def run() -> None:
        async with fed() as (r, server, connection):
            r.hms.add_table(DB, T, v="1")
            client = connection()
            client.feed(get_table(1))  # a miss: cached
            await client.replied(1)
            protocol = client.transport.get_protocol()
            assert isinstance(protocol, ClientProtocol)
            held = client.transport
            held.get_write_buffer_size = lambda: 1 << 20  # type: ignore[method-assign]
            held.close = lambda: setattr(held, "closing", True)  # type: ignore[method-assign]
            assert server.connections() == 1
            assert protocol.eof_received() is False
            assert server.connections() == 0 and protocol.over
            await asyncio.wait_for(server.stop(3600), 30)  # (nothing to wait for)

    asyncio.run(run())
