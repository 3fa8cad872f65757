"""The asyncio edges of Kerberos, in process: the acceptor an engine meets (over socket
pairs, with a scripted GSS context), the relay of a token engine's DIGEST-MD5 negotiation
(to a scripted metastore), the token broker, and the pool's rule that a user's connection is
never another identity's connection re-bound by set_ugi.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from proxy import idl
from proxy.config import Endpoint, load
from proxy.handler import SessionState
from proxy.metrics import Metrics
from proxy.sasl.layer import PLAIN, Qop, SaslError
from proxy.sasl.negotiation import Negotiation, NegotiationReader, Status, encode
from proxy.sasl.server import Refused, SaslAcceptor
from proxy.sasl.stream import ByteReader, ByteWriter, Negotiator
from proxy.sasl.tokens import HadoopToken, TokenIdentifier
from proxy.upstream import Identity, UpstreamAuthFailed, UpstreamPool
from proxy.upstream.token_relay import DigestRelay
from proxy.upstream.tokens import HELD_GRACE, TokenBroker
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.framing import Message, MessageReader, Transport
from tests.unit.helpers import REALMS, Login, acceptor
from tests.unit.inprocess import message, rig
from tests.unit.scripted_hms import ScriptedHMS

T = TypeVar("T")


async def closing(work: Awaitable[T]) -> T:
    try:
        return await work
    finally:
        await shut()


_WRITERS: list[asyncio.StreamWriter] = []


async def pair() -> tuple[Any, Any]:
    """Two connected ends: (reader, writer) each; ``shut`` closes them all."""
    a, b = socket.socketpair()
    ends = await asyncio.open_connection(sock=a), await asyncio.open_connection(sock=b)
    _WRITERS.extend(writer for _, writer in ends)
    return ends


async def shut() -> None:
    while _WRITERS:
        writer = _WRITERS.pop()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class Peer:
    """The far end, speaking negotiation messages."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.messages = NegotiationReader()

    def send(self, status: Status, payload: bytes = b"") -> None:
        self.writer.write(encode(status, payload))

    async def receive(self) -> Negotiation:
        while True:
            message = self.messages.next()
            if message is not None:
                return message
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            assert data, "closed"
            self.messages.feed(data)


def wrapped_choice(layer: int) -> bytes:
    return b"S" + bytes([layer, 0, 0, 0])


@pytest.mark.parametrize("last", [Status.OK, Status.COMPLETE], ids=["ok", "java-complete"])
def test_the_acceptor_authenticates_and_hands_over_the_frames(last: Status) -> None:
    async def run() -> None:
        (server_r, server_w), (client_r, client_w) = await pair()
        engine = Peer(client_r, client_w)
        engine.send(Status.START, b"GSSAPI")
        engine.send(Status.OK, b"AP-REQ")
        accepting = asyncio.create_task(acceptor().accept(server_r, server_w, 5))
        assert (await engine.receive()).payload == b"AP-REP"  # mutual authentication
        engine.send(Status.OK)
        offer = await engine.receive()
        assert offer.payload[:2] == b"S\x01"  # offers auth only (wrapped, no encryption)
        # Java's client marks its last message COMPLETE; others OK. A frame follows at once.
        engine.send(last, wrapped_choice(1))
        engine.writer.write(b"\x00\x00\x00\x05hello")
        assert (await engine.receive()).status is Status.COMPLETE
        done = await accepting
        assert (done.user, done.principal, done.mechanism, done.qop) == (
            "alice",
            "alice/host@R",
            "GSSAPI",
            Qop.AUTH,
        )
        assert await done.reader.read(100) == b"hello"
        done.writer.write(b"world")
        await done.writer.drain()
        assert await asyncio.wait_for(client_r.readexactly(9), 5) == b"\x00\x00\x00\x05world"

    asyncio.run(closing(run()))


@pytest.mark.parametrize(
    ("first", "reason", "said"),
    [
        (b"\x80\x01\x00\x01", "protocol", b"plain Thrift client"),
        (encode(Status.START, b"PLAIN") + encode(Status.OK), "unsupported", b"PLAIN"),
        (encode(Status.START, b"DIGEST-MD5") + encode(Status.OK), "unsupported", b"DIGEST"),
        (encode(Status.OK, b"x"), "protocol", b"expected START"),
    ],
    ids=["plain-thrift", "plain-mechanism", "digest-without-upstream-kerberos", "no-start"],
)
def test_the_acceptor_tells_a_bad_engine_why_and_gives_up(
    first: bytes, reason: str, said: bytes
) -> None:
    async def run() -> None:
        (server_r, server_w), (client_r, client_w) = await pair()
        client_w.write(first)
        with pytest.raises(Refused) as refused:
            await acceptor().accept(server_r, server_w, 5)
        assert refused.value.reason == reason
        answer = await asyncio.wait_for(client_r.read(1000), 5)
        assert answer[:1] == bytes([Status.BAD]) and said in answer

    asyncio.run(closing(run()))


