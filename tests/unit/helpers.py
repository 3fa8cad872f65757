"""Helpers shared by the unit tests, in one place: test modules import them from here, never
from one another.

* the cache's core and engine on the embedded store (test_cache_core, test_cache_engine):
  ``NAMING``, ``PLANNER``, ``read_plan``/``write_plan``, ``engine``, ``FlakyStore``,
  ``reply``, ``fill``, a cached ``get_table`` (``TABLE``, ``GET_TABLE``);
* raw Hive 4 request fields (test_hive4_requests): ``text``, ``strings``, ``request_args``;
* calls to the in-process rig (tests.unit.inprocess), to its listener on a loopback port
  and to its server fed on fake transports (test_assembled, test_server_shortcut,
  test_flight, test_again, test_taskless): ``DB``/``T``, ``by_names``, ``Asked``,
  ``listening``/``serving``, the socket ``Client``, ``connect``, ``call_once``,
  ``get_table``, ``answer_of``, ``at_once``, ``session_tasks``, ``fed``, ``answered_now``;
* changes under a cached answer and the counts after it (test_again): ``_lock``, ``_flush``,
  ``_untrusted``, ``_pending``, ``_counted``, ``_until``; a metrics-port GET (test_http);
* SASL over a scripted GSS context (test_sasl, test_sasl_edges): ``ScriptedContext``,
  ``acceptor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy import catalog, idl
from proxy.cache import locks
from proxy.cache.engine import CacheEngine, Result
from proxy.cache.keys import Naming, TableRef
from proxy.cache.plan import Bump
from proxy.cache.planner import Planner, Ttls
from proxy.cache.store import CacheUnavailable, MemoryStore
from proxy.handler import SessionState
from proxy.handler.again import Again
from proxy.handler.known_calls import KnownCall
from proxy.metrics import Metrics
from proxy.sasl.layer import Qop
from proxy.sasl.server import SaslAcceptor
from proxy.server import ThriftServer
from proxy.wire.binary import MessageType, encode_header, parse_header
from proxy.wire.framing import Message, Transport, call_without_seqid, whole_message
from tests.thrift_values import LIST, STRING, STRUCT, Value, encode
from tests.unit.fake_transport import FakeConnection
from tests.unit.inprocess import Client as Channel
from tests.unit.inprocess import Rig, message, rig
from tests.unit.scripted_hms import message_length

M = idl.module()


# -- the cache's core (test_cache_core) -------------------------------------------------------


NAMING = Naming()
PLANNER = Planner(NAMING, Ttls(), per_user=False)


def args(method: str, **values: Any) -> tuple[Any, bytes]:
    obj = idl.args_class(method)(**values)
    return obj, idl.encode(obj)


def read_plan(method: str, **values: Any):  # type: ignore[no-untyped-def]
    obj, raw = args(method, **values)
    spec = catalog.lookup(method)
    assert spec is not None
    return PLANNER.read(spec, obj, raw, None)


def write_plan(method: str, **values: Any):  # type: ignore[no-untyped-def]
    spec = catalog.lookup(method)
    assert spec is not None
    return PLANNER.write(spec, idl.args_class(method)(**values))


def bumped(plan: Any) -> set[tuple[str, str]]:
    return {(b.key, b.field) for b in plan.bumps}


# -- the engine on the embedded store (test_cache_engine) -------------------------------------


class FlakyStore(MemoryStore):
    """The embedded store, with an outage switch (what a Redis outage looks like)."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise CacheUnavailable("down")

    async def lookup(self, versions: Any, entries: Sequence[str], *, fresh: bool = False) -> Any:
        self._check()
        return await super().lookup(versions, entries, fresh=fresh)

    async def bump(self, bumps: Sequence[Bump]) -> None:
        self._check()
        await super().bump(bumps)

    async def save(self, entries: Any, touch: Sequence[str]) -> None:
        self._check()
        await super().save(entries, touch)


def engine(store: MemoryStore | None = None) -> CacheEngine:
    store = store if store is not None else MemoryStore(1 << 20)
    return CacheEngine(store, PLANNER, Metrics(), l1_bytes=1 << 20, max_entry_bytes=1 << 20)


def reply(method: str, result: Any, seqid: int = 1) -> Message:
    data = encode_header(method, MessageType.REPLY, seqid) + idl.encode(result)
    header = parse_header(data, 0, len(data))
    assert header is not None
    return Message(header, data)


TABLE = reply(
    "get_table", idl.result_class("get_table")(success=M.Table(tableName="t", dbName="db"))
)
GET_TABLE = read_plan("get_table", dbname="db", tbl_name="t")


async def fill(e: CacheEngine, message: Message) -> bytes:
    look = await e.lookup(GET_TABLE)
    assert look.result is Result.MISS
    fp = await e.fill_fingerprint(GET_TABLE, look)
    assert fp is not None
    assert await e.fill(GET_TABLE, fp, message)
    return fp


