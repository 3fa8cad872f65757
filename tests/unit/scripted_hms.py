"""A scripted fake Hive Metastore on in-memory streams, for driving the proxy in process.

:class:`ScriptedHMS` is an :data:`~proxy.upstream.Opener`: ``UpstreamPool(options, metrics,
opener=hms.open)`` gets, for every connection it opens, one end of a ``socket.socketpair()``
whose other end this fake serves. No port, no Java, no subprocess.

The fake finds message boundaries with the Apache ``thrift`` package (``TBinaryProtocol.skip``,
as :mod:`tests.rig.raw` does), not with the proxy's scanner, so a mistake there cannot hide
itself; it decodes arguments and encodes results with the IDL (``proxy.idl``). It answers
from :attr:`~ScriptedHMS.tables` and :attr:`~ScriptedHMS.partitions`, counts calls per method
and per connection, and records each connection's ``set_ugi``. Like the real HMS, it keeps
the first ``set_ugi`` of a connection for good (another one is refused), keeps
``setMetaConf`` per connection, and answers methods it does not serve with a
``TApplicationException`` ``UNKNOWN_METHOD``; :attr:`~ScriptedHMS.removed` names methods it
answers so although it knows them (HMS 4.0.1 removed ``get_table``).

The next calls of a method can be scripted (:meth:`~ScriptedHMS.script`): :data:`HANG` (read
the call, never answer), :data:`HANG_UP` (close without a byte), :data:`HALF_REPLY` (half the
reply's bytes, then close), :class:`Slow` (answer once an event is set), :class:`Split` (half
the reply, then the rest once an event is set), :class:`Trickle` (the reply in pieces, a gap
before each), :data:`UNKNOWN` (``UNKNOWN_METHOD``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
import struct
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType
from thrift.transport.TTransport import TMemoryBuffer

from proxy import idl
from proxy.config import Endpoint
from proxy.upstream import streams
from tests.rig.raw import Cursor, message_length
from tests.rig.sample import storage_descriptor

M = idl.module()
# Bound now: a test of old code may replace asyncio.open_connection with this fake's opener.
_open_connection = asyncio.open_connection
_FRAME = struct.Struct(">i")


# -- messages, read with Apache Thrift -------------------------------------------------------


@dataclass(frozen=True)
class Header:
    name: str
    type: int
    seqid: int
    length: int  # of the header


def header_of(message: bytes) -> Header:
    cursor = Cursor(message)
    name, mtype, seqid = TBinaryProtocol(cursor, strictRead=False).readMessageBegin()
    return Header(name, mtype, seqid, cursor.pos)


def split_messages(data: bytes, *, framed: bool = False) -> list[bytes]:
    """The messages ``data`` holds (unframed), all of them complete, nothing after them."""
    out = []
    while data:
        if framed:
            assert len(data) >= 4, f"{len(data)} bytes left, not a frame"
            (size,) = _FRAME.unpack_from(data)
            assert len(data) >= 4 + size, "incomplete frame"
            out.append(data[4 : 4 + size])
            data = data[4 + size :]
            continue
        n = message_length(data)
        assert n is not None, f"{len(data)} bytes left that are not a whole message"
        out.append(data[:n])
        data = data[n:]
    return out


def result_of(message: bytes) -> Any:
    """The decoded result struct of a REPLY (IDL), or the ``TApplicationException``."""
    h = header_of(message)
    if h.type == TMessageType.EXCEPTION:
        exc = TApplicationException()
        exc.read(TBinaryProtocol(TMemoryBuffer(message[h.length :])))
        return exc
    assert h.type == TMessageType.REPLY, h
    return idl.decode_result(h.name, message[h.length :])


def reply_message(method: str, seqid: int, result: Any) -> bytes:
    """A REPLY as a Java processor writes it (strict header, then the result struct)."""
    return _header(method, TMessageType.REPLY, seqid) + idl.encode(result)


def application_exception(method: str, seqid: int, kind: int, text: str) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.writeMessageBegin(method, TMessageType.EXCEPTION, seqid)
    TApplicationException(kind, text).write(proto)
    proto.writeMessageEnd()
    return bytes(buf.getvalue())


def _header(name: str, mtype: int, seqid: int) -> bytes:
    raw = name.encode()
    return struct.pack(">Ii", 0x80010000 | mtype, len(raw)) + raw + struct.pack(">i", seqid)


# -- objects ---------------------------------------------------------------------------------


def table(db: str, name: str, **parameters: str) -> Any:
    return M.Table(
        tableName=name,
        dbName=db,
        owner="hive",
        createTime=1_700_000_000,
        sd=storage_descriptor(f"file:/warehouse/{db}/{name}", types=M),
        partitionKeys=[M.FieldSchema("ds", "string", None)],
        parameters=dict(parameters),
        tableType="MANAGED_TABLE",
    )


def partition(db: str, name: str, ds: str) -> Any:
    return M.Partition(
        values=[ds],
        dbName=db,
        tableName=name,
        createTime=1_700_000_000,
        sd=storage_descriptor(f"file:/warehouse/{db}/{name}/ds={ds}", types=M),
        parameters={"numFiles": "1"},
    )


# -- the script ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    kind: str


HANG = Action("hang")  # read the call, never answer (until the connection is closed)
HANG_UP = Action("hang up")  # read the call, close the connection without a byte
HALF_REPLY = Action("half reply")  # send half the reply's bytes, then close
UNKNOWN = Action("unknown")  # TApplicationException UNKNOWN_METHOD


@dataclass(frozen=True)
class Slow(Action):
    """Answer once ``gate`` is set."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    kind: str = "slow"


