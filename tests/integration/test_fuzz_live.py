"""A running proxy given a few hundred hostile inputs, each on its own connection.

The inputs come from the fuzz mutator (``tests/fuzz``), seeded with a fixed number, some of
them pipelined after a well-formed call. For every connection the outcome is predicted from
the bytes alone: one reply per complete call, in order, with its seqid; then, when the
stream breaks the protocol and its header was readable, one ``TApplicationException``
(``PROTOCOL_ERROR``, or ``INVALID_MESSAGE_TYPE`` for a message that is not a call), then the
close; a stream that stops halfway is closed by ``--client-message-timeout``. Nothing may
hang, the proxy stays up, its memory stays where it was, and a good call afterwards gets
the metastore's answer.

Between the proxy and the HMS sits a gate: it forwards only the well-formed calls the test
itself makes, and answers anything else with a ``TApplicationException`` (as a metastore
that cannot use a request does). Mutated calls must not reach the shared test metastore:
they include writes, and requests that desynchronise Java's Thrift decoder into allocating
gigabytes.

Every input first passes the local fuzz target (``tests/fuzz/targets.py``); an input it
fails on fails this test. The tests at the end replay, against the running proxy, the bugs
the fuzzer found (all fixed).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proxy import idl
from proxy.wire.binary import AppErrorType, MessageHeader, MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, MessageReader, Transport
from tests.conftest import ProxyFactory
from tests.fuzz import targets, thrift
from tests.fuzz.mutate import Mutator
from tests.fuzz.seeds import seeds
from tests.rig import calls, raw
from tests.rig.hms import MetastoreServer
from tests.rig.ports import free_port
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import Sample
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

MiB = 1 << 20
LIVE_SEED = 20240601
INPUTS = 300
GOOD_METHODS = ("get_database", "get_table", "get_partitions_by_names", "get_all_databases")
HANG = 20.0  # seconds a connection may take to end: far past every timeout that applies
_I32 = struct.Struct(">i")


# -- the gate between proxy and metastore ------------------------------------------------------


def _read_message(sock: socket.socket, buf: bytearray) -> bytes | None:
    """One whole message from ``sock`` (strict header, then a struct), or ``None`` at EOF."""
    while True:
        if len(buf) >= 8:
            (name_len,) = _I32.unpack_from(buf, 4)
            start = 12 + name_len
            if len(buf) >= start:
                try:
                    _, end = thrift.parse(bytes(buf), thrift.STRUCT, start)
                except thrift.Malformed:
                    pass  # not all here yet
                else:
                    message = bytes(buf[:end])
                    del buf[:end]
                    return message
        chunk = sock.recv(1 << 16)
        if not chunk:
            return None
        buf += chunk


def _normalized(message: bytes) -> bytes:
    """The message with its seqid zeroed (strict header)."""
    (name_len,) = _I32.unpack_from(message, 4)
    at = 8 + name_len
    return message[:at] + bytes(4) + message[at + 4 :]


def _exception(name: bytes, seqid: int, text: bytes) -> bytes:
    body = b"\x0b\x00\x01" + _I32.pack(len(text)) + text + b"\x08\x00\x02" + _I32.pack(6) + b"\0"
    head = struct.pack(">Ii", 0x80010003, len(name)) + name + _I32.pack(seqid)
    return head + body


class Gate:
    """Forwards the calls it was given to the HMS, byte for byte (seqid aside); answers any
    other call with a ``TApplicationException``, except calls of methods the IDL declares
    ``oneway`` (like the HMS, whose libthrift answers by the IDL, whatever the message type)."""

    def __init__(self, hms: MetastoreServer, allowed: list[bytes]) -> None:
        self.hms = hms
        self.allowed = {_normalized(m) for m in allowed}
        self.port = free_port()
        self.forwarded = 0
        self.refused = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> Gate:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()
        self._thread.join(10)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        upstream: socket.socket | None = None
        inbound, outbound = bytearray(), bytearray()
        try:
            while (request := _read_message(sock, inbound)) is not None:
                (name_len,) = _I32.unpack_from(request, 4)
                name = request[8 : 8 + name_len]
                (seqid,) = _I32.unpack_from(request, 8 + name_len)
                if _normalized(request) in self.allowed or request == _status_call(seqid):
                    if upstream is None:
                        upstream = socket.create_connection((self.hms.host, self.hms.port), 30)
                        with self._lock:
                            self._sockets.append(upstream)
                    upstream.sendall(request)
                    reply = _read_message(upstream, outbound)
                    if reply is None:
                        return
                    self.forwarded += 1
                    sock.sendall(reply)
                elif name.decode() in idl.oneway_methods():
                    self.refused += 1  # no reply: the HMS answers by the IDL, not the type
                else:
                    sock.sendall(_exception(name, seqid, b"gate: not forwarded"))
                    self.refused += 1  # counted once its answer is on the way
        except OSError:
            pass
        finally:
            sock.close()
            if upstream is not None:
                upstream.close()


def _status_call(seqid: int) -> bytes:
    return idl.encode_call("getStatus", seqid)


# -- what each connection should see -----------------------------------------------------------


@dataclass
class Expected:
    calls: list[Message] = field(default_factory=list)  # calls the proxy handles, in order
    ending: str = "clean"  # clean | incomplete | refused | dropped | not_a_call
    header: MessageHeader | None = None  # the one a refusal names


def predict(data: bytes) -> Expected:
    """What the proxy does with ``data`` (README, "Behaviour in detail")."""
    out = Expected()
    reader = MessageReader(Transport.BUFFERED, MiB)
    reader.feed(data)
    try:
        while (message := reader.next_message()) is not None:
            if message.header.type not in (MessageType.CALL, MessageType.ONEWAY):
                out.ending, out.header = "not_a_call", message.header
                return out
            out.calls.append(message)
    except ProtocolError:
        out.header = reader.header
        out.ending = "refused" if reader.header is not None else "dropped"
        return out
    out.ending = "clean" if reader.buffered == 0 else "incomplete"
    return out


def _answered(message: Message) -> bool:
    """Whether the client gets a reply: not when it sent the call as ONEWAY (the proxy reads
    the metastore's answer and drops it), nor for a method the IDL declares oneway."""
    h = message.header
    return h.type == MessageType.CALL and h.name not in idl.oneway_methods()


def split_replies(data: bytes) -> tuple[list[tuple[str, int, int, bytes]], bytes]:
    """(name, type, seqid, whole message) of each reply; and bytes left over."""
    out = []
    pos = 0
    while pos + 8 <= len(data):
        (name_len,) = _I32.unpack_from(data, pos + 4)
        start = pos + 12 + name_len
        try:
            _, end = thrift.parse(data, thrift.STRUCT, start)
            (seqid,) = _I32.unpack_from(data, start - 4)
        except (thrift.Malformed, struct.error):
            break
        name = data[pos + 8 : pos + 8 + name_len].decode("utf-8", "replace")
        out.append((name, data[pos + 3], seqid, data[pos:end]))
        pos = end
    return out, data[pos:]


def application_error_type(reply: bytes) -> int | None:
    (name_len,) = _I32.unpack_from(reply, 4)
    tree, _ = thrift.parse(reply, thrift.STRUCT, 12 + name_len)
    assert isinstance(tree, thrift.Struct)
    for f in tree.fields:
        if f.fid == 2 and isinstance(f.value, thrift.Scalar):
            return int(_I32.unpack(f.value.raw)[0])
    return None


@dataclass
class Outcome:
    received: bytes
    ended: bool
    seconds: float


def exchange(port: int, data: bytes, half_close: bool) -> Outcome:
    """Send ``data`` on a fresh connection; read until the proxy ends it (or ``HANG``)."""
    began = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG)
    received = bytearray()
    ended = False
    try:
        if data:
            sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        while time.monotonic() - began < HANG:
            sock.settimeout(max(0.1, HANG - (time.monotonic() - began)))
            chunk = sock.recv(1 << 16)
            if not chunk:
                ended = True
                break
            received += chunk
    except (ConnectionResetError, BrokenPipeError):
        ended = True
    except TimeoutError:
        pass
    finally:
        sock.close()
    return Outcome(bytes(received), ended, time.monotonic() - began)