def test_an_engine_that_says_nothing_times_out_and_a_probe_is_no_refusal() -> None:
    async def run() -> None:
        (server_r, server_w), (_, client_w) = await pair()
        with pytest.raises(Refused) as refused:
            await acceptor().accept(server_r, server_w, 0.2)
        assert refused.value.reason == "timeout"
        (server_r, server_w), (_, client_w) = await pair()
        client_w.close()
        with pytest.raises(Refused) as refused:
            await acceptor().accept(server_r, server_w, 5)
        assert refused.value.reason == "none"  # closed before a word: a TCP probe

    asyncio.run(closing(run()))


# -- the token relay -------------------------------------------------------------------------


def token_username(owner: str) -> str:
    identifier = TokenIdentifier(
        owner=owner,
        renewer="proxy",
        real_user="",
        issue_date=1,
        max_date=2,
        sequence=3,
        master_key=4,
    )
    return base64.b64encode(identifier.to_bytes()).decode()


CHALLENGE = (
    b'realm="default",nonce="abc",qop="auth,auth-int,auth-conf",charset=utf-8,algorithm=md5-sess'
)


async def relay_once(
    hms_says: Callable[[Peer], Awaitable[None]], engine_response: bytes
) -> tuple[str | BaseException, list[bytes]]:
    """Relay one negotiation between a scripted engine and a scripted metastore."""
    (hms_r, hms_w), (proxy_up_r, proxy_up_w) = await pair()

    async def open_raw() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return proxy_up_r, proxy_up_w

    (srv_r, srv_w), (eng_r, eng_w) = await pair()
    engine = Peer(eng_r, eng_w)
    hms = Peer(hms_r, hms_w)
    relay = DigestRelay(open_raw, 5, REALMS)
    seen_by_engine: list[bytes] = []

    async def engine_side() -> None:
        message = await engine.receive()
        seen_by_engine.append(message.payload)
        if message.status is Status.OK:
            engine.send(Status.OK, engine_response)
            final = await engine.receive()
            seen_by_engine.append(bytes([final.status]) + final.payload)

    task = asyncio.create_task(engine_side())
    hms_task = asyncio.create_task(hms_says(hms))
    try:
        owner: str | BaseException = await relay.relay(Negotiator(srv_r, srv_w, 5), b"")
    except SaslError as exc:
        owner = exc
    # What the engine is told when the relay gives up is the acceptor's part, not the relay's.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), 1 if isinstance(owner, SaslError) else 5)
    for pending in (task, hms_task):
        pending.cancel()
    await asyncio.gather(task, hms_task, return_exceptions=True)
    return owner, seen_by_engine


def test_a_token_the_metastore_accepts_names_its_owner_and_frames_stay_readable() -> None:
    async def hms(peer: Peer) -> None:
        start = await peer.receive()
        assert (start.status, start.payload) == (Status.START, b"DIGEST-MD5")
        await peer.receive()  # the empty initial response
        peer.send(Status.OK, CHALLENGE)
        response = await peer.receive()
        assert b"qop=auth," in response.payload
        peer.send(Status.COMPLETE, b"rspauth=0123")

    response = f'username="{token_username("alice")}",qop=auth,nonce="abc"'.encode()
    owner, seen = asyncio.run(closing(relay_once(hms, response)))
    assert owner == "alice"
    # The engine was offered "auth" only (the proxy must read its frames), and got COMPLETE.
    assert b'qop="auth"' in seen[0] and b"auth-conf" not in seen[0]
    assert seen[1] == bytes([Status.COMPLETE]) + b"rspauth=0123"


def test_a_token_the_metastore_refuses_is_refused_in_its_words() -> None:
    async def hms(peer: Peer) -> None:
        await peer.receive()
        await peer.receive()
        peer.send(Status.OK, CHALLENGE)
        await peer.receive()
        peer.send(Status.ERROR, b"token expired or does not exist")

    response = f'username="{token_username("alice")}",qop=auth'.encode()
    owner, seen = asyncio.run(closing(relay_once(hms, response)))
    assert isinstance(owner, SaslError) and "does not exist" in str(owner)
    assert seen[1] == bytes([Status.ERROR]) + b"token expired or does not exist"


