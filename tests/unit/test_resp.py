"""proxy.cache.resp: the lean look-up connection, over a real socket pair."""

from __future__ import annotations

import asyncio
import gc
import socket
import time

import pytest

from proxy.cache import resp


async def _connected() -> tuple[resp.RespConnection, socket.socket]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(resp.RespConnection, sock=ours)
    return conn, theirs


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
