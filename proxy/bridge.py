"""Old clients in front of a metastore that removed their calls (pure).

HMS 4.0.1 removed ``get_table`` and ``get_table_objects_by_name`` (HIVE-26537) and answers
them with a ``TApplicationException`` ``UNKNOWN_METHOD``, on a connection it keeps open.
Spark's built-in Hive 2.3 client, PrestoDB, Java Iceberg and pyiceberg call them and fail.
Every metastore since 2.3 serves their ``_req`` forms, which return the same ``Table``
wrapped in a result struct. So the bridge sends the call as its ``_req`` form and moves the
metastore's bytes, verbatim, into the reply shape the client asked for:

* ``get_table(dbname, tbl_name)`` becomes ``get_table_req(GetTableRequest{1: dbName,
  2: tblName[, 4: catName]})`` and its reply ``{0: GetTableResult{1: Table, 2: ...}}``
  becomes ``{0: Table}``: the ``Table`` bytes are copied, never re-encoded, so fields newer
  than this proxy's IDL (Hive 4's 16 to 28) reach the client as the metastore wrote them.
* ``get_table_objects_by_name(dbname, tbl_names)`` becomes
  ``get_table_objects_by_name_req(GetTablesRequest{1: dbName, 2: tblNames[, 4: catName]})``
  and ``{0: GetTablesResult{1: list<Table>}}`` becomes ``{0: list<Table>}``.
* Declared exceptions have the same field ids and types in both forms (1 MetaException,
  2 NoSuchObjectException; 1 MetaException, 2 InvalidOperationException, 3
  UnknownDBException): copied as they are. An ``EXCEPTION`` message keeps its
  ``TApplicationException`` bytes and gets the client's method name in its header.

A database name ``@cat#db`` (how Hive 3/4 clients name a catalog in the old calls; ``!``
for an empty name) is split into ``catName`` and ``dbName``: the old server-side call parsed
it itself, whether the ``_req`` form parses it in ``dbName`` is not documented. Nothing
else is sent that the old call did not imply (no capabilities, no statistics, no engine),
which is what the old call asked the metastore's own lookup for.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable

from proxy.wire.binary import (
    AppErrorType,
    MessageType,
    Scanner,
    StructScanner,
    TType,
    encode_header,
    parse_header,
)
from proxy.wire.errors import ProtocolError
from proxy.wire.fields import FieldSpan, field_spans, find
from proxy.wire.framing import Message

# The removed method -> the form that replaces it.
REPLACEMENTS = {
    "get_table": "get_table_req",
    "get_table_objects_by_name": "get_table_objects_by_name_req",
}
# What the second argument (and the result's payload) is, per removed method.
_PAYLOAD = {"get_table": TType.STRING, "get_table_objects_by_name": TType.LIST}
_RESULT = {"get_table": TType.STRUCT, "get_table_objects_by_name": TType.LIST}
_FIELD = struct.Struct(">bh")
_I32 = struct.Struct(">i")


class BridgeError(ProtocolError):
    """A reply the bridge cannot put into the old shape."""


def unknown_method(reply: Message) -> bool:
    """Whether ``reply`` is a ``TApplicationException`` of type ``UNKNOWN_METHOD``."""
    if reply.header.type != MessageType.EXCEPTION:
        return False
    body = reply.body
    try:
        spans, _ = field_spans(body, 0)
    except (ProtocolError, struct.error, IndexError):
        return False
    kind = find(spans, 2)
    if kind is None or kind.ttype != TType.I32:
        return False
    (value,) = _I32.unpack_from(body, kind.value)
    return bool(value == AppErrorType.UNKNOWN_METHOD)


def request(message: Message) -> bytes | None:
    """The call as its ``_req`` form, with the client's seqid; ``None`` if its arguments are
    not the old call's (then it is forwarded as it came, and the client gets the
    metastore's answer to it)."""
    name = message.header.name
    payload = _PAYLOAD.get(name)
    if payload is None:
        return None
    body = message.body
    try:
        spans, end = field_spans(body, 0)
    except (ProtocolError, struct.error, IndexError):
        return None
    db, second = find(spans, 1), find(spans, 2)
    if end != len(body) or len(spans) != 2 or db is None or second is None:
        return None
    if db.ttype != TType.STRING or second.ttype != payload:
        return None
    catalog, database = _split_catalog(body[db.value + 4 : db.end])
    fields = [_string(1, database), _FIELD.pack(payload, 2), body[second.value : second.end]]
    if catalog is not None:
        fields.append(_string(4, catalog))
    inner = b"".join(fields) + b"\x00"
    header = encode_header(REPLACEMENTS[name], MessageType.CALL, message.header.seqid)
    return header + _FIELD.pack(TType.STRUCT, 1) + inner + b"\x00"


def reply(name: str, seqid: int, upstream: Message) -> bytes:
    """The metastore's reply to the ``_req`` form, as the reply to ``name`` (the removed
    method the client called) with the client's ``seqid``. Raises BridgeError."""
    kind = upstream.header.type
    head = encode_header(name, kind, seqid)
    body = upstream.body
    if kind == MessageType.EXCEPTION:
        return head + body  # the TApplicationException, byte for byte
    try:
        fields, end = field_spans(body, 0)
        if end != len(body):
            raise BridgeError("bytes after the result struct")
        parts = [_moved(name, body, f) if f.fid == 0 else _copied(body, f) for f in fields]
    except BridgeError:
        raise
    except (ProtocolError, struct.error, IndexError) as exc:
        raise BridgeError(f"{REPLACEMENTS[name]} reply: {exc}") from exc
    return head + b"".join(parts) + b"\x00"


