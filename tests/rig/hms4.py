"""HMS 4.0.1, simulated in front of the real HMS 2.3.10: the methods 4.0.1 removed are refused.

HMS 4.0.1 removed ``get_table`` and ``get_table_objects_by_name`` (HIVE-26537). Its Thrift
processor answers a call of a method it lacks by skipping the arguments and writing an
``EXCEPTION`` message under the call's name and seqid, carrying ``TApplicationException
{1: "Invalid method name: '<name>'", 2: UNKNOWN_METHOD}``; the connection stays open. This
relay does exactly that for those two names and forwards every other byte both ways
untouched, so everything else is the real 2.3.10's answer (which serves the ``_req`` forms
the bridge uses, with the same exception ids as 4.0.1).

Messages are found with Apache Thrift's own protocol (``TBinaryProtocol.skip``), not with the
proxy's scanner. Buffered transport only, no SASL; one call at a time per connection, as
every metastore client makes them.

What it cannot show (a real 4.x metastore is needed): 4.x ``Table`` contents (fields 16 to
28), ``isStatsCompliant``, column statistics, dictionaries, what 4.x does with ``@cat#db``
in ``dbName``, 4.x-only methods' behaviour, 4.x events, HTTP transport and performance.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections import Counter

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType, TType

from tests.rig.ports import free_port
from tests.rig.raw import Cursor

REMOVED = ("get_table", "get_table_objects_by_name")
UNKNOWN_METHOD = 1


def _next_call(data: bytes) -> tuple[str, int, int, int] | None:
    """(name, type, seqid, length) of the message ``data`` starts with; None: incomplete."""
    cursor = Cursor(data)
    proto = TBinaryProtocol(cursor, strictRead=False)
    try:
        name, mtype, seqid = proto.readMessageBegin()
        proto.skip(TType.STRUCT)
    except EOFError:
        return None
    return name, mtype, seqid, cursor.pos


def refusal(name: str, seqid: int) -> bytes:
    """HMS 4.0.1's answer to a call of a method it does not have, byte for byte."""
    raw_name = name.encode()
    text = f"Invalid method name: '{name}'".encode()
    return b"".join(
        (
            struct.pack(">Ii", 0x80010000 | TMessageType.EXCEPTION, len(raw_name)),
            raw_name,
            struct.pack(">i", seqid),
            struct.pack(">bhi", TType.STRING, 1, len(text)),
            text,
            struct.pack(">bhi", TType.I32, 2, UNKNOWN_METHOD),
            b"\x00",
        )
    )


# HMS 4.0.1's answer to get_table with seqid 7, as hms-versions.md gives it.
REFUSAL_7 = (
    b"\x80\x01\x00\x03\x00\x00\x00\x09get_table\x00\x00\x00\x07"
    b"\x0b\x00\x01\x00\x00\x00\x20Invalid method name: 'get_table'"
    b"\x08\x00\x02\x00\x00\x00\x01\x00"
)


class Hms401:
    """A relay on a free port that answers like HMS 4.0.1 (see module doc)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.refused: Counter[str] = Counter()  # calls answered UNKNOWN_METHOD, by method
        self.forwarded: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    def __enter__(self) -> Hms401:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", self.port), self._loop
        ).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for _ in range(3):  # (closed transports let their sockets go a turn later)
                await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)  # (closed by __exit__ even while this connects)
        hms_r, hms_w = await asyncio.open_connection(*self.target)
        self._writers.add(hms_w)
        back = asyncio.ensure_future(self._pump(hms_r, client_w))
        try:
            buf = b""
            while True:
                found = _next_call(buf) if buf else None
                if found is None:
                    data = await client_r.read(1 << 16)
                    if not data:
                        return
                    buf += data
                    continue
                name, mtype, seqid, length = found
                call, buf = buf[:length], buf[length:]
                if name in REMOVED and mtype == TMessageType.CALL:
                    self.refused[name] += 1
                    client_w.write(refusal(name, seqid))
                    await client_w.drain()
                else:
                    self.forwarded[name] += 1
                    hms_w.write(call)
                    await hms_w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            back.cancel()
            for writer in (client_w, hms_w):
                writer.close()
                self._writers.discard(writer)
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()


def main() -> None:
    """``python -m tests.rig.hms4 HOST PORT``: the simulation in a process of its own (for
    benchmarks, whose timing must not share an interpreter with it); prints its port."""
    import sys
    import time

    with Hms401(sys.argv[1], int(sys.argv[2])) as relay:
        print(f"PORT {relay.port}", flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
