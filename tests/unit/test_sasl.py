"""The SASL core in process: negotiation messages, GSSAPI's state machines (over a scripted
context), frames through a security layer on in-memory streams, names and options.

The same code against a real MIT KDC, a Kerberized HMS and real Spark is in
tests/integration/test_kerberos.py and tests/e2e/test_spark_kerberos.py.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from proxy.config import ConfigError, load
from proxy.sasl.gssapi_mech import GssapiClient, GssapiServer, choose
from proxy.sasl.kerberos import expand_host, short_name
from proxy.sasl.layer import PLAIN, Layers, Qop, SaslError
from proxy.sasl.negotiation import NegotiationReader, Status, encode
from proxy.sasl.stream import Negotiator, SaslReader, SaslWriter, client_negotiate
from tests.unit.helpers import ScriptedContext

# -- negotiation messages -------------------------------------------------------------------


def test_negotiation_messages_arrive_whole_however_they_are_cut() -> None:
    wire = encode(Status.START, b"GSSAPI") + encode(Status.OK, b"x" * 700) + b"\x00\x00\x00\x05"
    reader = NegotiationReader()
    got = []
    for byte in wire:
        reader.feed(bytes([byte]))
        message = reader.next() if len(got) < 2 else None  # after the last, frames follow
        if message is not None:
            got.append(message)
    assert [(m.status, len(m.payload)) for m in got] == [(Status.START, 6), (Status.OK, 700)]
    assert reader.rest() == b"\x00\x00\x00\x05"  # the first frame, sent right behind


def test_a_plain_thrift_client_is_refused_at_its_first_byte() -> None:
    reader = NegotiationReader()
    reader.feed(b"\x80\x01\x00\x01\x00\x00\x00\x09get_table")
    with pytest.raises(SaslError, match="plain Thrift client"):
        reader.next()


def test_a_huge_negotiation_length_is_refused_without_waiting_for_it() -> None:
    reader = NegotiationReader(limit=1 << 20)
    reader.feed(struct.pack(">BI", Status.OK, 1 << 30))
    with pytest.raises(SaslError, match="limit"):
        reader.next()


# -- GSSAPI over a scripted context ------------------------------------------------------------


def handshake(server_qops: list[Qop], client_qops: list[Qop], mutual: bool = True) -> Any:
    server = GssapiServer(ScriptedContext(1, [b"AP-REP" if mutual else None]), server_qops)
    client = GssapiClient(ScriptedContext(2 if mutual else 1, [b"AP-REQ", None]), client_qops)
    token = client.first()
    assert token == b"AP-REQ"
    while True:
        reply, last = server.step(token, lambda: "alice/host@R")
        if last:
            break
        token = client.step(reply)
    return server.outcome, client.finish()


@pytest.mark.parametrize("mutual", [True, False])
@pytest.mark.parametrize("qop", list(Qop))
def test_gssapi_negotiates_each_protection(qop: Qop, mutual: bool) -> None:
    outcome, client_layer = handshake(list(Qop), [qop], mutual)
    assert outcome.principal == "alice/host@R"
    assert outcome.layer.qop is qop and client_layer.qop is qop
    if qop is Qop.AUTH:
        assert outcome.layer is PLAIN and client_layer is PLAIN
    else:
        frame = client_layer.wrap(b"get_table")
        assert outcome.layer.unwrap(frame) == b"get_table"
        assert (frame[:1] == b"E") is (qop is Qop.AUTH_CONF)


def test_the_client_takes_the_weakest_offer_at_least_its_floor() -> None:
    every = Layers.NONE | Layers.INTEGRITY | Layers.CONFIDENTIALITY
    assert choose(every, [Qop.AUTH]) is Qop.AUTH
    assert choose(Layers.CONFIDENTIALITY, [Qop.AUTH]) is Qop.AUTH_CONF  # privacy HMS
    assert choose(every, [Qop.AUTH_CONF, Qop.AUTH_INT]) is Qop.AUTH_INT
    with pytest.raises(SaslError, match="no common protection"):
        choose(Layers.NONE, [Qop.AUTH_CONF])


def test_a_client_choosing_what_was_not_offered_is_refused() -> None:
    server = GssapiServer(ScriptedContext(1, [None]), [Qop.AUTH_CONF])
    server.step(b"AP-REQ", lambda: "alice@R")  # the offer
    choice = b"S" + struct.pack(">I", (Layers.NONE << 24) | 0)
    with pytest.raises(SaslError, match="not offered"):
        server.step(choice)


def test_an_authorization_id_other_than_the_principal_is_refused() -> None:
    server = GssapiServer(ScriptedContext(1, [None]), [Qop.AUTH])
    server.step(b"AP-REQ", lambda: "alice@R")
    choice = b"S" + struct.pack(">I", (Layers.NONE << 24) | 0) + b"bob@R"
    with pytest.raises(SaslError, match="act as"):
        server.step(choice)


def test_a_bad_ticket_is_a_sasl_error() -> None:
    class Refusing(ScriptedContext):
        def step(self, token: bytes | None = None) -> bytes | None:
            raise RuntimeError("Ticket expired\nmore detail")

    server = GssapiServer(Refusing(1, []), [Qop.AUTH])
    with pytest.raises(SaslError, match=r"Kerberos authentication failed: Ticket expired$"):
        server.step(b"AP-REQ")


# -- frames on streams -------------------------------------------------------------------------


class XorLayer:
    """A stand-in security layer: wrapping changes every byte and adds a 2-byte tag, so a
    frame read without unwrapping, or unwrapped twice, shows."""

    qop = Qop.AUTH_INT

    def __init__(self, max_send: int = 0) -> None:
        self.max_send = max_send

    def wrap(self, data: bytes) -> bytes:
        return b"WR" + bytes(b ^ 0x5A for b in data)

    def unwrap(self, data: bytes) -> bytes:
        if data[:2] != b"WR":
            raise SaslError("bad token")
        return bytes(b ^ 0x5A for b in data[2:])


class Sink:
    """A StreamWriter's write side, into memory."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.transport = None

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.data += piece

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    async def wait_closed(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def frames_of(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from(">I", data, at)
        out.append(data[at + 4 : at + 4 + length])
        at += 4 + length
    return out


async def read_all(reader: SaslReader, size: int = 7) -> bytes:
    got = b""
    while True:
        piece = await reader.read(size)
        if not piece:
            return got
        got += piece


def stream_of(data: bytes) -> asyncio.StreamReader:
    raw = asyncio.StreamReader()
    raw.feed_data(data)
    raw.feed_eof()
    return raw


@pytest.mark.parametrize("layer", [PLAIN, XorLayer()], ids=["auth", "wrapped"])
def test_frames_are_one_byte_stream(layer: Any) -> None:
    async def run() -> None:
        sink = Sink()
        writer = SaslWriter(sink, layer)  # type: ignore[arg-type]
        writer.write(b"first message, ")
        writer.write(b"in two writes")
        await writer.drain()  # one frame per drain, as Java's client flushes
        writer.write(b"; a second frame")
        await writer.drain()
        wire = bytes(sink.data)
        assert len(frames_of(wire)) == 2
        # The reader sees the bytes inside, read in any sizes, the early bytes first.
        reader = SaslReader(stream_of(wire[5:]), layer, 1 << 20, early=wire[:5])
        assert await read_all(reader) == b"first message, in two writes; a second frame"
        assert reader.at_eof()

    asyncio.run(run())


def test_big_wrapped_writes_are_cut_at_the_peers_buffer_and_wrapped_off_the_loop() -> None:
    async def run() -> None:
        sink = Sink()
        layer = XorLayer(max_send=100_000)
        writer = SaslWriter(sink, layer)  # type: ignore[arg-type]
        payload = bytes(range(256)) * 1000  # 256 KB: above the thread threshold
        writer.write(payload)
        await writer.drain()
        frames = frames_of(bytes(sink.data))
        assert [len(f) for f in frames] == [100_002, 100_002, 56_002]
        reader = SaslReader(stream_of(bytes(sink.data)), layer, 1 << 20)
        assert await read_all(reader, 65536) == payload

    asyncio.run(run())


def test_a_broken_frame_resets_the_connection_and_says_why() -> None:
    async def run() -> None:
        seen: list[SaslError] = []
        bad = struct.pack(">I", 5) + b"XXabc"
        reader = SaslReader(stream_of(bad), XorLayer(), 1 << 20, on_error=seen.append)
        with pytest.raises(ConnectionResetError, match="bad token"):
            await reader.read()
        too_big = SaslReader(stream_of(struct.pack(">I", 1 << 30)), PLAIN, 1 << 20)
        with pytest.raises(ConnectionResetError, match="limit"):
            await too_big.read()
        assert len(seen) == 1

    asyncio.run(run())


def test_a_frame_cut_short_is_the_end_of_the_stream() -> None:
    async def run() -> None:
        cut = struct.pack(">I", 100) + b"only part"
        reader = SaslReader(stream_of(cut), XorLayer(), 1 << 20)
        assert await reader.read() == b""
        assert reader.at_eof()

    asyncio.run(run())


def test_close_flushes_what_was_written() -> None:
    sink = Sink()
    writer = SaslWriter(sink, XorLayer())  # type: ignore[arg-type]
    writer.write(b"last words")
    writer.close()
    assert frames_of(bytes(sink.data)) == [b"WR" + bytes(b ^ 0x5A for b in b"last words")]
    assert sink.closed


def test_client_negotiation_reports_the_servers_refusal() -> None:
    async def run() -> None:
        server_says = encode(Status.BAD, b"token expired")
        negotiator = Negotiator(stream_of(server_says), Sink(), 1.0)  # type: ignore[arg-type]
        with pytest.raises(SaslError, match="refused DIGEST-MD5: token expired"):
            await client_negotiate(negotiator, "DIGEST-MD5", b"", lambda c: b"")
        sent = bytes(negotiator.writer.data)  # type: ignore[attr-defined]
        assert sent == encode(Status.START, b"DIGEST-MD5") + encode(Status.OK, b"")

    asyncio.run(run())


# -- names and options -------------------------------------------------------------------------


def test_short_names_follow_hadoops_default_rule() -> None:
    local = frozenset({"CORP.EXAMPLE"})
    assert short_name("alice@CORP.EXAMPLE", local) == "alice"
    assert short_name("etl/worker7.corp.example@CORP.EXAMPLE", local) == "etl"
    with pytest.raises(SaslError, match="not of a local realm"):
        short_name("alice@PARTNER.EXAMPLE", local)


def test_host_in_principals() -> None:
    assert expand_host("hive/_HOST@R", "HMS-1.corp") == "hive/hms-1.corp@R"
    assert expand_host("hive/metastore@R", "elsewhere") == "hive/metastore@R"
    assert "_HOST" not in expand_host("proxy/_HOST@R")


def test_qop_names_are_hadoops() -> None:
    assert Qop.from_hadoop("privacy") is Qop.AUTH_CONF
    assert Qop.from_hadoop("auth-int") is Qop.AUTH_INT


def options(**values: str) -> Any:
    flags = {"upstream": "thrift://hms:9083", **values}
    return load(flags, {}, None)


def test_kerberos_options_say_what_is_missing(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as info:
        options(client_auth="kerberos")
    assert any("kerberos_principal and kerberos_keytab" in p for p in info.value.problems)
    keytab = tmp_path / "proxy.keytab"
    keytab.write_bytes(b"\x05\x02")
    with pytest.raises(ConfigError) as info:
        options(upstream_auth="kerberos", kerberos_principal="p/h@R", kerberos_keytab=str(keytab))
    problems = " ".join(info.value.problems)
    assert "needs upstream_principal" in problems
    assert "upstream_identity end-user: needs client_auth kerberos" in problems


def test_cache_scope_follows_client_authentication(tmp_path: Any) -> None:
    keytab = tmp_path / "proxy.keytab"
    keytab.write_bytes(b"\x05\x02")
    kerberos = options(
        client_auth="kerberos", kerberos_principal="p/h@R", kerberos_keytab=str(keytab)
    )
    assert kerberos.per_user_cache
    assert not options().per_user_cache
    assert options(cache_scope="user").per_user_cache
    shared = options(
        client_auth="kerberos",
        kerberos_principal="p/h@R",
        kerberos_keytab=str(keytab),
        cache_scope="shared",
    )
    assert not shared.per_user_cache
    assert options(sasl_qop="privacy,authentication").sasl_qop == ("auth-conf", "auth")