def _moved(name: str, body: bytes, span: FieldSpan) -> bytes:
    """Result field 0: the payload of the ``_req`` result struct, as the old field 0."""
    if span.ttype != TType.STRUCT:
        raise BridgeError(f"result field 0 has type {span.ttype}, not a struct")
    inner, _ = field_spans(body, span.value)
    payload = find(inner, 1)
    if payload is None or payload.ttype != _RESULT[name]:
        raise BridgeError("the result struct has no field 1 of the expected type")
    return _FIELD.pack(payload.ttype, 0) + body[payload.value : payload.end]


def _copied(body: bytes, span: FieldSpan) -> bytes:
    return body[span.start : span.end]


def _split_catalog(db: bytes) -> tuple[bytes | None, bytes]:
    """``@cat#db`` -> (cat, db), ``!`` meaning an empty name; any other name as it is."""
    if db.startswith(b"@") and b"#" in db:
        catalog, _, database = db[1:].partition(b"#")
        return catalog, b"" if database == b"!" else database
    return None, db


def _string(fid: int, raw: bytes) -> bytes:
    return _FIELD.pack(TType.STRING, fid) + _I32.pack(len(raw)) + raw


class Removals:
    """Which metastores said they do not serve which removed method.

    Remembered per metastore address: failover can move a proxy from an HMS 4 to an older
    one (which serves the ``_req`` forms too, so a stale memory costs nothing). Bounded: at
    most the configured addresses times the two removed methods.
    """

    def __init__(self) -> None:
        self._removed: set[tuple[Hashable, str]] = set()
        self.names: set[str] = set()  # the methods some metastore is known to lack

    def replacement(self, endpoint: Hashable, name: str) -> str | None:
        """The ``_req`` form to send instead of ``name`` to ``endpoint``, if it is known to
        lack ``name``."""
        if (endpoint, name) in self._removed:
            return REPLACEMENTS[name]
        return None

    def learn(self, endpoint: Hashable, name: str) -> bool:
        """Remember that ``endpoint`` lacks ``name``; whether that is news (concurrent calls
        can find it out at once: one of them says so)."""
        new = (endpoint, name) not in self._removed
        self._removed.add((endpoint, name))
        self.names.add(name)
        return new


class ReplyStream:
    """The reply to a bridged call, rewritten as its bytes arrive (pure): feed it the
    metastore's bytes, send what it returns, and what :meth:`finish` returns at the end.

    Up to ``hold_limit`` bytes it holds the reply and rewrites it whole (:func:`reply`), as
    most replies are. A bigger one, which only ``get_table_objects_by_name`` of a large
    database makes, is rewritten piece by piece (it arrives whole since issue 42, and is
    rewritten without a second whole copy): the new header
    goes out, then the list's bytes as each table in it is complete (the message scanner
    finds their ends), then the old result's STOP; whatever follows the list in the
    ``_req`` result struct is read, checked and dropped, as in :func:`reply`.
    """

    def __init__(self, name: str, seqid: int, hold_limit: int) -> None:
        self.name = name
        self.seqid = seqid
        self.hold_limit = hold_limit
        self.streaming = False
        self._buf = bytearray()
        self._left = 0  # tables of the list not yet complete
        self._scanner: Scanner | None = None  # on the table in progress

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        if not self.streaming:
            if len(self._buf) <= self.hold_limit:
                return b""
            return self._start()
        return self._tables()

    def finish(self) -> bytes:
        """The rest of the rewritten reply, once the metastore's has ended."""
        buf = bytes(self._buf)
        self._buf.clear()
        if not self.streaming:
            header = parse_header(buf, 0, len(buf))
            if header is None:
                raise BridgeError("no reply header")
            return reply(self.name, self.seqid, Message(header, buf))
        if self._left:
            raise BridgeError("the reply ended inside its list")
        try:
            _, end = field_spans(buf, 0)  # the rest of the _req result struct: dropped
        except (ProtocolError, struct.error, IndexError) as exc:
            raise BridgeError(f"after the list: {exc}") from exc
        if buf[end:] != b"\x00":
            raise BridgeError("bytes after the result struct")
        return b"\x00"

    def _start(self) -> bytes:
        buf = self._buf
        try:
            header = parse_header(buf, 0, len(buf))
        except ProtocolError as exc:
            raise BridgeError(f"reply header: {exc}") from exc
        at = header.length if header is not None else 0
        shape = bytes((TType.STRUCT, 0, 0, TType.LIST, 0, 1, TType.STRUCT))
        if (
            header is None
            or header.type != MessageType.REPLY
            or _RESULT[self.name] != TType.LIST
            or bytes(buf[at : at + 7]) != shape
            or len(buf) < at + 10
        ):
            raise BridgeError(f"a {REPLACEMENTS[self.name]} reply over {self.hold_limit} bytes")
        (self._left,) = _I32.unpack_from(buf, at + 7)
        if self._left < 0:
            raise BridgeError("negative list size")
        self.streaming = True
        head = encode_header(self.name, MessageType.REPLY, self.seqid)
        head += _FIELD.pack(TType.LIST, 0) + bytes(buf[at + 6 : at + 11])
        del buf[: at + 11]
        return head + self._tables()

    def _tables(self) -> bytes:
        """The tables completed so far, dropped from the buffer."""
        buf = self._buf
        done = 0
        while self._left:
            if self._scanner is None:
                self._scanner = StructScanner(done, len(buf) + (1 << 62))
            try:
                finished = self._scanner.scan(buf, len(buf))
            except ProtocolError as exc:
                raise BridgeError(f"a table in the list: {exc}") from exc
            if not finished:
                break
            done = self._scanner.pos
            self._scanner = None
            self._left -= 1
        out = bytes(buf[:done])
        del buf[:done]
        if self._scanner is not None:
            self._scanner.rebase(done)
        return out
