"""The binary protocol: headers, exceptions and both struct scanners."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import binary, fields
from proxy.wire.binary import (
    AppErrorType,
    MessageType,
    PyStructScanner,
    encode_application_exception,
    encode_header,
    parse_header,
    reseq,
    with_seqid,
)
from proxy.wire.errors import ProtocolError
from tests.thrift_values import encode, message, structs

SCANNERS = [PyStructScanner, binary.StructScanner]
IDS = ["python", "c" if binary.ACCELERATED else "python-again"]


def test_the_c_scanner_is_built() -> None:
    # The fallback is for exotic platforms only; here a missing build is a packaging bug.
    assert binary.ACCELERATED


def test_strict_header_round_trip() -> None:
    raw = encode_header("get_table", MessageType.CALL, 42) + b"\x00"
    header = parse_header(raw, 0, len(raw))
    assert header is not None
    assert (header.name, header.type, header.seqid, header.strict) == ("get_table", 1, 42, True)
    assert raw[header.length :] == b"\x00"


def test_non_strict_header_is_accepted() -> None:
    raw = message("get_database", MessageType.CALL, -7, b"\x00", strict=False)
    header = parse_header(raw, 0, len(raw))
    assert header is not None
    assert (header.name, header.type, header.seqid, header.strict) == ("get_database", 1, -7, False)


@pytest.mark.parametrize("strict", [True, False])
def test_header_needs_every_byte(strict: bool) -> None:
    raw = message("get_all_databases", MessageType.CALL, 1, b"", strict=strict)
    for cut in range(len(raw)):
        assert parse_header(raw, 0, cut) is None
    assert parse_header(raw, 0, len(raw)) is not None


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80\x02\x00\x01" + b"\x00" * 12,  # unknown version
        b"\x7f\xff\xff\xff" + b"\x00" * 12,  # 2 GB name length
        b"\x00\x00\x00\x00" + b"\x00" * 12,  # empty name
        struct.pack(">Ii", 0x80010001, 2) + b"\xff\xfe" + b"\x00" * 4,  # name not UTF-8
    ],
)
def test_garbage_headers_are_rejected(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_header(raw, 0, len(raw))


def test_with_seqid_changes_only_the_seqid() -> None:
    raw = encode_header("get_table", MessageType.REPLY, 5) + b"\x0c\x00\x00\x00\x00"
    header = parse_header(raw, 0, len(raw))
    assert header is not None
    patched = with_seqid(raw, header, 99)
    assert len(patched) == len(raw)
    again = parse_header(patched, 0, len(patched))
    assert again is not None and again.seqid == 99
    assert patched[header.length :] == raw[header.length :]


def test_application_exception_decodes_with_thrift() -> None:
    from thrift.protocol.TBinaryProtocol import TBinaryProtocol
    from thrift.Thrift import TApplicationException
    from thrift.transport.TTransport import TMemoryBuffer

    raw = encode_application_exception(
        "x", 3, AppErrorType.UNKNOWN_METHOD, "Invalid method name: 'x'"
    )
    proto = TBinaryProtocol(TMemoryBuffer(raw))
    assert proto.readMessageBegin() == ("x", MessageType.EXCEPTION, 3)
    exc = TApplicationException()
    exc.read(proto)
    assert (exc.type, exc.message) == (1, "Invalid method name: 'x'")


def scan_in_pieces(cls: type, data: bytes, start: int, cuts: list[int], limit: int) -> int | None:
    scanner = cls(start, limit)
    points = [*sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    for end in points:
        if scanner.scan(data, end):
            return int(scanner.pos)
    return None


@pytest.mark.parametrize("cls", SCANNERS, ids=IDS)
@settings(max_examples=300, deadline=None)
@given(value=structs(), cuts=st.lists(st.integers(0, 2000), max_size=8), tail=st.binary(max_size=5))
def test_scanner_finds_the_end_however_bytes_arrive(
    cls: type, value: object, cuts: list[int], tail: bytes
) -> None:
    body = encode(value)  # type: ignore[arg-type]
    data = b"\x01\x02" + body + tail
    assert scan_in_pieces(cls, data, 2, cuts, 10**9) == 2 + len(body)


@pytest.mark.parametrize("cls", SCANNERS, ids=IDS)
@settings(max_examples=200, deadline=None)
@given(value=structs(), cut=st.integers(0, 10_000))
def test_scanner_waits_for_missing_bytes(cls: type, value: object, cut: int) -> None:
    body = encode(value)  # type: ignore[arg-type]
    cut = cut % len(body)
    scanner = cls(0, 10**9)
    assert not scanner.scan(body, cut)
    assert scanner.scan(body, len(body))
    assert scanner.pos == len(body)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=4))
def test_both_scanners_agree_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    outcomes = []
    for cls in SCANNERS:
        try:
            outcomes.append(("end", scan_in_pieces(cls, data, 0, cuts, 200)))
        except ProtocolError:
            outcomes.append(("error", None))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("cls", SCANNERS, ids=IDS)
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x0b\x00\x01\x7f\xff\xff\xff", "string runs past"),  # a 2 GB string
        (b"\x0b\x00\x01\xff\xff\xff\xfe", "negative string length"),
        (b"\x0f\x00\x01\x0c\x7f\xff\xff\xff", "cannot fit"),  # 2**31 structs
        (b"\x0f\x00\x01\x0a\x00\x10\x00\x00", "cannot fit"),  # 1M i64s in a 200-byte limit
        (b"\x0d\x00\x01\x0b\x0b\xff\xff\xff\xff", "negative container size"),
        (b"\x14\x00\x01", "unknown field type"),
        (b"\x0f\x00\x01\x63\x00\x00\x00\x01", "unknown element type"),
    ],
)
def test_hostile_lengths_fail_before_their_bytes_arrive(
    cls: type, body: bytes, reason: str
) -> None:
    with pytest.raises(ProtocolError, match=reason):
        cls(0, 200).scan(body, len(body))


@pytest.mark.parametrize("cls", SCANNERS, ids=IDS)
def test_nesting_is_bounded(cls: type) -> None:
    deep = b"\x0c\x00\x01" * 100 + b"\x00" * 101
    with pytest.raises(ProtocolError, match="nested deeper"):
        cls(0, 10**6, 64).scan(deep, len(deep))
    assert cls(0, 10**6, 128).scan(deep, len(deep))


@pytest.mark.parametrize("cls", SCANNERS, ids=IDS)
def test_empty_containers_with_zero_element_type(cls: type) -> None:
    # Java's TBinaryProtocol writes element type 0 for some empty containers.
    body = b"\x0f\x00\x01\x00\x00\x00\x00\x00\x0d\x00\x02\x00\x00\x00\x00\x00\x00\x00"
    scanner = cls(0, 100)
    assert scanner.scan(body, len(body))
    assert scanner.pos == len(body)


@pytest.mark.parametrize("cls", SCANNERS, ids=IDS)
def test_rebase_follows_a_buffer_that_drops_its_front(cls: type) -> None:
    body = encode_header("m", 2, 1) + b"\x0b\x00\x00\x00\x00\x00\x05hello\x00"
    header = parse_header(body, 0, len(body))
    assert header is not None
    buf = bytearray(body[:12])
    scanner = cls(header.length, 10**6)
    assert not scanner.scan(buf, len(buf))
    del buf[:10]
    scanner.rebase(10)
    buf += body[12:]
    assert scanner.scan(buf, len(buf))
    assert scanner.pos == len(body) - 10


@pytest.mark.parametrize("deep", [65, 5_000])
def test_field_spans_refuse_a_struct_nested_too_deeply(deep: int) -> None:
    """The byte surgery on arguments (proxy/wire/fields.py) walks structs (nested ones with
    the scanner): a client's 5,000-deep struct must be refused, not overflow the stack."""
    from proxy.wire.fields import field_spans

    nested = b"\x0c\x00\x01" * deep + b"\x00" * (deep + 1)
    with pytest.raises(ProtocolError, match="nested"):
        field_spans(nested)
    shallow = b"\x0c\x00\x01" * 10 + b"\x00" * 11
    assert field_spans(shallow)[1] == len(shallow)