# -- Hive 4 request fields as raw bytes (test_hive4_requests) ---------------------------------


def text(value: str) -> Value:
    return Value(STRING, value.encode())


def strings(*values: str) -> Value:
    return Value(LIST, [text(v) for v in values], (STRING, 0))


def request_args(*fields: tuple[int, Value]) -> bytes:
    """The arguments of a ``_req`` call: field 1, the request struct of ``fields``."""
    return encode(Value(STRUCT, [(1, Value(STRUCT, list(fields)))]))


# -- calls to the in-process rig (test_assembled, test_server_shortcut) -----------------------


DB, T = "db", "t"


DAYS = [f"d{i:02d}" for i in range(30)]


def by_names(seqid: int, *days: str, names: list[str] | None = None) -> bytes:
    names = names if names is not None else [f"ds={d}" for d in days]
    return idl.encode_call("get_partitions_by_names", seqid, db_name=DB, tbl_name=T, names=names)


class Asked:
    """Asks a request at once (the listener's shortcut) and, if not answered so, the
    ordinary way; tells which way answered, and whether by assembly without a plan."""

    def __init__(self, r: Rig, session: SessionState | None = None) -> None:
        self.r = r
        self.session = session or SessionState("shared")

    async def __call__(self, request: bytes) -> tuple[bytes, str]:
        found = whole_message(request, Transport.BUFFERED, 1 << 20)
        assert found is not None
        out: list[bytes] = []
        hit = self.r.handler.serve_hit_now(self.session, found, out.append)
        if hit:  # (True: assembled from partitions, with no plan; else the item answered)
            return out[0], "assembled" if hit is True else "at once"
        client = Channel()
        await self.r.handler.handle(self.session, message(request), client)
        return client.reply(), "ordinary"


# -- the listener on a loopback port (test_server_shortcut, test_flight) ----------------------


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framed: bool):
        self.reader, self.writer, self.framed = reader, writer, framed
        self.buffer = b""

    def wire(self, call: bytes) -> bytes:
        return struct.pack(">i", len(call)) + call if self.framed else call

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self) -> bytes:
        while True:
            if self.framed and len(self.buffer) >= 4:
                n: int | None = 4 + struct.unpack_from(">i", self.buffer)[0]
                n = n if n is not None and len(self.buffer) >= n else None
            else:
                n = None if self.framed else message_length(self.buffer)
            if n is not None:
                message, self.buffer = self.buffer[:n], self.buffer[n:]
                return message[4:] if self.framed else message
            data = await self.reader.read(1 << 16)
            assert data, "the proxy closed the connection"
            self.buffer += data

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    async def call(self, request: bytes) -> bytes:
        await self.send(self.wire(request))
        return await self.reply()


@contextlib.asynccontextmanager
async def listening(**values: Any) -> AsyncIterator[tuple[Rig, int]]:
    """The rig and its listener's port."""
    async with serving(**values) as (r, port, _server):
        yield r, port


async def connect(r: Rig, port: int) -> Client:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return Client(reader, writer, r.options.client_transport == "framed")


async def call_once(r: Rig, port: int, request: bytes) -> bytes:
    """``request`` on a connection of its own, closed after its reply (Trino's way)."""
    client = await connect(r, port)
    try:
        return await client.call(request)
    finally:
        await client.close()


def get_table(seqid: int) -> bytes:
    return idl.encode_call("get_table", seqid, dbname=DB, tbl_name=T)


def answer_of(r: Rig, seqid: int) -> bytes:
    """The metastore's own reply to :func:`get_table`."""
    return r.hms.answer("get_table", seqid, dbname=DB, tbl_name=T)


@contextlib.asynccontextmanager
async def serving(**values: Any) -> AsyncIterator[tuple[Rig, int, ThriftServer]]:
    """:func:`listening`, with the server too."""
    async with rig(listen="127.0.0.1:0", **values) as r:
        server = ThriftServer(r.options, r.handler, r.metrics)
        await server.start()
        try:
            yield r, server.ports[0], server
        finally:
            await server.stop(0)


@contextlib.asynccontextmanager
async def fed(
    **values: Any,
) -> AsyncIterator[tuple[Rig, ThriftServer, Callable[[], FakeConnection]]]:
    """The rig's server with no listener, and a maker of client connections to it on fake
    transports (:class:`FakeConnection`), fed by the test in the pieces it chooses."""
    async with rig(**values) as r:
        server = ThriftServer(r.options, r.handler, r.metrics)
        framed = r.options.client_transport == "framed"
        ports = iter(range(40000, 50000))

        def connection() -> FakeConnection:
            return FakeConnection(server, next(ports), framed=framed)

        try:
            yield r, server, connection
        finally:
            await server.stop(0)


