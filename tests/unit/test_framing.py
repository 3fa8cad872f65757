"""Message boundaries on buffered and framed byte streams."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire.binary import MessageType
from proxy.wire.errors import MessageTooLarge, ProtocolError
from proxy.wire.framing import MessageReader, Transport, whole_message
from tests.thrift_values import encode, message, structs

TRANSPORTS = [Transport.BUFFERED, Transport.FRAMED]


def feed_in_pieces(reader: MessageReader, wire: bytes, cuts: list[int]) -> list[bytes]:
    points = [*sorted({c for c in cuts if 0 < c < len(wire)}), len(wire)]
    got, last = [], 0
    for end in points:
        reader.feed(wire[last:end])
        last = end
        while (msg := reader.next_message()) is not None:
            got.append(msg.data)
    return got


@pytest.mark.parametrize("transport", TRANSPORTS)
@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(structs(2), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 3000), max_size=10),
    strict=st.booleans(),
)
def test_pipelined_messages_come_out_whole(
    transport: Transport, bodies: list[object], cuts: list[int], strict: bool
) -> None:
    messages = [
        message(f"call_{i}", MessageType.CALL, i, encode(b), strict)  # type: ignore[arg-type]
        for i, b in enumerate(bodies)
    ]
    wire = b"".join(transport.frame(m) for m in messages)
    reader = MessageReader(transport, 1 << 20)
    assert feed_in_pieces(reader, wire, cuts) == messages
    assert reader.buffered == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
@settings(max_examples=150, deadline=None)
@given(body=structs(2), cut=st.integers(0, 3000), extra=st.binary(min_size=1, max_size=8))
def test_whole_message_is_one_complete_message_and_nothing_else(
    transport: Transport, body: object, cut: int, extra: bytes
) -> None:
    # What the listener's shortcut answers at once: a piece that is exactly one message.
    # Anything else (a part, a message and more, garbage) is left to a MessageReader.
    data = message("get_table", MessageType.CALL, 3, encode(body))  # type: ignore[arg-type]
    wire = transport.frame(data)
    found = whole_message(wire, transport, 1 << 20)
    assert found is not None and found.data == data and found.header.seqid == 3
    assert whole_message(wire[: cut % len(wire)], transport, 1 << 20) is None
    assert whole_message(wire + extra, transport, 1 << 20) is None
    assert whole_message(wire, transport, len(data) - 1) is None  # over the size limit


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("keep", [True, False])
@settings(max_examples=100, deadline=None)
@given(body=structs(3), cuts=st.lists(st.integers(0, 3000), max_size=10))
def test_streaming_hands_out_every_byte_once(
    transport: Transport, keep: bool, body: object, cuts: list[int]
) -> None:
    msg = message("get_partitions", MessageType.REPLY, 9, encode(body))  # type: ignore[arg-type]
    wire = transport.frame(msg)
    reader = MessageReader(transport, 1 << 20, keep=keep)
    points = [*sorted({c for c in cuts if 0 < c < len(wire)}), len(wire)]
    out, last, finished = b"", 0, None
    for end in points:
        reader.feed(wire[last:end])
        last = end
        piece = reader.take()
        if piece is None:
            continue
        assert piece.header.name == "get_partitions"
        out += piece.data
        if piece.last:
            finished = piece
    assert out == msg
    assert finished is not None
    assert (finished.message is not None) == keep
    if keep:
        assert finished.message is not None and finished.message.data == msg


def test_streaming_never_holds_the_whole_reply() -> None:
    body = (
        b"\x0f\x00\x00\x0b"
        + struct.pack(">i", 1000)
        + (struct.pack(">i", 1000) + b"x" * 1000) * 1000
        + b"\x00"
    )
    msg = message("get_partition_names", MessageType.REPLY, 1, body)
    reader = MessageReader(Transport.BUFFERED, 1 << 30, keep=False)
    peak, got = 0, 0
    for i in range(0, len(msg), 4096):
        reader.feed(msg[i : i + 4096])
        piece = reader.take()
        peak = max(peak, reader.buffered)
        if piece is not None:
            got += len(piece.data)
    assert got == len(msg)
    assert peak <= 4096 + 64


def test_a_2gb_frame_is_refused_at_once() -> None:
    reader = MessageReader(Transport.FRAMED, 64 << 20)
    reader.feed(struct.pack(">i", 2**31 - 1) + b"\x80\x01")
    with pytest.raises(MessageTooLarge):
        reader.next_message()


def test_a_declared_2gb_string_is_refused_at_once() -> None:
    reader = MessageReader(Transport.BUFFERED, 64 << 20)
    reader.feed(message("create_table", 1, 1, b"\x0b\x00\x01" + struct.pack(">i", 2**31 - 1)))
    with pytest.raises(ProtocolError):
        reader.next_message()


def test_buffered_message_over_the_limit_is_refused() -> None:
    reader = MessageReader(Transport.BUFFERED, 1000)
    reader.feed(
        message(
            "alter_table", 1, 1, b"\x0b\x00\x01" + struct.pack(">i", 990) + b"y" * 990 + b"\x00"
        )
    )
    with pytest.raises(MessageTooLarge):
        reader.next_message()


def test_frame_and_struct_must_agree() -> None:
    msg = message("get_table", 1, 1, b"\x00")
    short = MessageReader(Transport.FRAMED, 1000)
    short.feed(struct.pack(">i", len(msg) + 3) + msg + b"abc")
    with pytest.raises(ProtocolError, match="after its message"):
        short.next_message()
    long = MessageReader(Transport.FRAMED, 1000)
    body = msg[:-1] + b"\x0b\x00\x01\x00\x00\x00\x10"
    long.feed(struct.pack(">i", len(body)) + body)
    with pytest.raises(ProtocolError, match="past the end of its frame"):
        long.next_message()


def test_garbage_is_a_protocol_error() -> None:
    reader = MessageReader(Transport.BUFFERED, 1 << 20)
    reader.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(ProtocolError):
        reader.next_message()
