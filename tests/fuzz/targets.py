"""The fuzz target: one input through everything the proxy does with a client's bytes before
they reach the metastore, with the checks that make a wrong outcome visible.

:func:`check` takes the input as a client stream and runs, in order:

1. **the reader**, for three streams (the bytes on the buffered transport, the same bytes on
   the framed transport, and the bytes framed correctly), each fed whole, fed in pieces cut
   at ``cuts``, and streamed with ``take()``. The three feedings must agree (messages, error
   class, the header the session would name the caller with); the messages must be the
   stream's bytes, in order; each must parse back to its own header and struct end.
2. **every complete message**: the ``TApplicationException`` the session would send naming
   its header (it must parse back to that name, seqid, type and text), the request as the
   proxy would forward it, and for calls what the handler does before forwarding: the
   argument decoder and the cache planner (``CacheEngine.plan_read``/``plan_write``: catalog
   look-up, ``idl.decode_args``, ``Planner.read``/``Planner.write``), with and without a user
   identity.
3. **the input as a body**: for the method the header names and for one picked from the
   catalog by the input's checksum, the bytes after the header (and the input itself) as
   that method's arguments, when the scanner accepts them as a struct (the proxy never
   decodes bytes the scanner did not delimit), through decoder and
   planner.
4. **both struct scanners** (C and pure Python) over the input and over its body, in the
   same pieces: same end, same "needs more", same error class.

A **failure** (:class:`Failure`) is any of:

* an exception other than ``ProtocolError`` (``MessageTooLarge`` and ``LimitExceeded`` are
  subclasses) escaping the reader, ``parse_header``, a scanner or ``idl.decode_args``;
* a ``ProtocolError`` from the decoder that a ``MemoryError`` caused: the decoder tried an
  allocation the input's size cannot justify;
* the decoder reading a scanner-delimited body as something else than the wire types say
  (it stops before the end, or reads past it): it then decodes bytes that are not the
  client's, or memory that is not the body at all;
* any exception from the planner other than what the engine itself catches: it must answer
  "no plan" (``None``) or "flush", never raise;
* the two scanners disagreeing, the reader depending on how the bytes were cut, or an
  encoded reply or forwarded request that does not parse back to what was encoded;
* the reader holding more than ``max_size`` bytes of one message without refusing it;
* (:func:`check_bounded`) a traced allocation peak not bounded by the reader's ``max_size``
  (:func:`allocation_limit`): a 4-byte length claiming 2 GB must never get them.
"""

from __future__ import annotations

import struct
import traceback
import tracemalloc
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from thriftpy2.thrift import TApplicationException
from thriftpy2.transport.memory import TCyMemoryBuffer

from proxy import catalog, idl
from proxy.cache.keys import Naming
from proxy.cache.plan import FLUSH, ReadPlan, WritePlan
from proxy.cache.planner import Planner, Ttls
from proxy.catalog import Kind, MethodSpec
from proxy.handler import upstream_request
from proxy.upstream import Identity
from proxy.wire.binary import (
    AppErrorType,
    MessageHeader,
    MessageType,
    PyStructScanner,
    StructScanner,
    encode_application_exception,
    parse_header,
)
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, MessageReader, Transport
from tests.fuzz import sandbox, thrift

# The reader's message limit in the target: small, so limits are crossed often.
MAX_SIZE = 4096
# Bytes of Python objects thriftpy2 may legitimately build per byte of arguments: a list of
# empty structs costs ~160 bytes per input byte (one object with its attribute dict per
# STOP byte). The allocation bound is this factor times the message limit.
ALLOCATION_FACTOR = 256

_NAMING = Naming()
_PLANNERS = (
    Planner(_NAMING, Ttls(), per_user=False),
    Planner(_NAMING, Ttls(), per_user=True),
)
_IDENTITIES = (None, b"\x0b\x00\x01\x00\x00\x00\x05alice\x00")
# Methods whose arguments the proxy may decode (the catalog's others are never decoded).
_METHODS = sorted(s.name for s in catalog.all_methods() if s.name in idl.method_names())
_APP = AppErrorType.PROTOCOL_ERROR
_PAD = b"\x00" * 64  # behind a body, shows a decoder that reads past its end