def test_reseq_puts_the_callers_seqid_in_place_and_keeps_everything_else() -> None:
    body = b"\x0c\x00\x00\x00"
    strict = encode_header("get_table", MessageType.REPLY, 7) + body
    head, at, mtype = reseq(strict, 42)
    assert head + strict[at:] == encode_header("get_table", MessageType.REPLY, 42) + body
    assert (at, mtype) == (len(strict) - len(body), MessageType.REPLY)
    assert reseq(memoryview(strict), 42) == (head, at, mtype)
    # An old client's header (strictWrite off): name length first, then name, type, seqid.
    old = struct.pack(">i", 9) + b"get_table" + bytes((MessageType.REPLY,)) + struct.pack(">i", 7)
    head, at, mtype = reseq(old + body, -1)
    assert head == old[:-4] + struct.pack(">i", -1)
    assert (at, mtype) == (len(old), MessageType.REPLY)


def _strings(items: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(item)) + item for item in items)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(st.binary(max_size=20), max_size=8).map(_strings),  # well formed
        st.binary(max_size=60),  # anything
    ),
    st.integers(-2, 10),
    st.integers(-(2**31), 2**31 - 1) | st.integers(-2, 70),
    st.integers(-1, 70),
)
def test_both_string_list_walks_agree(data: bytes, pos: int, count: int, limit: int) -> None:
    """proxy.wire.fields' walks over a list of strings (a request's partition names), in C
    and in Python: the same strings, the same end, the same refusals."""
    outcomes = []
    for read, skip in (
        (fields.py_read_strings, fields.py_skip_strings),
        (fields.read_strings, fields.skip_strings),
    ):
        try:
            outcomes.append((read(data, pos, count, limit), skip(data, pos, count, limit)))
        except ProtocolError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def test_the_c_string_list_walks_are_built() -> None:
    assert fields.read_strings is not fields.py_read_strings
    assert fields.skip_strings is not fields.py_skip_strings


