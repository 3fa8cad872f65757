"""ThriftServer in process: client sessions on socket pairs, served by the real handler on
a scripted metastore (no port, no Java, no subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from thrift.Thrift import TApplicationException

from proxy import idl
from proxy.server import ThriftServer
from proxy.wire.binary import MessageType, encode_header
from tests.rig.raw import seqid_of
from tests.unit.inprocess import Rig, rig
from tests.unit.scripted_hms import Slow, message_length, result_of, split_messages, until

DB, T = "db", "t"
KEY = "hive.metastore.batch.retrieve.max"


class Peer:
    """A client connected to the server through a socket pair."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: asyncio.Task[None],
        framed: bool,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.session = session  # the server's side: ends when the session does
        self.framed = framed
        self.buffer = b""

    def wire(self, call: bytes) -> bytes:
        """``call`` as it goes on this client's transport."""
        return struct.pack(">i", len(call)) + call if self.framed else call

    async def send(self, *calls: bytes) -> None:
        self.writer.write(b"".join(self.wire(call) for call in calls))
        await self.writer.drain()

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def replies(self, n: int) -> list[bytes]:
        """The next ``n`` replies (fails if the server hangs up before)."""
        while len(self._complete()) < n:
            data = await self.reader.read(1 << 16)
            assert data, f"the server hung up after {len(self._complete())} of {n} replies"
            self.buffer += data
        got = self._complete()[:n]
        self.buffer = self.buffer[sum(len(m) + (4 if self.framed else 0) for m in got) :]
        return got

    async def until_closed(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        while data := await self.reader.read(1 << 16):
            self.buffer += data
        out, self.buffer = self.buffer, b""
        return out

    def _complete(self) -> list[bytes]:
        out, rest = [], self.buffer
        while rest:
            if self.framed:
                if len(rest) < 4 or len(rest) < 4 + struct.unpack_from(">i", rest)[0]:
                    break
                size = struct.unpack_from(">i", rest)[0]
                out.append(rest[4 : 4 + size])
                rest = rest[4 + size :]
            else:
                n = message_length(rest)
                if n is None:
                    break
                out.append(rest[:n])
                rest = rest[n:]
        return out

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        await self.session


@contextlib.asynccontextmanager
async def served(**values: Any) -> AsyncIterator[tuple[Rig, ThriftServer, list[Peer]]]:
    """A server (not listening anywhere) over the in-process handler; ``values`` are options.
    Connect clients with :func:`connect`."""
    async with rig(**values) as r:
        server = ThriftServer(r.options, r.handler, r.metrics)
        peers: list[Peer] = []
        try:
            yield r, server, peers
        finally:
            for peer in peers:
                await peer.close()
            await server.stop(0)


async def connect(server: ThriftServer, peers: list[Peer]) -> Peer:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=theirs)
    session = asyncio.create_task(server.serve_client(reader, writer))
    client_reader, client_writer = await asyncio.open_connection(sock=ours)
    peer = Peer(client_reader, client_writer, session, server.options.client_transport == "framed")
    peers.append(peer)
    return peer


def get_table(seqid: int, table: str = T) -> bytes:
    return idl.encode_call("get_table", seqid, dbname=DB, tbl_name=table)


def test_pipelined_calls_are_answered_one_at_a_time_in_order() -> None:
    async def run() -> None:
        async with served() as (r, server, peers):
            r.hms.add_table(DB, T)
            slow = Slow()
            r.hms.script("get_table", slow)
            peer = await connect(server, peers)
            await peer.send(
                get_table(1),
                idl.encode_call("getMetaConf", 2, key=KEY),
                get_table(3),  # a hit, once the first is answered
            )
            await until(lambda: r.hms.calls["get_table"] == 1)
            for _ in range(100):  # however long the first call takes,
                await asyncio.sleep(0)
                assert r.hms.calls["getMetaConf"] == 0  # the next waits for its turn
            slow.gate.set()
            replies = await peer.replies(3)
            assert [seqid_of(m) for m in replies] == [1, 2, 3]
            assert replies[0] == r.hms.answer("get_table", 1, dbname=DB, tbl_name=T)
            assert result_of(replies[1]).success == ""
            assert replies[2] == r.hms.answer("get_table", 3, dbname=DB, tbl_name=T)
            assert r.hms.calls["get_table"] == 1
            assert r.sample("hmsproxy_client_connections") == 1

    asyncio.run(run())