class Failure(Exception):
    """The input made the proxy's code do something it must not (see the module doc)."""

    def __init__(self, signature: str, detail: str) -> None:
        super().__init__(signature, detail)  # both in ``args``: it survives pickling
        self.signature = signature
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.signature}\n{self.detail}"


@dataclass
class Reached:
    """How far an input got (for the run's statistics)."""

    messages: int = 0
    calls: int = 0
    decoded: int = 0
    plans: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    peak: int = 0  # traced allocation peak, bytes (check_bounded only)
    max_size: int = MAX_SIZE  # the reader's limit this input runs with


def check_bounded(
    data: bytes, cuts: Sequence[int] | None = None, *, max_size: int = MAX_SIZE
) -> Reached:
    """:func:`check` under tracemalloc: also a failure if the allocation peak passes
    :func:`allocation_limit` (a declared length was believed before its bytes arrived)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        reached = check(data, cuts, max_size=max_size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    reached.peak = peak - base
    limit = allocation_limit(data, max_size)
    if reached.peak > limit:
        raise Failure(
            "allocation: peak",
            f"{describe(data)}: traced peak {reached.peak} bytes, bound {limit}",
        )
    return reached


def warm() -> None:
    """Load what the target loads lazily (the IDL, the catalog's tables), so that a first
    input's allocation peak is its own."""
    check(idl.encode_call("get_table", 1, dbname="proxy_it", tbl_name="sales"))


def allocation_limit(data: bytes, max_size: int = MAX_SIZE) -> int:
    """The largest traced allocation peak :func:`check` may cause for ``data``: bounded by
    the message limit (and the copies of the input itself the reader and target hold)."""
    return ALLOCATION_FACTOR * max_size + 16 * len(data) + (1 << 20)


def default_cuts(data: bytes) -> list[int]:
    """Where to cut ``data`` into pieces: one to six points derived from the bytes
    themselves, so that a saved input replays exactly."""
    state = zlib.crc32(data) or 1
    cuts = []
    for _ in range(1 + state % 6):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        cuts.append(state % (len(data) + 1))
    return sorted(cuts)


def check(data: bytes, cuts: Sequence[int] | None = None, *, max_size: int = MAX_SIZE) -> Reached:
    """Run one input; raises :class:`Failure` on a crash as defined in the module doc."""
    reached = Reached(max_size=max_size)
    seen: set[tuple[str, bytes]] = set()
    pieces = list(cuts) if cuts is not None else default_cuts(data)
    messages: dict[tuple[str, int, int, bytes], Message] = {}
    for transport, stream in (
        (Transport.BUFFERED, data),
        (Transport.FRAMED, data),
        (Transport.FRAMED, Transport.FRAMED.frame(data)),
    ):
        got, error = _reader(transport, stream, pieces, max_size)
        if error is not None:
            reached.errors[error] = reached.errors.get(error, 0) + 1
        for m in got:
            messages.setdefault((m.header.name, m.header.type, m.header.seqid, m.body), m)
    reached.messages = len(messages)
    for message in messages.values():
        _message(message, reached, seen)
    header = _header_or_none(data)
    starts = [0] if header is None else [0, header.length]
    for start in starts:
        _scanners(data, start, pieces, max_size)
    named = header.name if header is not None and header.name in idl.method_names() else None
    other = _METHODS[zlib.crc32(data) % len(_METHODS)]
    for start in starts:
        body = _struct_at(data, start, max_size)
        if body is None:
            continue
        for method in (named, other):
            if method is not None and (method, body) not in seen:
                seen.add((method, body))
                _call(method, body, reached)
    return reached


# -- the reader ------------------------------------------------------------------------------


def _chunks(data: bytes, cuts: Sequence[int]) -> Iterator[bytes]:
    last = 0
    for cut in sorted({c for c in cuts if 0 < c < len(data)}):
        yield data[last:cut]
        last = cut
    yield data[last:]


Outcome = tuple[list[bytes], str | None, MessageHeader | None]


def _reader(
    transport: Transport, stream: bytes, cuts: Sequence[int], max_size: int
) -> tuple[list[Message], str | None]:
    whole, whole_messages = _feed(transport, [stream], max_size)
    split, _ = _feed(transport, list(_chunks(stream, cuts)), max_size)
    streamed = _stream(transport, list(_chunks(stream, cuts)), max_size)
    what = f"{transport} reader, {len(stream)} bytes cut at {list(cuts)}"
    if split != whole:
        raise Failure("reader: depends on how the bytes are cut", f"{what}: {whole} != {split}")
    if streamed != whole[:2]:
        raise Failure("reader: take() disagrees", f"{what}: {whole[:2]} != {streamed}")
    framed = transport is Transport.FRAMED
    expected = b"".join(transport.frame(m) if framed else m for m in whole[0])
    if stream[: len(expected)] != expected:
        raise Failure("reader: messages are not the stream's bytes", what)
    for m in whole_messages:
        header = _guard("reader", parse_header, m.data, 0, len(m.data))
        if header != m.header:
            raise Failure("reader: header does not parse back", f"{what}: {m.header} {header}")
        if _struct_at(m.data, header.length, len(m.data)) != m.body:
            raise Failure("reader: message is not one struct", what)
    return whole_messages, whole[1]


def _feed(
    transport: Transport, chunks: list[bytes], max_size: int
) -> tuple[Outcome, list[Message]]:
    reader = MessageReader(transport, max_size)
    out: list[Message] = []
    error = None
    try:
        for chunk in chunks:
            reader.feed(chunk)
            while (message := reader.next_message()) is not None:
                out.append(message)
    except ProtocolError as exc:
        error = type(exc).__name__
    except Exception as exc:
        raise _crash("reader", exc) from exc
    if error is None and reader.buffered > max_size + 4:
        raise Failure(
            "reader: buffers past max_size without refusing",
            f"{transport} reader with max_size {max_size} holds {reader.buffered} bytes of one "
            f"message and still waits for more (header {reader.header})",
        )
    return ([m.data for m in out], error, reader.header), out


def _stream(
    transport: Transport, chunks: list[bytes], max_size: int
) -> tuple[list[bytes], str | None]:
    """The messages as ``take()`` hands them out in streaming mode, reassembled."""
    reader = MessageReader(transport, max_size, keep=False)
    out: list[bytes] = []
    current = bytearray()
    error = None
    try:
        for chunk in chunks:
            reader.feed(chunk)
            while (piece := reader.take()) is not None:
                current += piece.data
                if not piece.last:
                    break
                out.append(bytes(current))
                current.clear()
    except ProtocolError as exc:
        error = type(exc).__name__
    except Exception as exc:
        raise _crash("reader", exc) from exc
    return out, error


def _header_or_none(data: bytes) -> MessageHeader | None:
    try:
        return parse_header(data, 0, len(data))
    except ProtocolError:
        return None
    except Exception as exc:
        raise _crash("parse_header", exc) from exc


def _struct_at(data: bytes, start: int, max_size: int) -> bytes | None:
    """The struct the scanner delimits at ``start`` (within ``max_size``), or ``None``."""
    scanner = StructScanner(start, start + max_size)
    try:
        if scanner.scan(data, len(data)):
            return data[start : scanner.pos]
    except ProtocolError:
        pass
    except Exception as exc:
        raise _crash("scanner", exc) from exc
    return None


# -- messages --------------------------------------------------------------------------------


def _message(message: Message, reached: Reached, seen: set[tuple[str, bytes]]) -> None:
    h = message.header
    text = f"hms-cache-proxy: fuzz {h.name[:40]!r}"
    reply = _guard("app-exception", encode_application_exception, h.name, h.seqid, _APP, text)
    back = _only_message(reply)
    if back is None or (back.header.name, back.header.type, back.header.seqid) != (
        h.name,
        MessageType.EXCEPTION,
        h.seqid,
    ):
        raise Failure("app-exception: does not parse back", repr(h))
    exc = _guard("app-exception", idl.decode, TApplicationException, back.body)
    if (exc.message, exc.type) != (text, _APP):
        raise Failure("app-exception: wrong content", f"{exc!r} for {h!r}")
    if h.type not in (MessageType.CALL, MessageType.ONEWAY):
        return  # the session refuses it before the handler sees it
    reached.calls += 1
    forwarded = _only_message(_guard("upstream_request", upstream_request, message))
    if forwarded is None or (
        forwarded.header.name,
        forwarded.header.type,
        forwarded.header.seqid,
        forwarded.header.strict,
        forwarded.body,
    ) != (h.name, h.type, h.seqid, True, message.body):
        raise Failure("upstream_request: does not parse back", repr(h))
    if h.name == "set_ugi":
        _only_message(Identity(message.body).call())
    if h.name in idl.method_names() and (h.name, message.body) not in seen:
        seen.add((h.name, message.body))
        _call(h.name, message.body, reached)


def _only_message(data: bytes) -> Message | None:
    reader = MessageReader(Transport.BUFFERED, len(data) + 1)
    reader.feed(data)
    try:
        message = reader.next_message()
    except ProtocolError:
        return None
    return message if message is not None and reader.buffered == 0 else None


# -- decoder and planner -----------------------------------------------------------------------


def _call(method: str, body: bytes, reached: Reached) -> None:
    """What the handler does with a call's arguments before forwarding it."""
    args = _decode(method, body, reached.max_size)
    if args is not None:
        reached.decoded += 1
    spec = catalog.lookup(method)
    if spec is None:
        return  # the handler plans an unknown method as FLUSH without decoding anything
    if spec.kind is Kind.CACHEABLE_READ:
        for planner in _PLANNERS:
            for identity in _IDENTITIES:
                plan_read(planner, spec, args, body, identity)
        reached.plans += 1
    elif spec.kind is Kind.WRITE:
        for planner in _PLANNERS:
            plan_write(planner, spec, args)
        reached.plans += 1


def _decode(method: str, body: bytes, max_size: int) -> Any | None:
    """``idl.decode_args`` as the engine calls it; ``None`` where it raised ProtocolError.

    Bodies thriftpy2 is predicted to misread (:func:`desync`) are decoded in a forked child
    under memory and CPU caps: today such a decode can allocate 4 GB or spin for seconds.
    """
    cause = desync(method, body)
    if cause is not None:
        return _decode_isolated(method, body, cause, max_size)
    try:
        args = idl.decode_args(method, body)
    except ProtocolError as exc:
        if isinstance(exc.__cause__, MemoryError):
            raise Failure("allocation: decode", f"{method}: {exc!r}") from exc
        return None
    except Exception as exc:
        raise _crash("decode", exc) from exc
    left = _left_over(idl.args_class(method), body + _PAD)
    if left != len(_PAD):
        raise Failure(
            "decoder-desync: unpredicted",
            f"{method}: decoding the {len(body)}-byte body left {left} of {len(_PAD)} pad "
            "bytes unread (the decoder did not read the struct the scanner delimited)",
        )
    return args


def _decode_isolated(method: str, body: bytes, cause: str, max_size: int) -> None:
    what = f"{method}, {len(body)}-byte body {body[:200].hex()}"
    try:
        result = sandbox.isolated(
            _decode_outcome, method, body, headroom=_ISOLATED_HEADROOM, cpu_seconds=1
        )
    except Exception as exc:
        raise _crash("decode", exc) from exc
    if isinstance(result, sandbox.Died):
        raise Failure(f"decode: {result.how}", f"{what}: the decoding process was {result.how}")
    outcome, peak = result
    limit = allocation_limit(body, max_size)
    if outcome == "memory" or peak > limit:
        raise Failure(
            "allocation: decode",
            f"{what}: the decoder's traced peak was {peak} bytes (bound {limit})"
            + (", then it ran out of address space" if outcome == "memory" else ""),
        )
    if outcome == "refused":
        return None  # ProtocolError: what a decoder that saw the trouble would do
    raise Failure(
        f"decoder-desync: {cause}",
        f"{what}: decoded, with {outcome} of {len(_PAD)} pad bytes left unread",
    )


def _decode_outcome(method: str, body: bytes) -> tuple[str | int | None, int]:
    """In the child: how ``idl.decode_args`` ends, and its traced allocation peak."""
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    outcome: str | int | None
    try:
        idl.decode_args(method, body)
    except ProtocolError as exc:
        outcome = "memory" if isinstance(exc.__cause__, MemoryError) else "refused"
    else:
        outcome = _left_over(idl.args_class(method), body + _PAD)
    return outcome, tracemalloc.get_traced_memory()[1] - base


def _left_over(cls: Any, data: bytes) -> int | None:
    """Bytes thriftpy2's decoder leaves unread after one struct of ``cls`` in ``data``."""
    buf = TCyMemoryBuffer(data)
    try:
        idl._PROTOCOL.get_protocol(buf).read_struct(cls())
    except Exception:
        return None
    return len(buf.getvalue())


# -- where thriftpy2 leaves the wire types -----------------------------------------------------

_BIN = (thrift.STRING, thrift.BINARY)
_ISOLATED_HEADROOM = int(2.5 * sandbox.GiB)  # a 2 GB malloc fits, a second 2 GB does not
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _Desync(Exception):
    pass


def desync(method: str, body: bytes) -> str | None:
    """Why thriftpy2's decoder would read ``body`` (a struct the scanner delimited) other
    than as its wire types say, or ``None``. A model of thriftpy2 0.7's ``read_struct``:
    fields it does not know, or of another type, are skipped by their wire type; lists whose
    element type differs are skipped; maps whose wire key or value type is STRING are read
    as the IDL's types whatever those are ("map"); and types it does not know (UUID, 16)
    are skipped as zero bytes ("uuid")."""
    try:
        _read_struct(body, 0, idl.args_class(method), 0)
    except _Desync as exc:
        return str(exc)
    except (IndexError, struct.error, RecursionError):
        return None
    return None


def _split(arg: Any) -> tuple[int, Any]:
    return (arg, None) if isinstance(arg, int) else (arg[0], arg[1])


def _read_struct(data: bytes, pos: int, cls: Any, depth: int) -> int:
    if depth > 70:
        raise RecursionError  # thriftpy2 refuses this deep, before anything is misread
    spec = cls.thrift_spec
    while True:
        ftype = data[pos]
        if ftype == thrift.STOP:
            return pos + 1
        (fid,) = _I16.unpack_from(data, pos + 1)
        pos += 3
        entry = spec.get(fid)
        if entry is None or (ftype != entry[0] and not (ftype in _BIN and entry[0] in _BIN)):
            pos = _skip(data, pos, ftype, depth + 1)
        else:
            pos = _read(data, pos, entry[0], entry[2] if len(entry) == 4 else None, depth + 1)


def _read(data: bytes, pos: int, ttype: int, arg: Any, depth: int) -> int:
    if ttype in (thrift.LIST, thrift.SET):
        etype, espec = _split(arg)
        wire = data[pos]
        (count,) = _I32.unpack_from(data, pos + 1)
        pos += 5
        same = wire == etype or (wire in _BIN and etype in _BIN)
        for _ in range(count):
            if same:
                pos = _read(data, pos, etype, espec, depth + 1)
            else:
                pos = _skip(data, pos, wire, depth + 1)
        return pos
    if ttype == thrift.MAP:
        (ktype, kspec), (vtype, vspec) = _split(arg[0]), _split(arg[1])
        kwire, vwire = data[pos], data[pos + 1]
        (count,) = _I32.unpack_from(data, pos + 2)
        pos += 6
        # thriftpy2 takes a STRING key or value type on the wire to mean the IDL's type.
        key_as = ktype if kwire in _BIN else kwire
        value_as = vtype if vwire in _BIN else vwire
        if count > 0 and (
            (kwire in _BIN and ktype not in _BIN) or (vwire in _BIN and vtype not in _BIN)
        ):
            raise _Desync("map")
        same = key_as == ktype and value_as == vtype
        for _ in range(count):
            if same:
                pos = _read(data, pos, ktype, kspec, depth + 1)
                pos = _read(data, pos, vtype, vspec, depth + 1)
            else:
                pos = _skip(data, pos, kwire, depth + 1)
                pos = _skip(data, pos, vwire, depth + 1)
        return pos
    if ttype == thrift.STRUCT:
        return _read_struct(data, pos, arg, depth)
    return _skip(data, pos, ttype, depth)


def _skip(data: bytes, pos: int, ttype: int, depth: int) -> int:
    if ttype == thrift.UUID:
        raise _Desync("uuid")  # the scanner steps over 16 bytes, thriftpy2 over none
    width = thrift.FIXED.get(ttype)
    if width is not None:
        return pos + width
    if ttype in _BIN:
        (size,) = _I32.unpack_from(data, pos)
        return pos + 4 + size
    if depth > 70:
        raise RecursionError
    if ttype in (thrift.LIST, thrift.SET):
        etype = data[pos]
        (count,) = _I32.unpack_from(data, pos + 1)
        pos += 5
        for _ in range(count):
            pos = _skip(data, pos, etype, depth + 1)
        return pos
    if ttype == thrift.MAP:
        ktype, vtype = data[pos], data[pos + 1]
        (count,) = _I32.unpack_from(data, pos + 2)
        pos += 6
        for _ in range(count):
            pos = _skip(data, _skip(data, pos, ktype, depth + 1), vtype, depth + 1)
        return pos
    if ttype == thrift.STRUCT:
        while data[pos] != thrift.STOP:
            pos = _skip(data, pos + 3, data[pos], depth + 1)
        return pos + 1
    raise _Desync(f"type {ttype}")  # the scanner refuses these; thriftpy2 skips nothing


def plan_read(
    planner: Planner, spec: MethodSpec, args: Any | None, body: bytes, identity: bytes | None
) -> ReadPlan | None:
    """``CacheEngine.plan_read`` (the request path keeps its plans in KnownCalls): decode
    errors and planner ProtocolErrors mean "no plan"; anything else the planner raises is a
    failure."""
    if args is None:
        return None
    try:
        return planner.read(spec, args, body, identity)
    except ProtocolError:
        return None
    except Exception as exc:
        raise _crash("planner", exc) from exc


def plan_write(planner: Planner, spec: MethodSpec | None, args: Any | None) -> WritePlan:
    """``CacheEngine.plan_write`` (and the handler's FLUSH for unknown methods)."""
    if spec is None:
        return FLUSH
    try:
        return planner.write(spec, args if spec.targets else None)
    except Exception as exc:
        raise _crash("planner", exc) from exc


# -- scanners ----------------------------------------------------------------------------------


def _scanners(data: bytes, start: int, cuts: Sequence[int], max_size: int) -> None:
    points = [*sorted({c for c in cuts if start < c < len(data)}), len(data)]
    outcomes = [_scan(cls, data, start, points, start + max_size) for cls in SCANNERS]
    if outcomes[0] != outcomes[1]:
        raise Failure(
            "scanner: C and Python disagree",
            f"from {start}, pieces ending {points}: python {outcomes[0]}, C {outcomes[1]}",
        )


SCANNERS = (PyStructScanner, StructScanner)


def _scan(
    cls: Any, data: bytes, start: int, points: list[int], limit: int
) -> tuple[str, int | str]:
    scanner = cls(start, limit)
    try:
        for end in points:
            if scanner.scan(data, end):
                return "end", int(scanner.pos)
    except ProtocolError as exc:
        return "error", type(exc).__name__
    except Exception as exc:
        raise _crash(f"scanner {cls.__module__}", exc) from exc
    return "more", int(scanner.pos)


# -- helpers -------------------------------------------------------------------------------------


def _guard(stage: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise _crash(stage, exc) from exc


def _crash(stage: str, exc: BaseException) -> Failure:
    """A failure named by stage, exception type and the innermost proxy/ function."""
    where = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        path = frame.filename.replace("\\", "/")
        if "/proxy/" in path:
            where = f"proxy/{path.rsplit('/proxy/', 1)[1]}:{frame.name}"
    detail = "".join(traceback.format_exception(exc))
    return Failure(f"{stage}: {type(exc).__name__} at {where}", detail)


def describe(data: bytes) -> str:
    """One line about an input: its header, if it has one."""
    header = _header_or_none(data)
    if header is None:
        return f"{len(data)} bytes, no header"
    return (
        f"{len(data)} bytes, {header.name[:60]!r} type {header.type} seqid {header.seqid}"
        f"{'' if header.strict else ' (non-strict)'}"
    )
