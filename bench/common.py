"""Shared pieces of the benchmarks: a real HMS with a wide partitioned table, raw timing."""

from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path
from typing import Any

from hmsclient.genthrift.hive_metastore import ttypes as t

from proxy.wire.framing import MessageReader, Transport
from tests.rig.hms import MetastoreServer
from tests.rig.sample import client

BENCH_DB = "bench"
WIDE_TABLE = "wide"
COLUMNS = 20


def start_metastore(data_dir: Path) -> MetastoreServer:
    """A metastore whose Derby folder persists in ``data_dir``, so data is built once."""
    server = MetastoreServer(data_dir / "hms")
    server.start()
    return server


def ensure_wide_table(server: MetastoreServer, partitions: int) -> None:
    """``bench.wide``: ``partitions`` partitions of 20 string columns each (~1.1 KB apiece)."""
    ensure_table(server, WIDE_TABLE, partitions)


def ensure_table(server: MetastoreServer, name: str, partitions: int) -> None:
    """``bench.<name>``, partitioned by ``ds`` (``p000000``, ...), with at least
    ``partitions`` partitions of 20 string columns each (~1.1 KB apiece)."""
    with client(server.host, server.port) as c:
        if BENCH_DB not in c.get_all_databases():
            c.create_database(t.Database(BENCH_DB, "", f"{server.warehouse.as_uri()}/bench.db", {}))
        cols = [t.FieldSchema(f"column_number_{i}", "string", None) for i in range(COLUMNS)]

        def sd(location: str) -> t.StorageDescriptor:
            return t.StorageDescriptor(
                cols=cols,
                location=location,
                inputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
                outputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
                compressed=False,
                numBuckets=-1,
                serdeInfo=t.SerDeInfo(
                    None, "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe", {}
                ),
                bucketCols=[],
                sortCols=[],
                parameters={},
            )

        base = f"{server.warehouse.as_uri()}/bench.db/{name}"
        if name not in c.get_all_tables(BENCH_DB):
            c.create_table(
                t.Table(
                    tableName=name,
                    dbName=BENCH_DB,
                    owner="bench",
                    sd=sd(base),
                    partitionKeys=[t.FieldSchema("ds", "string", None)],
                    parameters={},
                    tableType="EXTERNAL_TABLE",
                )
            )
        have = len(c.get_partition_names(BENCH_DB, name, -1))
        started = time.monotonic()
        for start in range(have, partitions, 1000):
            batch = [
                t.Partition(
                    values=[f"p{i:06d}"],
                    dbName=BENCH_DB,
                    tableName=name,
                    sd=sd(f"{base}/ds=p{i:06d}"),
                    parameters={"numRows": "1000"},
                )
                for i in range(start, min(start + 1000, partitions))
            ]
            c.add_partitions(batch)
            if partitions > 1000:
                print(
                    f"  {name}: added partitions up to {start + len(batch)}"
                    f" ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )


class TimedConnection:
    """A socket that sends a request and times until the last byte of its reply."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(1 << 20)

    def reply_length(self, request: bytes) -> int:
        """Send once and find the reply's length (with the proxy's own framing code)."""
        return len(reply_bytes(self, request))

    def timed(self, request: bytes, length: int) -> float:
        view = memoryview(self.buf)
        started = time.perf_counter()
        self.sock.sendall(request)
        got = 0
        while got < length:
            n = self.sock.recv_into(view)
            if n == 0:
                raise EOFError("closed")
            got += n
        return time.perf_counter() - started

    def close(self) -> None:
        self.sock.close()


class ConnectionPerCall(TimedConnection):
    """:class:`TimedConnection`'s calls, each on a connection of its own, as Trino makes
    them: timed from the connect to the reply's last byte (the close comes after)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.address = (host, port)
        self.buf = bytearray(1 << 20)

    def reply_length(self, request: bytes) -> int:
        self.sock = socket.create_connection(self.address)
        try:
            return super().reply_length(request)
        finally:
            self.sock.close()

    def timed(self, request: bytes, length: int) -> float:
        started = time.perf_counter()
        self.sock = socket.create_connection(self.address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            super().timed(request, length)  # (its own time runs from the send)
            return time.perf_counter() - started
        finally:
            self.sock.close()

    def close(self) -> None:
        pass


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


# The do-nothing servers below set no TCP_NODELAY themselves: asyncio's and uvloop's TCP
# transports set it on every accepted socket (as for the proxy, whose test holds that), and
# a second setsockopt per connection would put a system call in the floor that the proxy
# does not make.

ECHO_SERVER = """
import asyncio, sys
class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(data)
async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


REPLAY_SERVER = """
import asyncio, pickle, sys
pairs = dict(pickle.load(open(sys.argv[1], "rb")))  # request -> reply
if sys.argv[2] == "uvloop":
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
class Replay(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""
    def data_received(self, data):
        self.buf += data
        reply = pairs.get(self.buf)  # one request at a time: the whole buffer is it
        if reply is not None:
            self.buf = b""
            self.transport.write(reply)
async def main():
    server = await asyncio.get_running_loop().create_server(Replay, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


class _ServerProcess:
    """A do-nothing server script run in a process of its own, which prints its port."""

    def __init__(self, script: str, *args: str) -> None:
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class ReplayFloor(_ServerProcess):
    """The floor: a do-nothing asyncio server (in another process, on the proxy's event
    loop) that answers each known request with the reply bytes given for it. What one Python
    round trip with the same bytes costs here; a proxy hit can only add to it."""

    def __init__(self, pairs: list[tuple[bytes, bytes]], loop: str, workdir: Path) -> None:
        import pickle

        workdir.mkdir(parents=True, exist_ok=True)
        data = workdir / "replay.pickle"
        data.write_bytes(pickle.dumps(pairs))
        super().__init__(REPLAY_SERVER, str(data), loop)


RELAY_SERVER = """
import asyncio, sys
if sys.argv[3] == "uvloop":
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
host, port = sys.argv[1], int(sys.argv[2])
class Back(asyncio.Protocol):
    def __init__(self, front):
        self.front = front
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.front.write(data)
    def connection_lost(self, exc):
        self.front.close()
class Relay(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.back = None
        self.early = []
        asyncio.ensure_future(self.open())
    async def open(self):
        loop = asyncio.get_running_loop()
        back, _ = await loop.create_connection(lambda: Back(self.transport), host, port)
        self.back = back
        for data in self.early:
            back.write(data)
    def data_received(self, data):
        if self.back is None:
            self.early.append(data)
        else:
            self.back.write(data)
    def connection_lost(self, exc):
        if self.back is not None:
            self.back.close()
async def main():
    server = await asyncio.get_running_loop().create_server(Relay, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


class RelayFloor(_ServerProcess):
    """The floor of a pass-through: a do-nothing asyncio relay (in another process, on the
    proxy's event loop) that copies bytes between each client connection and one metastore
    connection of its own. What one more Python hop costs a call here; a proxy's miss can
    only add to it."""

    def __init__(self, host: str, port: int, loop: str) -> None:
        super().__init__(RELAY_SERVER, host, str(port), loop)


def reply_bytes(conn: TimedConnection, request: bytes) -> bytes:
    """The whole reply to ``request``, found with the proxy's own framing code."""
    conn.sock.sendall(request)
    reader = MessageReader(Transport.BUFFERED, 1 << 30)
    while True:
        chunk = conn.sock.recv(1 << 20)
        if not chunk:
            raise EOFError("closed")
        reader.feed(chunk)
        message = reader.next_message()
        if message is not None:
            return bytes(message.data)


def asyncio_echo_floor(runs: int = 3000) -> float:
    """p50 of a 100-byte round trip through a do-nothing asyncio echo server in another
    process on loopback: the least any Python asyncio proxy hop can cost on this machine."""
    import subprocess
    import sys

    server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            sock.sendall(b"x" * 100)
            got = 0
            while got < 100:
                got += len(sock.recv(100))
            times.append(time.perf_counter() - started)
        sock.close()
    finally:
        server.kill()
        server.wait()
    return p50(times)


def loopback_transfer_floor(size: int, runs: int = 20) -> float:
    """p50 time for this process to receive ``size`` bytes a plain socket sends at once."""
    import threading

    data = b"x" * size
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        while conn.recv(16):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    client = TimedConnection(server.getsockname()[1])
    times = [client.timed(b"go", size) for _ in range(runs)]
    client.close()
    server.close()
    return p50(times)


class CountingTransport:
    """Takes writes and counts them: the socket's part is not an in-process bench's."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: Any) -> None:
        self.writes += 1

    def writelines(self, data: Any) -> None:
        self.writes += 1

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False