def check_connection(data: bytes, outcome: Outcome, answers: dict[bytes, bytes]) -> list[str]:
    """Everything wrong with one connection's outcome (empty: all as predicted)."""
    expected = predict(data)
    problems = []
    if not outcome.ended:
        problems.append(f"still open after {outcome.seconds:.1f} s ({expected.ending})")
    replies, rest = split_replies(outcome.received)
    if rest:
        problems.append(f"{len(rest)} bytes after the last whole reply")
    answered = [m for m in expected.calls if _answered(m)]
    for call, reply in zip(answered, replies, strict=False):
        name, mtype, seqid, whole = reply
        if (name, seqid) != (call.header.name, call.header.seqid) or mtype not in (2, 3):
            problems.append(f"reply {name!r}/{seqid}/{mtype} to call {call.header}")
        known = answers.get(_normalized(call.data) if call.header.strict else b"")
        if known is not None and not raw.same_result(name, whole, known):
            problems.append(f"wrong answer to the well-formed {name} call")
    extra = replies[len(answered) :]
    if len(replies) < len(answered):
        problems.append(f"{len(replies)} replies to {len(answered)} calls")
    if expected.ending in ("refused", "not_a_call"):
        assert expected.header is not None
        kind = (
            AppErrorType.INVALID_MESSAGE_TYPE
            if expected.ending == "not_a_call"
            else AppErrorType.PROTOCOL_ERROR
        )
        if len(extra) != 1:
            problems.append(f"{len(extra)} messages for the refused {expected.header}")
        else:
            name, mtype, seqid, whole = extra[0]
            if (name, mtype, seqid) != (expected.header.name, 3, expected.header.seqid):
                problems.append(f"refusal {name!r}/{mtype}/{seqid} for {expected.header}")
            elif application_error_type(whole) != kind:
                problems.append(f"refusal of type {application_error_type(whole)}, not {kind}")
    elif extra:
        problems.append(f"{len(extra)} unexpected messages ({expected.ending})")
    return problems