def test_a_privacy_only_metastore_cannot_be_relayed() -> None:
    async def hms(peer: Peer) -> None:
        await peer.receive()
        await peer.receive()
        peer.send(Status.OK, CHALLENGE.replace(b"auth,auth-int,auth-conf", b"auth-conf"))

    owner, _ = asyncio.run(closing(relay_once(hms, b"")))
    assert isinstance(owner, SaslError) and "privacy" in str(owner)


# -- the token broker ------------------------------------------------------------------------


_SEQUENCE = itertools.count(1)


def token_text(owner: str, max_date: int = 10**13) -> str:
    identifier = TokenIdentifier(
        owner=owner,
        renewer="proxy",
        real_user="proxy",
        issue_date=1,
        max_date=max_date,
        sequence=next(_SEQUENCE),  # each fetch a token of its own, as the HMS numbers them
        master_key=1,
    )
    return HadoopToken(identifier.to_bytes(), b"secret").encode()


class Metastore:
    def __init__(self, answer: Callable[[str], Any]) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.cancelled: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def ask(self, method: str, **args: Any) -> Message:
        if method == "cancel_delegation_token":
            self.cancelled.append(args["token_str_form"])
            result = idl.result_class(method)()
        else:
            assert method == "get_delegation_token"
            self.asked.append(args["token_owner"])
            await self.gate.wait()
            result = idl.result_class(method)(**self.answer(args["token_owner"]))
        data = encode_header(method, MessageType.REPLY, 0) + idl.encode(result)
        reader = MessageReader(Transport.BUFFERED, 1 << 20)
        reader.feed(data)
        message = reader.next_message()
        assert message is not None
        return message


def test_one_fetch_per_user_however_many_connections_wait() -> None:
    async def run() -> None:
        hms = Metastore(lambda owner: {"success": token_text(owner)})
        hms.gate.clear()
        clock = [1000.0]
        broker = TokenBroker(hms.ask, "proxy/h@R", Metrics(), clock=lambda: clock[0], ttl=3600)
        waiting = [asyncio.create_task(broker.token("alice")) for _ in range(10)]
        await asyncio.sleep(0)
        hms.gate.set()
        tokens = await asyncio.gather(*waiting)
        assert hms.asked == ["alice"] and len(set(tokens)) == 1
        assert TokenIdentifier.from_bytes(tokens[0].identifier).owner == "alice"
        await broker.token("alice")
        assert hms.asked == ["alice"]  # held
        clock[0] += 3601
        await broker.token("alice")
        assert hms.asked == ["alice", "alice"]  # replaced after the TTL
        await asyncio.sleep(0)
        assert [HadoopToken.decode(t) for t in hms.cancelled] == [tokens[0]]  # the old one
        broker.forget("alice", tokens[0])  # an old token: the held one stays
        await broker.token("alice")
        assert hms.asked == ["alice", "alice"]

    asyncio.run(closing(run()))


def test_a_held_token_is_given_without_a_fetch_and_not_near_its_end() -> None:
    # What a connection opened in a pool slot uses: never a fetch (it would need a slot of
    # its own), a token a while past its replacement time, never one about to expire.
    async def run() -> None:
        hms = Metastore(lambda owner: {"success": token_text(owner)})
        clock = [1000.0]
        broker = TokenBroker(hms.ask, "proxy/h@R", Metrics(), clock=lambda: clock[0], ttl=3600)
        assert broker.held("alice") is None and hms.asked == []
        token = await broker.token("alice")
        assert broker.held("alice") == token
        clock[0] += 3600 + HELD_GRACE - 1  # due for replacement, still given
        assert broker.held("alice") == token and hms.asked == ["alice"]
        clock[0] += 2
        assert broker.held("alice") is None
        broker.forget("alice", token)
        assert broker.held("alice") is None
        ending = Metastore(lambda owner: {"success": token_text(owner, max_date=1_100_000)})
        short = TokenBroker(ending.ask, "proxy/h@R", Metrics(), clock=lambda: 1000.0)
        await short.token("bob")  # ends at 1,100 s: a minute before, it is given no more
        assert short.held("bob") is not None
        short.clock = lambda: 1041.0
        assert short.held("bob") is None

    asyncio.run(closing(run()))