def test_a_string_list_is_read_within_its_limit() -> None:
    data = _strings([b"ds=1", b"", b"ds=22"])
    for read, skip in (
        (fields.py_read_strings, fields.py_skip_strings),
        (fields.read_strings, fields.skip_strings),
    ):
        assert read(data, 0, 3, len(data)) == [b"ds=1", b"", b"ds=22"]
        assert skip(data, 0, 3, len(data)) == len(data)
        assert read(data, 8, 2, 1 << 30) == [b"", b"ds=22"]  # (the buffer bounds it too)
        for short in (len(data) - 1, 3):
            with pytest.raises(ProtocolError, match="runs past"):
                skip(data, 0, 3, short)
        with pytest.raises(ProtocolError, match="negative container size"):
            read(data, 0, -1, len(data))


@pytest.mark.parametrize(
    "value",
    [
        b"\x0f\x00\x01\x0b\xff\xff\xff\xfd",  # list<string> of -3
        b"\x0f\x00\x01\x08\xff\xff\xff\xff",  # list<i32> of -1
        b"\x0e\x00\x01\x0c\xff\xff\xff\xff",  # set<struct> of -1
        b"\x0d\x00\x01\x0b\x0b\xff\xff\xff\xff",  # map<string,string> of -1
    ],
)
def test_field_walks_refuse_negative_counts_as_the_scanner_does(value: bytes) -> None:
    body = value + b"\x00"
    with pytest.raises(ProtocolError, match="negative container size"):
        fields.field_spans(body, 0)
    with pytest.raises(ProtocolError, match="negative container size"):
        binary.StructScanner(0, 200).scan(body, len(body))