def at_once(r: Rig) -> float:
    """The cache hits answered with no task, from a socket callback, so far (settled)."""
    return r.sample("hmsproxy_cache_hits_at_once_total")


class Written:
    """A transport that keeps what is written to it, with nothing waiting."""

    def __init__(self) -> None:
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


def answered_now(r: Rig, session: SessionState, data: bytes) -> tuple[KnownCall, Again]:
    """Answer ``data`` (a buffered call) at once for ``session``, as a connection's first
    such call is (its plan kept by its bytes): the call kept, and a new Again to answer it
    again with (not kept with it yet: ``r.handler.known.answer_with``)."""
    found = whole_message(data, Transport.BUFFERED, 1 << 20)
    repeat = call_without_seqid(data, Transport.BUFFERED)
    assert found is not None and repeat is not None and r.handler.known is not None
    item = r.handler.serve_hit_now(session, found, lambda reply: None, repeat[0])
    assert item is not None and item is not True, "not a hit to answer at once"
    known = r.handler.known.get(session, repeat[0])
    again = r.handler.again(item, data, Transport.BUFFERED)
    assert known is not None and again is not None
    return known, again


def session_tasks() -> int:
    """The calls being answered by a task of their own, now (see proxy.conn.protocol)."""
    return sum(t.get_coro().__qualname__ == "ClientProtocol._call" for t in asyncio.all_tasks())  # type: ignore[union-attr]


# -- changes under a cached answer, and the counts after it (test_again) ----------------------


async def _lock(r: Rig, field: str = "table") -> None:
    """An exclusive lock on the table, fencing its versions' ``field``."""
    assert r.cache is not None
    key = r.cache.naming.versions(TableRef.of(DB, T).tag)
    await r.store.mark([(key, locks.LOCK_PREFIX + "x:" + field)], time.time() + 60)


async def _flush(r: Rig) -> None:
    await r.store.flush()


async def _untrusted(r: Rig) -> None:
    r.store.standing.track(-math.inf)  # (a shared store's invalidation stream lagging)


async def _pending(r: Rig) -> None:
    """An invalidation of the table the store did not take (kept pending, applied by the
    next look-up or the retry)."""
    assert r.cache is not None
    key = r.cache.naming.versions(TableRef.of(DB, T).tag)
    r.cache.invalidations.defer((Bump(key, "table", "table"),))


def _counted(r: Rig) -> tuple[float, float, float]:
    """get_table's ok replies, hits and cached durations as the registry holds them now,
    nothing settled first (what a scrape that did not settle would show)."""
    get = r.metrics.registry.get_sample_value
    cached = {"method": "get_table", "source": "cache"}
    return (
        get("hmsproxy_requests_total", {"method": "get_table", "outcome": "ok"}) or 0,
        get("hmsproxy_cache_lookups_total", {"method": "get_table", "result": "hit"}) or 0,
        get("hmsproxy_request_duration_seconds_count", cached) or 0,
    )


async def _until(done: Callable[[], bool]) -> None:
    """Wait (up to 5 s) for ``done``, then assert it: what a session counts after its
    reply went out, or once its connection closed, is counted when its task next runs."""
    for _ in range(500):
        if done():
            break
        await asyncio.sleep(0.01)
    assert done()


# -- the metrics port (test_http) -------------------------------------------------------------


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: proxy\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


# -- SASL over a scripted GSS context (test_sasl, test_sasl_edges) ----------------------------


@dataclass
class Wrapped:
    message: bytes
    encrypted: bool = False


class ScriptedContext:
    """A GSS context that completes after ``legs`` steps; wrap marks the bytes (and whether
    encrypted) so the peer's unwrap can check them."""

    def __init__(self, legs: int, out: list[bytes | None]) -> None:
        self.legs = legs
        self.out = out
        self.steps: list[bytes | None] = []

    @property
    def complete(self) -> bool:
        return len(self.steps) >= self.legs

    def step(self, token: bytes | None = None) -> bytes | None:
        self.steps.append(token)
        return self.out[len(self.steps) - 1]

    def wrap(self, message: bytes, encrypt: bool) -> Wrapped:
        return Wrapped((b"E" if encrypt else b"S") + message, encrypt)

    def unwrap(self, message: bytes) -> Wrapped:
        if message[:1] not in (b"E", b"S"):
            raise ValueError("bad token")
        return Wrapped(message[1:], message[:1] == b"E")


REALMS = frozenset({"R"})


class Login:
    def __init__(self, legs: int = 1) -> None:
        self.legs = legs

    def acceptor(self) -> Any:
        context = ScriptedContext(self.legs, [b"AP-REP"])
        context.initiator_name = "alice/host@R"  # type: ignore[attr-defined]
        return context


def acceptor(relay: Any = None) -> SaslAcceptor:
    return SaslAcceptor(Login(), [Qop.AUTH], REALMS, 1 << 20, relay)  # type: ignore[arg-type]