def test_a_refused_fetch_says_what_the_metastore_must_grant() -> None:
    async def run() -> None:
        error = idl.module().MetaException(message="User: proxy is not allowed to impersonate bob")
        hms = Metastore(lambda owner: {"o1": error})
        broker = TokenBroker(hms.ask, "proxy/h@R", Metrics())
        with pytest.raises(UpstreamAuthFailed, match=r"hadoop\.proxyuser\.proxy"):
            await broker.token("bob")
        with pytest.raises(UpstreamAuthFailed):  # not remembered: asked again
            await broker.token("bob")
        assert hms.asked == ["bob", "bob"]

    asyncio.run(closing(run()))


# -- the pool and per-user connections -------------------------------------------------------


class PerUserAuth:
    """An UpstreamAuth whose connections are bound to their user by the handshake; the
    first connection of ``refuse_first`` is refused once, as a forgotten token is."""

    per_user = True

    def __init__(self, refuse_first: str | None = None) -> None:
        self.refuse = refuse_first
        self.negotiated: list[str | None] = []
        self.prepared: list[str | None] = []

    async def prepare(self, identity: Identity | None) -> None:
        self.prepared.append(identity.user if identity else None)

    async def negotiate(
        self, reader: Any, writer: Any, endpoint: Endpoint, identity: Identity | None
    ) -> tuple[ByteReader, ByteWriter]:
        user = identity.user if identity else None
        self.negotiated.append(user)
        if user is not None and user == self.refuse:
            self.refuse = None
            raise UpstreamAuthFailed("token refused", retry=True)
        return reader, writer


def test_a_users_connection_is_only_ever_theirs_and_a_refused_token_is_retried() -> None:
    async def run() -> None:
        hms = ScriptedHMS()
        auth = PerUserAuth(refuse_first="bob")
        options = load({"upstream": "thrift://hms:9083"}, {}, None)
        pool = UpstreamPool(options, Metrics(), opener=hms.open, auth=auth)
        anonymous = await pool.acquire(None)
        pool.release(anonymous, reusable=True)
        alice = Identity(user="alice")
        conn = await pool.acquire(alice)
        assert conn is not anonymous and conn.identity == alice  # never the proxy's, re-bound
        pool.release(conn, reusable=True)
        assert await pool.acquire(alice) is conn  # hers, pooled
        bob = await pool.acquire(Identity(user="bob"))  # refused once, then a new token
        assert bob.identity == Identity(user="bob")
        assert auth.negotiated == [None, "alice", "bob", "bob"]
        assert auth.prepared == [None, "alice", "alice", "bob", "bob"]
        await pool.close()
        await hms.close()

    asyncio.run(closing(run()))


def test_plain_layer_is_the_default_for_a_relayed_token() -> None:
    assert PLAIN.qop is Qop.AUTH


def test_a_refused_token_is_replaced_without_holding_a_connection_slot() -> None:
    """At the connection limit, fetching a user's new token needs a connection of the
    proxy's own: the refused connection's slot is given back first (else the fetch would
    wait for a slot the caller itself holds, and fail as 'busy'). Three connections, of
    which reads may hold two."""

    async def run() -> None:
        hms = ScriptedHMS()
        options = load(
            {"upstream": "thrift://hms:9083", "upstream_max_connections": "3",
             "upstream_max_idle": "3", "upstream_read_timeout": "1"},
            {},
            None,
        )  # fmt: skip
        auth = PerUserAuth(refuse_first="bob")
        pool = UpstreamPool(options, Metrics(), opener=hms.open, auth=auth)

        async def fetch_token(identity: Identity | None) -> None:
            auth.prepared.append(identity.user if identity else None)
            if identity is not None and identity.user:  # as the broker does: pool.ask(None)
                async with pool.connection(None):
                    pass

        auth.prepare = fetch_token  # type: ignore[method-assign]
        busy = await pool.acquire(None)  # someone else's call in flight: one slot left
        bob = await pool.acquire(Identity(user="bob"))
        assert bob.identity == Identity(user="bob")
        pool.release(busy, reusable=True)
        pool.release(bob, reusable=True)
        await pool.close()
        await hms.close()

    asyncio.run(closing(run()))


# -- identity calls of authenticated engines, through the handler ---------------------------


def test_an_authenticated_engines_set_ugi_is_answered_and_never_reaches_the_metastore() -> None:
    """On a plain metastore a forwarded set_ugi would bind a pooled connection, which other
    users' calls then take, to whoever the engine named."""

    async def run() -> None:
        async with rig() as r:
            alice = SessionState(peer="t", user="alice", mechanism="GSSAPI")
            reply = await r.call(alice, "set_ugi", user_name="mallory", group_names=["admin"])
            assert idl.decode_result("set_ugi", message(reply).body).success == ["admin", "mallory"]
            assert r.hms.calls["set_ugi"] == 0
            await r.call(alice, "get_all_databases")
            assert r.hms.calls["set_ugi"] == 0 and alice.identity is None

    asyncio.run(closing(run()))