# -- the test ------------------------------------------------------------------------------------


def _good_calls(sample: Sample) -> list[bytes]:
    return [
        calls.read_request(method, 1000 + i, sample, missing=False)
        for i, method in enumerate(GOOD_METHODS)
    ]


def corpus(good: list[bytes], count: int) -> Iterator[tuple[bytes, bool]]:
    """(input, half-close after sending) pairs: mutated calls, every fourth one pipelined
    after a well-formed call."""
    rng = random.Random(LIVE_SEED)
    mutator = Mutator(seeds(), rng)
    made = 0
    while made < count:
        data = mutator.input()
        if made % 4 == 0:
            data = rng.choice(good) + data
        targets.check(data, max_size=MiB)  # raises Failure: the local target found a bug
        made += 1
        yield data, predict(data).ending == "clean"


def vm_hwm(proxy: ProxyProcess) -> int:
    assert proxy.process is not None
    for line in Path(f"/proc/{proxy.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


@contextlib.contextmanager
def gated_proxy(
    proxy_factory: ProxyFactory, hms: MetastoreServer, sample: Sample, *args: str
) -> Iterator[tuple[ProxyProcess, Gate, dict[bytes, bytes]]]:
    """A proxy (``args`` added, follower off) whose metastore is behind a Gate that lets the
    good calls through; with the metastore's own answers to those."""
    good = _good_calls(sample)
    answers = {_normalized(g): raw.call(hms.host, hms.port, g) for g in good}
    gate = Gate(hms, good).start()
    try:
        proxy = proxy_factory(
            "--notifications", "off", *args, upstream=f"thrift://127.0.0.1:{gate.port}"
        )
        yield proxy, gate, answers
    finally:
        gate.stop()


@pytest.fixture
def gated(
    proxy_factory: ProxyFactory, hms: MetastoreServer, sample: Sample
) -> Iterator[tuple[ProxyProcess, Gate, dict[bytes, bytes]]]:
    with gated_proxy(
        proxy_factory, hms, sample, "--max-request-bytes", "1MiB", "--client-message-timeout", "1"
    ) as gated:
        yield gated


def test_hostile_inputs_end_cleanly(
    gated: tuple[ProxyProcess, Gate, dict[bytes, bytes]], sample: Sample
) -> None:
    proxy, gate, answers = gated
    good = _good_calls(sample)
    for request in good:  # warm: the good paths have run once before memory is measured
        reply = raw.call("127.0.0.1", proxy.port, request)
        assert raw.same_result(_name(request), reply, answers[_normalized(request)])
    rss_before = proxy.rss_bytes()
    hwm_before = vm_hwm(proxy)
    inputs = list(corpus(good, INPUTS))
    with ThreadPoolExecutor(max_workers=24) as pool:
        outcomes = list(pool.map(lambda item: exchange(proxy.port, *item), inputs))
    problems = {}
    for (data, _), outcome in zip(inputs, outcomes, strict=True):
        found = check_connection(data, outcome, answers)
        if found:
            problems[data.hex()[:160]] = found
    assert not problems, f"{len(problems)} of {len(inputs)} connections: {problems}"
    assert proxy.alive()
    assert internal_errors(proxy) == 0
    assert "internal error" not in proxy.log()
    assert proxy.rss_bytes() < rss_before + 64 * MiB
    assert vm_hwm(proxy) < max(hwm_before, rss_before) + 64 * MiB
    assert gate.refused > 0  # the mutated calls did get to the proxy's forwarding path
    for request in good:
        reply = raw.call("127.0.0.1", proxy.port, request)
        assert raw.same_result(_name(request), reply, answers[_normalized(request)])
    assert proxy.metric("hmsproxy_client_errors_total", reason="protocol") > 0


def _name(message: bytes) -> str:
    (name_len,) = _I32.unpack_from(message, 4)
    return message[8 : 8 + name_len].decode()


def internal_errors(proxy: ProxyProcess) -> float:
    return proxy.metric_sum("hmsproxy_requests_total", outcome="internal_error")


# -- the bugs the fuzzer found, against a running proxy -------------------------------------------


@pytest.fixture
def one_connection(
    proxy_factory: ProxyFactory, hms: MetastoreServer, sample: Sample
) -> Iterator[tuple[ProxyProcess, Gate, dict[bytes, bytes]]]:
    """A gated proxy with a single metastore connection, which every client shares, and no
    cache: every call goes out on that connection."""
    args = ("--upstream-max-connections", "1", "--upstream-max-idle", "1", "--cache", "off")
    with gated_proxy(proxy_factory, hms, sample, *args) as gated:
        yield gated


def test_a_oneway_typed_call_answers_nobody_else(
    one_connection: tuple[ProxyProcess, Gate, dict[bytes, bytes]], sample: Sample
) -> None:
    proxy, gate, answers = one_connection
    request = _good_calls(sample)[0]  # get_database, as the gate lets it through
    attack = (
        struct.pack(">Ii", 0x80010004, len(b"get_config_value"))
        + b"get_config_value"
        + _I32.pack(1)
        + idl.encode(idl.args_class("get_config_value")(name="x", defaultValue="y"))
    )

    def attack_then_ask() -> bytes:
        refused = gate.refused
        asked = proxy.metric_sum("hmsproxy_upstream_requests_total", method="get_database")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as attacker:
            attacker.sendall(attack)
            # The bug's path: the metastore has answered the call the attacker sent as
            # ONEWAY, on the one pooled connection, before the next client's call goes out...
            eventually(
                lambda: gate.refused > refused,
                what="the metastore to answer the ONEWAY-typed call",
            )
            reply = raw.call("127.0.0.1", proxy.port, request)
        # ... and that call went out on it (to the metastore, not to a cache).
        eventually(
            lambda: (
                proxy.metric_sum("hmsproxy_upstream_requests_total", method="get_database") > asked
            ),
            what="the next call to go out to the metastore",
        )
        return reply

    for _ in range(3):
        reply = attack_then_ask()
        assert raw.same_result("get_database", reply, answers[_normalized(request)]), reply


def straddling_head(limit: int, step: int) -> bytes:
    """A get_table header and a string field, so long that fields of ``step`` bytes after it
    put a field header across byte ``limit`` (not a value, which the scanner would refuse)."""
    for pad in range(step):
        head = (
            struct.pack(">Ii", 0x80010001, 9)
            + b"get_table"
            + _I32.pack(1)
            + b"\x0b\x00\x62"
            + _I32.pack(pad)
            + b"p" * pad
        )
        if (limit - len(head)) % step in (0, 1, 2):
            return head
    raise AssertionError("no padding puts a field header across the limit")


def test_a_request_past_the_limit_is_refused_however_it_is_cut(
    proxy_factory: ProxyFactory, sample: Sample
) -> None:
    proxy = proxy_factory("--max-request-bytes", "1MiB", "--client-message-timeout", "1")
    hwm_before = vm_hwm(proxy)
    field_ = b"\x08\x00\x63" + _I32.pack(1)  # an i32 field of 7 bytes, again and again
    head = straddling_head(MiB, len(field_))
    count = (MiB - len(head)) // len(field_) + 2  # a field header straddles the 1 MiB mark
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sent = 0
    began = time.monotonic()
    try:
        sock.sendall(head + field_ * count)
        sent = len(head) + len(field_) * count
        while sent < 256 * MiB and time.monotonic() - began < 5:
            sock.sendall(field_ * 10_000)
            sent += len(field_) * 10_000
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    grew = vm_hwm(proxy) - hwm_before
    assert sent < 8 * MiB, f"the proxy took {sent >> 20} MiB of one request (limit 1 MiB)"
    assert grew < 64 * MiB, f"the proxy grew by {grew >> 20} MiB"


def test_a_partition_value_that_is_not_utf8_gets_the_metastores_answer(
    proxy_factory: ProxyFactory, hms: MetastoreServer, sample: Sample
) -> None:
    args = idl.args_class("get_partition")(
        db_name=sample.db, tbl_name=sample.table, part_vals=["2024-01-01", "e?"]
    )
    request = idl.encode_call("get_partition", 3, **vars(args)).replace(b"e?", b"e\xff")
    answer = raw.call(hms.host, hms.port, request)
    gate = Gate(hms, [request]).start()
    try:
        proxy = proxy_factory("--notifications", "off", upstream=f"thrift://127.0.0.1:{gate.port}")
        reply = raw.call("127.0.0.1", proxy.port, request)
    finally:
        gate.stop()
    assert reply == answer, reply
