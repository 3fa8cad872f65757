"""proxy.cache.resp: the reply readers (hiredis's and the pure one, held to the same
results), cluster slots, and the lean look-up connection over a real socket pair."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from proxy.cache import resp

READERS: dict[str, Callable[[], resp.Reader]] = {"pure": resp.PureReader, "hiredis": resp.reader}


@pytest.fixture(params=sorted(READERS))
def new_reader(request: pytest.FixtureRequest) -> Callable[[], resp.Reader]:
    if request.param == "hiredis" and resp.hiredis is None:
        pytest.skip("hiredis is not installed")
    return READERS[str(request.param)]


def _plain(value: Any) -> Any:
    """A reply with its error values comparable (an exception is equal only to itself)."""
    if isinstance(value, resp.RespError):
        return ("error", str(value))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read(reader: resp.Reader, *pieces: bytes) -> list[Any]:
    """Feed ``pieces`` one by one, taking every reply as soon as it is whole."""
    out = []
    for piece in pieces:
        reader.feed(piece)
        while (value := reader.gets()) is not resp.INCOMPLETE:
            out.append(_plain(value))
    return out


# (wire bytes, the reply): every kind of RESP2 reply, and the awkward ones.
REPLIES: list[tuple[bytes, Any]] = [
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # a CRLF inside a value is data
    (b":42\r\n", 42),
    (b":-7\r\n", -7),
    (b"+OK\r\n", b"OK"),
    (b"-ERR unknown command\r\n", ("error", "ERR unknown command")),
    (b"-MOVED 3999 127.0.0.1:6381\r\n", ("error", "MOVED 3999 127.0.0.1:6381")),
    (b"*-1\r\n", None),
    (b"*0\r\n", []),
    (b"*3\r\n$1\r\na\r\n$-1\r\n:1\r\n", [b"a", None, 1]),
    (
        b"*3\r\n*2\r\n$1\r\nx\r\n*0\r\n-ERR in here\r\n*1\r\n*1\r\n$-1\r\n",
        [[b"x", []], ("error", "ERR in here"), [[None]]],
    ),
]


@pytest.mark.parametrize(("wire", "expected"), REPLIES)
def test_every_kind_of_reply_split_at_every_byte(
    new_reader: Callable[[], resp.Reader], wire: bytes, expected: Any
) -> None:
    assert _read(new_reader(), wire) == [expected]
    assert _read(new_reader(), *(wire[i : i + 1] for i in range(len(wire)))) == [expected]
    for cut in range(1, len(wire)):
        reader = new_reader()
        assert _read(reader, wire[:cut]) == []
        assert _read(reader, wire[cut:]) == [expected]


def test_replies_back_to_back_come_out_in_order(new_reader: Callable[[], resp.Reader]) -> None:
    wire = b"".join(w for w, _ in REPLIES)
    expected = [e for _, e in REPLIES]
    assert _read(new_reader(), wire) == expected
    for cut in range(1, len(wire), 7):
        assert _read(new_reader(), wire[:cut], wire[cut:]) == expected


def test_a_reply_of_megabytes_in_64_kib_pieces(new_reader: Callable[[], resp.Reader]) -> None:
    # What a hit on a large table reads: an MGET of many entries, one of them large.
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB
    entries = [b"partition %d" % i for i in range(20_000)]
    values = [big, *entries, None]
    wire = b"*%d\r\n" % len(values)
    wire += b"".join(b"$%d\r\n%s\r\n" % (len(v), v) if v else b"$-1\r\n" for v in values)
    wire += b":1\r\n"  # the next reply, in the same last piece
    size = 64 * 1024
    reader = new_reader()
    assert _read(reader, *(wire[i : i + size] for i in range(0, len(wire), size))) == [values, 1]
    [first] = _read(new_reader(), wire[: len(wire) - 4])
    assert type(first[0]) is bytes  # values are bytes, whichever reader made them


@pytest.mark.parametrize("wire", [b"?1\r\n", b"*x\r\n", b"$x\r\n", b":1x\r\n"])
def test_bytes_that_are_not_resp_are_a_disconnection(
    new_reader: Callable[[], resp.Reader], wire: bytes
) -> None:
    reader = new_reader()
    reader.feed(wire)
    with pytest.raises(resp.Disconnected):
        reader.gets()


def test_the_connection_reads_with_hiredis_when_it_is_installed() -> None:
    if resp.hiredis is None:
        assert isinstance(resp.reader(), resp.PureReader)
    else:
        assert not isinstance(resp.reader(), resp.PureReader)


@pytest.mark.parametrize(
    ("key", "slot"),
    [
        (b"foo", 12182),
        ("foo", 12182),
        (b"123456789", 12739),  # CRC16/XMODEM's check value, 0x31C3
        ("{user1000}.following", resp.key_slot("user1000")),
        ("{user1000}.followers", resp.key_slot("user1000")),
        ("foo{}{bar}", resp.key_slot(b"foo{}{bar}")),  # an empty tag: the whole key
        ("foo{{bar}}zap", resp.key_slot("{bar")),  # the first { to the first } after it
        ("foo{bar}{zap}", resp.key_slot("bar")),
    ],
)
def test_keys_hash_to_the_slots_redis_cluster_gives_them(key: str | bytes, slot: int) -> None:
    assert resp.key_slot(key) == slot
    other = key.encode() if isinstance(key, str) else key.decode()
    assert resp.key_slot(other) == slot  # str and bytes alike


async def _connected(
    new_reader: Callable[[], resp.Reader] = resp.reader,
) -> tuple[resp.RespConnection, socket.socket]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: resp.RespConnection(new_reader), sock=ours)
    return conn, theirs


def test_replies_reach_their_callers_in_order_errors_as_values(
    new_reader: Callable[[], resp.Reader],
) -> None:
    async def main() -> list[Any]:
        conn, server = await _connected(new_reader)
        futures = conn.send([("GET", "a"), ("HMGET", "h", "x", "y"), ("GET", "c")])
        await asyncio.sleep(0)  # the commands leave
        wire = b"$1\r\nx\r\n*2\r\n:1\r\n$-1\r\n-WRONGTYPE not a string\r\n"
        for i in range(0, len(wire), 3):  # in pieces, as a busy socket delivers them
            server.sendall(wire[i : i + 3])
            await asyncio.sleep(0)
        try:
            return [_plain(r) for r in await asyncio.gather(*futures)]
        finally:
            conn.close()
            server.close()

    assert asyncio.run(main()) == [b"x", [1, None], ("error", "WRONGTYPE not a string")]


def test_garbage_from_the_server_fails_the_waiting_callers_and_closes(
    new_reader: Callable[[], resp.Reader],
) -> None:
    async def main() -> None:
        conn, server = await _connected(new_reader)
        futures = conn.send([("GET", "a"), ("GET", "b")])
        await asyncio.sleep(0)
        server.sendall(b"$1\r\nx\r\n!oops\r\n")
        try:
            assert await futures[0] == b"x"
            with pytest.raises(resp.Disconnected):
                await futures[1]
            assert conn.closed
        finally:
            conn.close()
            server.close()

    asyncio.run(main())


def test_replies_that_came_while_the_process_was_not_scheduled_are_not_a_timeout() -> None:
    async def main() -> list[object]:
        conn, server = await _connected()
        futures = conn.send([("GET", "a"), ("GET", "b")])
        await asyncio.sleep(0)  # the commands leave

        def stall() -> None:
            # Once the caller waits, the replies arrive while the loop is stalled past the
            # deadline (the process was not scheduled).
            server.sendall(b"$1\r\nx\r\n$-1\r\n")
            time.sleep(0.2)

        asyncio.get_running_loop().call_soon(stall)
        try:
            return await resp.replies_within(futures, 0.05)
        finally:
            conn.close()
            server.close()

    assert asyncio.run(main()) == [b"x", None]


def test_replies_that_do_not_come_are_a_timeout_and_nothing_is_logged_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        conn, server = await _connected()
        futures = conn.send([("GET", "a"), ("GET", "b"), ("GET", "c")])
        try:
            with pytest.raises(TimeoutError):
                await resp.replies_within(futures, 0.05)
            server.sendall(b"$1\r\nx\r\n")  # late: dropped, not given to anyone
            await asyncio.sleep(0.05)
            server.close()  # the connection fails with the other futures unread
            await asyncio.sleep(0.05)
            assert conn.closed
        finally:
            conn.close()

    asyncio.run(main())
    gc.collect()
    assert "never retrieved" not in caplog.text