@dataclass(frozen=True)
class Split(Action):
    """Send half the reply, then the rest once ``gate`` is set."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    kind: str = "split"


@dataclass(frozen=True)
class Trickle(Action):
    """Send the reply in ``parts`` pieces, each ``gap`` seconds after the one before (the
    first too)."""

    parts: int = 3
    gap: float = 0.1
    kind: str = "trickle"


@dataclass(frozen=True)
class Call:
    """One call the fake received."""

    conn: int  # the connection's number, from 1 in the order they were opened
    method: str
    seqid: int
    args: Any  # decoded with the IDL (None for a method it does not know)
    user: str | None  # the set_ugi user the connection runs as
    conf: dict[str, str]  # the connection's setMetaConf values when the call came
    data: bytes  # the request as it came, header and arguments


@dataclass(eq=False)
class State:
    """What a connection's calls have set (the answers read and change it)."""

    user: str | None = None  # the set_ugi user it runs as
    ugi: list[tuple[str, list[str]]] = field(default_factory=list)  # every set_ugi it got
    conf: dict[str, str] = field(default_factory=dict)  # its setMetaConf values


@dataclass(eq=False)
class Connection(State):
    """The fake's side of one connection the proxy opened."""

    number: int = 0
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    proxy_side: asyncio.StreamWriter | None = None  # what the opener handed to the proxy
    calls: Counter[str] = field(default_factory=Counter)
    closed: bool = False  # by either side
    task: asyncio.Task[None] | None = None

    def close(self) -> None:
        """Hang up on the proxy (an idle connection the HMS drops, say)."""
        self.closed = True
        assert self.writer is not None
        self.writer.close()


Answer = Callable[[State, Any], Any]  # (the connection's state, args) -> result struct