def owner_refusal(reply: bytes) -> str | None:
    result = idl.decode_result("get_delegation_token", message(reply).body)
    return result.o1.message if result.o1 is not None else None


def test_with_calls_as_the_proxy_only_an_engines_own_token_goes_out() -> None:
    async def run() -> None:
        async with rig() as r:
            r.pool.auth = PerUserAuth()  # a Kerberized metastore, every call as the proxy
            alice = SessionState(
                peer="t", user="alice", mechanism="GSSAPI", principal="alice/etl@R"
            )
            for owner in ("bob", "alice/admin@R", "ALICE", ""):
                said = owner_refusal(
                    await r.call(
                        alice, "get_delegation_token",
                        token_owner=owner, renewer_kerberos_principal_name="alice",
                    )
                )  # fmt: skip
                assert said == f"User: alice is not allowed to impersonate {owner}", owner
            assert r.hms.calls["get_delegation_token"] == 0
            for owner in ("alice", "alice/etl@R"):  # its short name, or its principal
                await r.call(
                    alice, "get_delegation_token",
                    token_owner=owner, renewer_kerberos_principal_name="alice",
                )  # fmt: skip
            assert r.hms.calls["get_delegation_token"] == 2
            nobody = SessionState(peer="t")  # --client-auth none: nobody to own a token
            said = owner_refusal(
                await r.call(
                    nobody, "get_delegation_token",
                    token_owner="alice", renewer_kerberos_principal_name="alice",
                )
            )  # fmt: skip
            assert said is not None and "authenticated engine" in said
            assert r.hms.calls["get_delegation_token"] == 2

    asyncio.run(closing(run()))


def test_token_engines_are_refused_when_protection_is_required() -> None:
    """A relayed token connection is unprotected: with --sasl-qop privacy, none is taken."""

    async def run() -> None:
        (server_r, server_w), (client_r, client_w) = await pair()
        strict = SaslAcceptor(Login(), [Qop.AUTH_CONF], REALMS, 1 << 20, object())  # type: ignore[arg-type]
        client_w.write(encode(Status.START, b"DIGEST-MD5") + encode(Status.OK))
        with pytest.raises(Refused, match="--sasl-qop"):
            await strict.accept(server_r, server_w, 5)
        assert b"--sasl-qop" in await asyncio.wait_for(client_r.read(1000), 5)

    asyncio.run(closing(run()))


class _Marked:
    """A wrapping layer (auth-int or auth-conf in miniature): each frame is b"W" + data."""

    max_send = 0

    def wrap(self, data: bytes) -> bytes:
        return b"W" + bytes(data)

    def unwrap(self, data: bytes) -> bytes:
        return bytes(data)[1:]


@pytest.mark.parametrize("layer", [PLAIN, _Marked()], ids=["plain", "wrapped"])
def test_a_big_reply_to_a_sasl_session_goes_through_its_layer_on_uvloop(layer: Any) -> None:
    # uvloop's TCP transport is given big replies whole (no copy, ClientConnection): never
    # a SASL session's, whose raw transport is uvloop's too, but whose bytes must be framed
    # (and wrapped) by its writer (as proxy.conn.streamed makes its ClientConnection).
    uvloop = pytest.importorskip("uvloop")
    from proxy.client_connection import ClientConnection
    from proxy.sasl.stream import SaslWriter

    message = b"HEAD" + b"x" * 100_000

    async def run() -> bytes:
        got = bytearray()
        done = asyncio.Event()

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(1 << 20):
                got.extend(data)
            writer.close()
            done.set()

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        _, raw = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            conn = ClientConnection(SaslWriter(raw, layer), Transport.BUFFERED)
            await conn.send_message(message[:4], memoryview(message)[4:])
        finally:
            raw.close()
        await asyncio.wait_for(done.wait(), 30)
        server.close()
        return bytes(got)

    got = uvloop.run(run())
    frames = []
    while len(got) >= 4:
        size = int.from_bytes(got[:4], "big")
        frames.append(layer.unwrap(got[4 : 4 + size]))
        got = got[4 + size :]
    assert b"".join(frames) == message  # framed and wrapped, as the layer says