@pytest.mark.parametrize("client", ["buffered", "framed"])
@pytest.mark.parametrize("upstream", ["buffered", "framed"])
def test_both_transports_on_both_sides(client: str, upstream: str) -> None:
    async def run() -> None:
        async with served(client_transport=client, upstream_transport=upstream) as (
            r,
            server,
            peers,
        ):
            r.hms.add_table(DB, T)
            peer = await connect(server, peers)
            call = peer.wire(get_table(5))
            await peer.send_bytes(call[:9])  # a request may come in pieces
            for _ in range(50):  # the server reads it: not yet a call
                await asyncio.sleep(0)
                assert not r.hms.calls
            await peer.send_bytes(call[9:])
            for seqid in (6, 7):
                await peer.send(get_table(seqid))
            replies = await peer.replies(3)
            assert replies == [
                r.hms.answer("get_table", s, dbname=DB, tbl_name=T) for s in (5, 6, 7)
            ]
            assert r.hms.calls["get_table"] == 1

    asyncio.run(run())


def test_a_malformed_request_closes_only_its_connection(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        async with served() as (r, server, peers):
            r.hms.add_table(DB, T)
            bad, good = await connect(server, peers), await connect(server, peers)
            await good.send(get_table(1))
            assert len(await good.replies(1)) == 1
            # A readable header, then a field of type 99, which Thrift does not have.
            with caplog.at_level(logging.WARNING, logger="proxy.server"):
                await bad.send(encode_header("get_table", MessageType.CALL, 4) + b"\x63\x00\x01")
                (answer,) = split_messages(await bad.until_closed())
            exc = result_of(answer)
            assert isinstance(exc, TApplicationException) and seqid_of(answer) == 4
            assert exc.type == TApplicationException.PROTOCOL_ERROR
            assert "closing connection" in caplog.text
            assert r.sample("hmsproxy_client_errors_total", reason="protocol") == 1
            await bad.session
            # The other session goes on.
            await good.send(get_table(2))
            assert await good.replies(1) == [r.hms.answer("get_table", 2, dbname=DB, tbl_name=T)]
            assert r.hms.calls["get_table"] == 1

    asyncio.run(run())


def test_an_oversize_request_is_refused_before_it_is_read_whole() -> None:
    async def run() -> None:
        async with served(max_request_bytes="4KiB") as (r, server, peers):
            peer = await connect(server, peers)
            call = get_table(8, "x" * 1_000_000)
            # Only its start: the length of the name already says it is too big.
            await peer.send(call[:100])
            (answer,) = split_messages(await peer.until_closed())
            exc = result_of(answer)
            assert isinstance(exc, TApplicationException) and seqid_of(answer) == 8
            assert r.sample("hmsproxy_client_errors_total", reason="too_large") == 1
            assert r.hms.calls["get_table"] == 0

    asyncio.run(run())


def test_a_client_closing_mid_request_ends_its_session(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        async with served() as (r, server, peers):
            peer = await connect(server, peers)
            await peer.send(idl.encode_call("setMetaConf", 1, key=KEY, value="7"))
            assert len(await peer.replies(1)) == 1
            pinned = r.hms.connections[-1]
            with caplog.at_level(logging.WARNING, logger="proxy.server"):
                await peer.send(get_table(2)[:20])
                peer.writer.write_eof()  # and nothing more
                await peer.session
            assert "connection closed in the middle of a request (20 bytes received)" in (
                caplog.text
            )
            assert await peer.until_closed() == b""
            await until(lambda: pinned.closed)  # its own metastore connection went with it
            assert r.hms.calls["get_table"] == 0
            assert r.sample("hmsproxy_client_connections") == 0

    asyncio.run(run())


class _ClosedHandle:
    """A writer whose connection is gone, as uvloop reports it: write() raises RuntimeError
    ("the handler is closed"), and is_closing() may not say so yet."""

    def __init__(self, closing: bool) -> None:
        self.closing = closing

    def write(self, data: object) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return self.closing


@pytest.mark.parametrize("closing", [False, True])
def test_a_write_to_a_client_gone_is_the_clients_loss_whatever_the_loop(closing: bool) -> None:
    """Under uvloop, writing to a reset connection raises RuntimeError: it must reach the
    handler as ConnectionError (the client gone), not as an internal error."""
    from proxy.client_connection import ClientConnection
    from proxy.wire.framing import Transport

    async def run() -> None:
        client = ClientConnection(_ClosedHandle(closing), Transport.BUFFERED)  # type: ignore[arg-type]
        with pytest.raises(ConnectionResetError):
            await client.send(b"reply")
        with pytest.raises(ConnectionResetError):
            await client.send_message(b"head", memoryview(b"x" * (1 << 17)))

    asyncio.run(run())