@st.composite
def _requests(draw: st.DrawFn) -> tuple[bytes, int]:
    """A struct holding a list of strings among other fields (it, or another of its id, there
    once, twice or not at all; a set instead), as it is or cut, extended or with a byte
    changed; and the id asked for."""
    fid = draw(st.sampled_from([3, -1, 7]))
    body = encode(draw(structs(2)))[:-1]  # (its STOP last)
    names = draw(st.lists(st.binary(max_size=12), max_size=5))
    kind = draw(st.sampled_from([b"\x0f", b"\x0f", b"\x0e"]))  # list, list, set
    field = kind + struct.pack(">hbi", fid, 11, len(names)) + _strings(names)
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.sampled_from([0, len(body)]))  # (first, or last: between fields)
        body = body[:at] + field + body[at:]
    data = bytearray(body + b"\x00")
    how = draw(st.sampled_from(["as it is", "as it is", "cut", "extended", "changed"]))
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "extended":
        data += draw(st.binary(min_size=1, max_size=3))
    elif how == "changed" and data:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data), draw(st.sampled_from([fid, fid, 3, 1]))


@settings(max_examples=1000, deadline=None)
@given(_requests())
def test_both_names_list_walks_agree(request: tuple[bytes, int]) -> None:
    """A request's names and its bytes without them (what an assembled hit knows it by), in
    C and in Python: the same answer, or ``None`` from both."""
    data, fid = request
    assert fields.names_list(data, fid) == fields.py_names_list(data, fid)


def test_the_names_list_walks_answer_and_refuse_alike() -> None:
    def names(fid: int, *items: bytes, kind: bytes = b"\x0f") -> bytes:
        return kind + struct.pack(">hbi", fid, 11, len(items)) + _strings(list(items))

    db = b"\x0b\x00\x01" + _strings([b"db"])

    def deep(levels: int) -> bytes:  # a field of lists in lists, a list<i32> of one inmost
        return (
            b"\x0f\x00\x09" + b"\x0f\x00\x00\x00\x01" * levels + b"\x08\x00\x00\x00\x01" + bytes(4)
        )

    def nest(levels: int) -> bytes:  # a struct's value: structs in structs, ``levels`` deep
        return b"\x0c\x00\x01" * levels + b"\x00" * (levels + 1)

    cases = {
        db + names(3, b"ds=1", b"ds=2") + b"\x00": (db + b"\x00", [b"ds=1", b"ds=2"]),
        names(3) + db + b"\x00": (db + b"\x00", []),
        db + names(3, b"x") + names(3, b"y") + b"\x00": None,  # twice
        db + names(3, b"x", kind=b"\x0e") + b"\x00": None,  # a set
        db + b"\x00": None,  # none
        db + names(3, b"x"): None,  # no end
        db + names(3, b"x") + b"\x00\x00": None,  # more after it
        # As deep as a value may go (its inmost items at depth 64), and deeper.
        names(3, b"x") + deep(63) + b"\x00": (deep(63) + b"\x00", [b"x"]),
        names(3, b"x") + deep(64) + b"\x00": None,
        # A struct in a list is one step deeper than a field's: 62 structs in it, not 63.
        names(3) + b"\x0f\x00\x09\x0c\x00\x00\x00\x01" + nest(62) + b"\x00": (b"", []),
        names(3) + b"\x0f\x00\x09\x0c\x00\x00\x00\x01" + nest(63) + b"\x00": None,
        names(3) + b"\x0c\x00\x09" + nest(63) + b"\x00": (b"", []),
        names(3) + b"\x0c\x00\x09" + nest(64) + b"\x00": None,
        # Negative counts, of items of a fixed size, of strings, of a map's pairs.
        names(3) + b"\x0f\x00\x09\x08\xff\xff\xff\xff\x00": None,
        names(3) + b"\x0f\x00\x09\x0b\xff\xff\xff\xfd\x00": None,
        names(3) + b"\x0d\x00\x09\x08\x08\xff\xff\xff\xff\x00": None,
        # A map's values skipped by their own type.
        names(3) + b"\x0d\x00\x09\x03\x08\x00\x00\x00\x01\x01" + bytes(4) + b"\x00": (b"", []),
    }
    for data, expected in cases.items():
        for walk in (fields.py_names_list, fields.names_list):
            got = walk(data, 3)
            if expected == (b"", []):  # (found, whatever the rest)
                assert got is not None and got[1] == [], (walk, data)
            else:
                assert got == expected, (walk, data)
    assert fields.names_list is not fields.py_names_list
