"""A client connection's state machine (proxy.conn.machine), fed chosen chunks and times."""

from __future__ import annotations

import struct

import pytest

from proxy import idl
from proxy.conn.machine import Call, ClientMachine, Close, Limits, Refuse, State
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.framing import Transport

MESSAGE_TIMEOUT, IDLE_TIMEOUT = 5.0, 30.0


def machine(transport: Transport = Transport.BUFFERED, **options: float) -> ClientMachine:
    limits = Limits.of(
        transport,
        max_request_bytes=int(options.get("max_request_bytes", 1 << 20)),
        message_timeout=MESSAGE_TIMEOUT,
        idle_timeout=options.get("idle_timeout", IDLE_TIMEOUT),
    )
    return ClientMachine(limits, 0.0)


def call(seqid: int, table: str = "t", transport: Transport = Transport.BUFFERED) -> bytes:
    data = idl.encode_call("get_table", seqid, dbname="db", tbl_name=table)
    return transport.frame(data) if transport is Transport.FRAMED else data


@pytest.mark.parametrize("transport", [Transport.BUFFERED, Transport.FRAMED])
def test_a_call_alone_in_its_chunk_is_offered_whole(transport: Transport) -> None:
    m = machine(transport)
    data = call(1, transport=transport)
    assert m.whole_chunk_welcome()
    decision = m.received(data, 1.0)
    assert isinstance(decision, Call) and decision.whole == data and not decision.tried
    assert decision.message.header.seqid == 1 and m.state is State.ANSWERING
    assert not m.whole_chunk_welcome()
    assert m.answered(2.0) is None and m.state is State.IDLE and m.calls == 1


def test_a_call_declined_whole_is_handed_out_tried() -> None:
    m = machine()
    decision = m.received(call(1), 1.0, tried=True)
    assert isinstance(decision, Call) and decision.whole is None and decision.tried


def test_a_call_answered_whole_leaves_the_machine_idle_with_its_clock_restarted() -> None:
    m = machine()
    m.answered_whole(20.0)
    assert m.state is State.IDLE and m.calls == 1
    assert m.tick(20.0 + IDLE_TIMEOUT - 0.1) is None
    closed = m.tick(20.0 + IDLE_TIMEOUT)
    assert closed == Close("idle", f"idle for {IDLE_TIMEOUT:g} s") and m.state is State.CLOSED


@pytest.mark.parametrize("cut", [1, 4, 11, -1])
def test_a_call_in_parts_is_handed_out_once_whole_never_as_whole_bytes(cut: int) -> None:
    m = machine()
    data = call(7)
    assert m.received(data[:cut], 1.0) is None and m.state is State.RECEIVING
    assert not m.whole_chunk_welcome()
    decision = m.received(data[cut:], 2.0)
    assert isinstance(decision, Call) and decision.whole is None
    assert decision.message.data == data


def test_a_call_must_be_whole_by_its_deadline_from_its_first_byte() -> None:
    m = machine()
    data = call(1)
    m.received(data[:5], 10.0)
    for at in (11.0, 13.0, 14.9):  # trickled in: the deadline does not move
        assert m.received(data[5:6] if at == 11.0 else b"", at) is None
        assert m.tick(at) is None
    assert m.due() == 10.0 + MESSAGE_TIMEOUT
    closed = m.tick(15.0)
    assert isinstance(closed, Close) and closed.reason == "timeout" and "6 bytes" in closed.text


def test_calls_pipelined_are_answered_one_after_the_other() -> None:
    m = machine()
    first = m.received(call(1) + call(2) + call(3)[:9], 1.0)
    assert isinstance(first, Call) and first.whole is None and first.message.header.seqid == 1
    assert m.received(call(3)[9:], 1.5) is None  # kept: the first is being answered
    assert m.due() is None and m.tick(1000.0) is None  # (no clock while answering)
    second = m.answered(2.0)
    assert isinstance(second, Call) and second.message.header.seqid == 2
    third = m.answered(3.0)
    assert isinstance(third, Call) and third.message.header.seqid == 3
    assert m.answered(4.0) is None and m.state is State.IDLE and m.calls == 3


def test_what_a_client_pipelines_without_end_is_not_read_into_memory() -> None:
    m = machine(max_request_bytes=100_000)
    assert isinstance(m.received(call(1), 1.0), Call)
    while not m.full:
        assert m.received(call(2), 1.0) is None
    assert m.buffered >= 64 * 1024
    assert isinstance(m.answered(2.0), Call) and not m.full


def test_a_client_that_ends_its_side_is_answered_first() -> None:
    m = machine()
    assert isinstance(m.received(call(1) + call(2), 1.0), Call)
    assert m.ended() is None  # answering: the reply still goes out
    second = m.answered(2.0)
    assert isinstance(second, Call) and second.message.header.seqid == 2
    assert m.answered(3.0) == Close("ended") and m.state is State.CLOSED


@pytest.mark.parametrize(
    ("sent", "reason"),
    [(b"", "ended"), (b"\x80\x01", "ended_mid_call")],
)
def test_a_client_that_ends_its_side_between_calls_is_closed(sent: bytes, reason: str) -> None:
    m = machine()
    m.received(sent, 1.0)
    closed = m.ended()
    assert isinstance(closed, Close) and closed.reason == reason and m.state is State.CLOSED


def test_a_client_ending_after_part_of_a_pipelined_call_is_closed_once_answered() -> None:
    m = machine()
    assert isinstance(m.received(call(1) + call(2)[:10], 1.0), Call)
    assert m.ended() is None
    closed = m.answered(2.0)
    assert isinstance(closed, Close) and closed.reason == "ended_mid_call"


def test_bad_input_is_refused_naming_the_caller_when_it_can() -> None:
    m = machine()
    head = encode_header("get_table", MessageType.CALL, 9)
    refused = m.received(head + b"\x0b\x00\x01\xff\xff\xff\xff", 1.0)  # a negative length
    assert isinstance(refused, Refuse) and refused.reason == "protocol"
    assert refused.header is not None and refused.header.seqid == 9
    assert m.state is State.CLOSED and m.received(call(2), 2.0) is None


def test_a_message_that_is_not_a_call_is_refused() -> None:
    m = machine()
    reply = encode_header("get_table", MessageType.REPLY, 4) + b"\x00"
    refused = m.received(reply, 1.0)
    assert isinstance(refused, Refuse) and refused.reason == "bad_message_type"
    assert refused.header is not None and refused.header.name == "get_table"


def test_a_request_over_the_limit_is_refused_as_soon_as_its_frame_says_so() -> None:
    m = machine(Transport.FRAMED, max_request_bytes=1000)
    refused = m.received(struct.pack(">i", 5000) + b"\x80\x01", 1.0)
    assert isinstance(refused, Refuse) and refused.reason == "too_large"


def test_a_connection_without_an_idle_timeout_idles_forever() -> None:
    m = machine(idle_timeout=0)
    assert m.due() is None and m.tick(1e9) is None