class ScriptedHMS:
    def __init__(self, *, framed: bool = False, removed: tuple[str, ...] = ()) -> None:
        self.framed = framed
        self.removed = set(removed)  # answered UNKNOWN_METHOD, as HMS 4.0.1 does get_table
        self.tables: dict[tuple[str, str], Any] = {}
        self.partitions: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
        self.calls: Counter[str] = Counter()
        self.received: list[Call] = []
        self.connections: list[Connection] = []
        self.endpoints: list[Endpoint] = []  # what each open() was asked for
        self.answers: dict[str, Answer] = {
            "set_ugi": self._set_ugi,
            "setMetaConf": self._set_meta_conf,
            "getMetaConf": self._get_meta_conf,
            "get_table": self._get_table,
            "get_table_req": self._get_table_req,
            "get_table_objects_by_name": self._get_table_objects_by_name,
            "get_table_objects_by_name_req": self._get_table_objects_by_name_req,
            "alter_table": self._alter_table,
            "get_all_tables": self._get_all_tables,
            "get_partitions_by_names": self._get_partitions_by_names,
            "get_partitions_by_names_req": self._get_partitions_by_names_req,
            "getStatus": lambda conn, args: idl.result_class("getStatus")(success=2),
            "get_partitions": self._get_partitions,
            "get_partition": self._get_partition,
            "get_partition_names": self._get_partition_names,
            "get_partitions_by_filter": self._get_partitions_by_filter,
            "get_num_partitions_by_filter": self._get_num_partitions_by_filter,
            "add_partition": self._add_partition,
            "drop_partition": self._drop_partition,
            "lock": self._lock,
            "check_lock": self._check_lock,
            "unlock": lambda conn, args: idl.result_class("unlock")(),
        }
        self.locks = 0  # lock ids given out
        # A table names who asked for it (a parameter): a reply kept for one user and
        # served to another then shows (tests/unit/differential.py).
        self.tell_user = False
        # Replies given as bytes, by method: seqid -> the whole reply message.
        self.raw_replies: dict[str, Callable[[int], bytes]] = {}
        self._script: dict[str, deque[Action]] = defaultdict(deque)

    # -- set-up --------------------------------------------------------------------------

    def add_table(self, db: str, name: str, *partitions: str, **parameters: str) -> Any:
        self.tables[(db, name)] = table(db, name, **parameters)
        for ds in partitions:
            self.partitions[(db, name)][f"ds={ds}"] = partition(db, name, ds)
        return self.tables[(db, name)]

    def script(self, method: str, *actions: Action) -> None:
        """What the next calls of ``method`` get, in order (then: answers as usual)."""
        self._script[method].extend(actions)

    def answer(self, method: str, seqid: int, state: State | None = None, **args: Any) -> bytes:
        """The reply the fake gives that call now, on a connection in ``state`` (a new one):
        what the proxy must relay byte for byte."""
        call = idl.args_class(method)(**args)
        return self._reply(state or State(), method, seqid, call)

    # -- the opener ----------------------------------------------------------------------

    async def open(self, endpoint: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """One new connection: the proxy's end of a socket pair, the fake serving the other."""
        ours, theirs = socket.socketpair()
        reader, writer = await _open_connection(sock=ours)
        # The proxy's end as its pool opens one (calls it only forwards answered as bytes
        # arrive: proxy.handler.flight).
        proxy_reader, proxy_writer = await streams.open_connection(sock=theirs, limit=1 << 16)
        conn = Connection(
            number=len(self.connections) + 1,
            reader=reader,
            writer=writer,
            proxy_side=proxy_writer,
        )
        self.connections.append(conn)
        self.endpoints.append(endpoint)
        conn.task = asyncio.get_running_loop().create_task(self._serve(conn))
        return proxy_reader, proxy_writer

    async def close(self) -> None:
        """Close every connection, both ends, and stop serving (end of a test)."""
        for conn in self.connections:
            conn.close()
            assert conn.proxy_side is not None
            conn.proxy_side.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in self.connections:
            for writer in (conn.writer, conn.proxy_side):
                assert writer is not None
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    @property
    def open_connections(self) -> list[Connection]:
        return [c for c in self.connections if not c.closed]

    # -- serving -------------------------------------------------------------------------

    async def _serve(self, conn: Connection) -> None:
        assert conn.reader is not None
        buf = b""
        try:
            while not conn.closed:
                request, buf = self._next_request(buf)
                if request is None:
                    data = await conn.reader.read(1 << 16)
                    if not data:
                        break
                    buf += data
                    continue
                await self._handle(conn, request)
        except ConnectionError:
            pass
        finally:
            conn.closed = True
            assert conn.writer is not None
            conn.writer.close()

    def _next_request(self, buf: bytes) -> tuple[bytes | None, bytes]:
        if self.framed:
            if len(buf) < 4:
                return None, buf
            (size,) = _FRAME.unpack_from(buf)
            if len(buf) < 4 + size:
                return None, buf
            return buf[4 : 4 + size], buf[4 + size :]
        n = message_length(buf) if buf else None
        if n is None:
            return None, buf
        return buf[:n], buf[n:]

    async def _handle(self, conn: Connection, request: bytes) -> None:
        assert conn.reader is not None and conn.writer is not None
        h = header_of(request)
        body = request[h.length :]
        try:
            args = idl.decode_args(h.name, body)
        except KeyError:
            args = None
        self.calls[h.name] += 1
        conn.calls[h.name] += 1
        self.received.append(
            Call(conn.number, h.name, h.seqid, args, conn.user, dict(conn.conf), request)
        )
        script = self._script.get(h.name)
        action = script.popleft() if script else None
        if action is HANG:
            while await conn.reader.read(1 << 16):  # until the proxy gives up on it
                pass
            conn.closed = True
            return
        if action is HANG_UP:
            conn.close()
            return
        if h.name in idl.oneway_methods():
            return
        known = h.name in self.answers or h.name in self.raw_replies
        if action is UNKNOWN or args is None or not known or h.name in self.removed:
            reply = application_exception(
                h.name,
                h.seqid,
                TApplicationException.UNKNOWN_METHOD,
                f"Invalid method name: '{h.name}'",
            )
        else:
            reply = self._reply(conn, h.name, h.seqid, args)
        wire = _FRAME.pack(len(reply)) + reply if self.framed else reply
        if isinstance(action, Slow):
            await action.gate.wait()
        if isinstance(action, Trickle):
            size = -(-len(wire) // action.parts)
            for at in range(0, len(wire), size):
                await asyncio.sleep(action.gap)
                conn.writer.write(wire[at : at + size])
                await conn.writer.drain()
            return
        if action is HALF_REPLY or isinstance(action, Split):
            conn.writer.write(wire[: len(wire) // 2])
            await conn.writer.drain()
            if action is HALF_REPLY:
                conn.close()
                return
            assert isinstance(action, Split)
            await action.gate.wait()
            wire = wire[len(wire) // 2 :]
        if not conn.closed:
            conn.writer.write(wire)
            await conn.writer.drain()

    def _reply(self, conn: State, method: str, seqid: int, args: Any) -> bytes:
        if method in self.raw_replies:
            return self.raw_replies[method](seqid)
        return reply_message(method, seqid, self.answers[method](conn, args))

    # -- answers -------------------------------------------------------------------------

    def _set_ugi(self, conn: State, args: Any) -> Any:
        result = idl.result_class("set_ugi")
        conn.ugi.append((args.user_name, list(args.group_names or [])))
        if conn.user is not None and conn.user != args.user_name:
            return result(o1=M.MetaException(f"connection already runs as {conn.user}"))
        conn.user = args.user_name
        return result(success=list(args.group_names or []))

    def _set_meta_conf(self, conn: State, args: Any) -> Any:
        conn.conf[args.key] = args.value
        return idl.result_class("setMetaConf")()

    def _get_meta_conf(self, conn: State, args: Any) -> Any:
        return idl.result_class("getMetaConf")(success=conn.conf.get(args.key, ""))

    def _table_for(self, conn: State, db: str, name: str) -> Any:
        found = self.tables.get((db, name))
        if found is None or not self.tell_user:
            return found
        told = copy.copy(found)
        told.parameters = {**(found.parameters or {}), "asked_by": str(conn.user)}
        return told

    def _get_table(self, conn: State, args: Any) -> Any:
        result = idl.result_class("get_table")
        found = self._table_for(conn, args.dbname, args.tbl_name)
        if found is None:
            return result(o2=M.NoSuchObjectException(f"{args.dbname}.{args.tbl_name}"))
        return result(success=found)

    def _get_table_req(self, conn: State, args: Any) -> Any:
        result = idl.result_class("get_table_req")
        req = args.req
        found = self._table_for(conn, req.dbName, req.tblName)
        if found is None:
            return result(o2=M.NoSuchObjectException(f"{req.dbName}.{req.tblName}"))
        return result(success=M.GetTableResult(table=found))

    def _tables_named(self, db: str, names: list[str] | None) -> list[Any]:
        # Like the HMS: the tables that exist, missing names left out.
        return [self.tables[(db, n)] for n in names or () if (db, n) in self.tables]

    def _get_table_objects_by_name(self, conn: State, args: Any) -> Any:
        found = self._tables_named(args.dbname, args.tbl_names)
        return idl.result_class("get_table_objects_by_name")(success=found)

    def _get_table_objects_by_name_req(self, conn: State, args: Any) -> Any:
        found = self._tables_named(args.req.dbName, args.req.tblNames)
        result = idl.result_class("get_table_objects_by_name_req")
        return result(success=M.GetTablesResult(tables=found))

    def _alter_table(self, conn: State, args: Any) -> Any:
        key = (args.dbname, args.tbl_name)
        if key not in self.tables:
            return idl.result_class("alter_table")(o1=M.InvalidOperationException("no table"))
        self.tables[key] = args.new_tbl
        return idl.result_class("alter_table")()

    def _get_all_tables(self, conn: State, args: Any) -> Any:
        names = sorted(t for d, t in self.tables if d == args.db_name)
        return idl.result_class("get_all_tables")(success=names)

    def _get_partitions_by_names(self, conn: State, args: Any) -> Any:
        # Like the HMS: the partitions it has, in partition-name order.
        have = self.partitions.get((args.db_name, args.tbl_name), {})
        found = [have[n] for n in sorted(set(args.names or [])) if n in have]
        return idl.result_class("get_partitions_by_names")(success=found)

    def _get_partitions_by_names_req(self, conn: State, args: Any) -> Any:
        found = self._get_partitions_by_names(conn, args.req).success
        result = idl.module().GetPartitionsByNamesResult(partitions=found)
        return idl.result_class("get_partitions_by_names_req")(success=result)

    def _partitions_of(self, db: str, name: str) -> dict[str, Any]:
        return self.partitions.get((db, name), {})

    def _get_partitions(self, conn: State, args: Any) -> Any:
        have = self._partitions_of(args.db_name, args.tbl_name)
        found = [have[n] for n in sorted(have)]
        if args.max_parts is not None and args.max_parts >= 0:
            found = found[: args.max_parts]
        return idl.result_class("get_partitions")(success=found)

    def _filtered(self, db: str, name: str, text: str | None) -> list[Any]:
        """The partitions a filter selects: ``""`` all, ``ds >= "V"`` or ``ds = "V"`` (what
        the tests write; the real grammar is the metastore's)."""
        have = self._partitions_of(db, name)
        found = [have[n] for n in sorted(have)]
        text = (text or "").replace(" ", "")
        if not text:
            return found
        op, value = (">=", text[4:]) if text.startswith("ds>=") else ("=", text[3:])
        value = value.strip("\"'")
        if op == ">=":
            return [p for p in found if p.values[0] >= value]
        return [p for p in found if p.values[0] == value]

    def _get_partitions_by_filter(self, conn: State, args: Any) -> Any:
        found = self._filtered(args.db_name, args.tbl_name, args.filter)
        if args.max_parts is not None and args.max_parts >= 0:
            found = found[: args.max_parts]
        return idl.result_class("get_partitions_by_filter")(success=found)

    def _get_num_partitions_by_filter(self, conn: State, args: Any) -> Any:
        result = idl.result_class("get_num_partitions_by_filter")
        if (args.db_name, args.tbl_name) not in self.tables:
            return result(o2=M.NoSuchObjectException(f"{args.db_name}.{args.tbl_name}"))
        return result(success=len(self._filtered(args.db_name, args.tbl_name, args.filter)))

    def _get_partition(self, conn: State, args: Any) -> Any:
        result = idl.result_class("get_partition")
        name = "ds=" + "/".join(args.part_vals or [])
        found = self._partitions_of(args.db_name, args.tbl_name).get(name)
        if found is None:
            return result(o2=M.NoSuchObjectException(f"partition {name}"))
        return result(success=found)

    def _get_partition_names(self, conn: State, args: Any) -> Any:
        names = sorted(self._partitions_of(args.db_name, args.tbl_name))
        return idl.result_class("get_partition_names")(success=names)

    def _add_partition(self, conn: State, args: Any) -> Any:
        new = args.new_part
        result = idl.result_class("add_partition")
        key, name = (new.dbName, new.tableName), "ds=" + "/".join(new.values or [])
        if key not in self.tables:
            return result(o1=M.InvalidObjectException("no table"))
        if name in self.partitions[key]:
            return result(o2=M.AlreadyExistsException(f"partition {name}"))
        self.partitions[key][name] = new
        return result(success=new)

    def _drop_partition(self, conn: State, args: Any) -> Any:
        name = "ds=" + "/".join(args.part_vals or [])
        result = idl.result_class("drop_partition")
        if self.partitions.get((args.db_name, args.tbl_name), {}).pop(name, None) is None:
            return result(o1=M.NoSuchObjectException(f"partition {name}"))
        return result(success=True)

    def _lock(self, conn: State, args: Any) -> Any:
        self.locks += 1
        response = M.LockResponse(lockid=self.locks, state=1)  # ACQUIRED
        return idl.result_class("lock")(success=response)

    def _check_lock(self, conn: State, args: Any) -> Any:
        response = M.LockResponse(lockid=args.rqst.lockid, state=1)
        return idl.result_class("check_lock")(success=response)


async def until(check: Callable[[], object], what: str = "condition", turns: int = 10_000) -> None:
    """Let the event loop run until ``check()`` holds: at most ``turns`` turns (each one
    polls the sockets), so a condition that never holds fails the test, naming ``what`` it
    waited for, instead of hanging."""
    for _ in range(turns):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what}: never so in {turns} event-loop turns")
