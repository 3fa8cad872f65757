"""The C twins of a request's first steps give the Python ones' answers.

``parse_header`` (every message read), ``whole_header`` (is this read exactly one message?)
and ``without_seqid`` (a call known by its bytes) run in C on every request (see
``_scanner.c``); their Python twins are the reference. Each pair is held to the same answers,
errors included, over well-formed messages, their cuts and extensions, and bytes flipped at
random.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.wire import binary, framing
from proxy.wire.binary import MessageHeader
from proxy.wire.errors import ProtocolError
from tests.thrift_values import encode, message, structs

pytestmark = pytest.mark.skipif(not binary.ACCELERATED, reason="the C twins are not built")

A_CALL = b"\x80\x01\x00\x01\x00\x00\x00\x01x\x00\x00\x00\x07\x00"  # x(), seqid 7
NAMES = st.one_of(
    st.sampled_from(["get_table", "get_partitions_by_names", "x", "é"]),
    st.binary(min_size=1, max_size=12).map(lambda raw: raw.decode("latin-1")),
)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    """A message (strict or old header), as it is or cut, extended, framed, or with a byte
    flipped: what a client or a metastore may send."""
    name = draw(NAMES)
    body = encode(draw(structs(2)))
    mtype = draw(st.integers(0, 255))
    seqid = draw(st.integers(-(2**31), 2**31 - 1))
    strict = draw(st.booleans())
    # (An old header's type is one byte, which the encoder takes signed.)
    data = message(name, mtype if strict or mtype < 128 else mtype - 256, seqid, body, strict)
    raw = draw(st.sampled_from([b"", b"", b"", b"\xff", b"\xc3\x28"]))  # names not UTF-8
    if raw and data[:1] == b"\x80":
        data = data[:8] + raw + data[8 + len(raw) :]
    if draw(st.booleans()):
        data = struct.pack(">i", len(data) + draw(st.sampled_from([0, 0, 0, 1, -1]))) + data
    how = draw(st.sampled_from(["as it is", "cut", "extended", "flipped"]))
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "extended":
        data += draw(st.binary(min_size=1, max_size=4))
    elif how == "flipped" and data:
        out = bytearray(data)
        out[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        data = bytes(out)
    return data


def outcome(call: object, *args: object) -> object:
    try:
        return ("ok", call(*args))  # type: ignore[operator]
    except ProtocolError as exc:
        return ("error", str(exc))


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(messages(), st.binary(max_size=64)), start=st.integers(0, 6))
@example(data=b"\x80\x01\x00\x01\x00\x00\x00\x00", start=0)  # no name
@example(data=b"\x80\x02\x00\x01" + b"\x00" * 12, start=0)  # another version
@example(data=b"\x00\x00\x04\x01" + b"\x00" * 12, start=0)  # a name longer than the limit
def test_parse_header_twins_agree(data: bytes, start: int) -> None:
    for end in {len(data), len(data) // 2, min(len(data), start + 12)}:
        if start > end:
            continue
        c = outcome(binary.parse_header, data, start, end)
        py = outcome(binary.py_parse_header, data, start, end)
        assert c == py
        if c[0] == "ok" and c[1] is not None:
            assert type(c[1]) is MessageHeader and hash(c[1]) == hash(py[1])


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(messages(), st.binary(max_size=64)),
    framed=st.booleans(),
    limit=st.sampled_from([-1, 0, 1, 1 << 20]),
)
@example(data=struct.pack(">i", 14) + A_CALL, framed=True, limit=0)  # a frame that claims more
@example(data=struct.pack(">i", 12) + A_CALL, framed=True, limit=0)  # one that claims less
@example(data=A_CALL, framed=False, limit=0)
def test_whole_header_twins_agree(data: bytes, framed: bool, limit: int) -> None:
    # The size limit: just under, at, and over a message's own size, or far over.
    max_size = len(data) - (4 if framed else 0) + limit
    c = framing.whole_header(data, framed, max_size)
    py = framing.py_whole_header(data, framed, max_size)
    assert c == py
    assert c is None or (type(c) is MessageHeader and hash(c) == hash(py))


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(messages(), st.binary(max_size=64)), framed=st.booleans())
@example(data=b"\x80\x01\x00\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00", framed=False)  # no name
@example(data=b"\x80\x01\x00\x01\x00\x00\x00\x01x\x00\x00\x00\x05", framed=False)  # seqid last
@example(data=b"\x80\x01\x00\x01\x00\x00\x00\x02xy\x00\x00\x00", framed=False)  # cut in it
@example(data=b"\x80\x01\x00\x01\x00\x00\x00\x05xy\x00\x00\x00", framed=False)  # past the end
@example(data=b"\x80\x01\x00\x01\xff\xff\xff\xfe\x00\x00\x00\x05\x00", framed=False)
def test_without_seqid_twins_agree(data: bytes, framed: bool) -> None:
    assert framing.without_seqid(data, framed) == framing.py_without_seqid(data, framed)


def test_the_twins_agree_at_the_nesting_limit() -> None:
    # A call's arguments nested 63 structs deep are one whole message; 64 are refused, by
    # both (the random messages above nest 2 deep).
    for depth, whole in ((62, True), (63, True), (64, False), (65, False)):
        data = message("x", 1, 7, b"\x0c\x00\x01" * depth + b"\x00" * (depth + 1))
        for framed in (False, True):
            wire = struct.pack(">i", len(data)) + data if framed else data
            c = framing.whole_header(wire, framed, 1 << 20)
            assert c == framing.py_whole_header(wire, framed, 1 << 20)
            assert (c is not None) is whole, (depth, framed)


def test_the_twins_find_a_whole_call() -> None:
    # (So that the random cases above are not all refusals.)
    data = message("get_table", 1, 7, b"\x0b\x00\x01\x00\x00\x00\x01x\x00")
    for framed in (False, True):
        wire = struct.pack(">i", len(data)) + data if framed else data
        header = framing.whole_header(wire, framed, 1 << 20)
        assert header == MessageHeader("get_table", 1, 7, True, 4 + 4 + 9 + 4)
        rest, seqid = framing.without_seqid(wire, framed) or (b"", 0)
        assert (rest, seqid) == (data[:17] + data[21:], 7)


def test_the_twins_know_a_call_by_its_bytes_up_to_the_same_size() -> None:
    # (The C twin has its own copy of the limit: the two must meet at it.) A call of
    # exactly REPEAT_BYTES is known by its bytes, one byte more is not, framed or not.
    head = message("get_partitions_by_names", 1, 7, b"")
    for extra, known in ((-1, True), (0, True), (1, False)):
        pad = binary.REPEAT_BYTES + extra - len(head) - 8  # (a string field, then the stop)
        data = message("get_partitions_by_names", 1, 7, b"\x0b\x00\x01" + struct.pack(">i", pad))
        data += b"x" * pad + b"\x00"
        assert len(data) == binary.REPEAT_BYTES + extra
        for framed in (False, True):
            wire = struct.pack(">i", len(data)) + data if framed else data
            c = framing.without_seqid(wire, framed)
            assert c == framing.py_without_seqid(wire, framed)
            assert (c is not None) is known, (extra, framed)
            if known:
                assert c == (data[:31] + data[35:], 7)  # (the seqid: bytes 31-34)
