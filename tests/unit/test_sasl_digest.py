"""The DIGEST-MD5 client and its security layers (proxy/sasl/digest.py, digest_layer.py).

The same code runs against the JDK's DIGEST-MD5 server in
tests/integration/test_sasl_digest_java.py; these tests need no Java: RFC 2831's example, an
independent computation of the response, recorded frames, and bad input.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sasl.digest import (
    Challenge,
    DigestCipher,
    DigestClient,
    parse_directives,
    restrict_qop,
    token_owner,
)
from proxy.sasl.digest_layer import (
    JAVA_CIPHER_ORDER,
    IntegrityLayer,
    available_ciphers,
    des_key,
    max_send,
    security_layer,
)
from proxy.sasl.layer import PLAIN, Qop, SaslError
from proxy.sasl.tokens import HadoopToken, TokenIdentifier

RFC_CHALLENGE = (
    b'realm="elwood.innosoft.com",nonce="OA6MG9tEQGm2hh",qop="auth",'
    b"algorithm=md5-sess,charset=utf-8"
)
# As the JDK's DigestMD5Server writes one for a metastore configured for all three levels.
JAVA_CHALLENGE = (
    b'realm="default",nonce="3hMW7G1xV2IlBeC2jxS8YZ8bT0e0d6RdqlyI3oVF",'
    b'qop="auth-conf,auth-int,auth",charset=utf-8,cipher="3des,rc4,des,rc4-56,rc4-40",'
    b"algorithm=md5-sess"
)
HA1 = bytes(range(16))


def client(**options: object) -> DigestClient:
    return DigestClient("user", "pass", cnonce="fixedcnonce", **options)  # type: ignore[arg-type]


def expected_response(
    user: str, realm: str, password: str, nonce: str, cnonce: str, uri: str, qop: str, method: str
) -> str:
    """RFC 2831 2.1.2.1, written out again here as the RFC writes it."""
    h = hashlib.md5
    a1 = h(f"{user}:{realm}:{password}".encode()).digest() + f":{nonce}:{cnonce}".encode()
    a2 = f"{method}:{uri}" + (":" + "0" * 32 if qop != "auth" else "")
    kd = f"{h(a1).hexdigest()}:{nonce}:00000001:{cnonce}:{qop}:{h(a2.encode()).hexdigest()}"
    return h(kd.encode()).hexdigest()


# -- The handshake ------------------------------------------------------------------------------


def test_rfc_2831_example() -> None:
    c = DigestClient(
        "chris",
        "secret",
        qops=[Qop.AUTH],
        protocol="imap",
        server_name="elwood.innosoft.com",
        cnonce="OA6MHXh6VqTrRk",
    )
    response = c.respond(RFC_CHALLENGE)
    assert parse_directives(response)["response"] == "d388dad90d4bbd760a152321f2143af7"
    assert response == (
        b'charset=utf-8,username="chris",realm="elwood.innosoft.com",nonce="OA6MG9tEQGm2hh",'
        b'nc=00000001,cnonce="OA6MHXh6VqTrRk",digest-uri="imap/elwood.innosoft.com",'
        b"maxbuf=65536,response=d388dad90d4bbd760a152321f2143af7,qop=auth"
    )
    assert c.finish(b"rspauth=ea40f60335c427b5527b84dbabcdfffd") is PLAIN


def test_rfc_2831_second_example() -> None:
    c = DigestClient(
        "chris",
        "secret",
        qops=[Qop.AUTH],
        protocol="acap",
        server_name="elwood.innosoft.com",
        cnonce="OA9BSuZWMSpW8m",
    )
    challenge = RFC_CHALLENGE.replace(b"OA6MG9tEQGm2hh", b"OA9BSXrbuRhWay")
    assert parse_directives(c.respond(challenge))["response"] == "6084c6db3fede7352c551284490fd0fc"
    assert c.finish(b"rspauth=2f0b3d7c3c2e486600ef710726aa2eae") is PLAIN


@pytest.mark.parametrize("qop", list(Qop))
def test_response_for_each_qop(qop: Qop) -> None:
    c = client(qops=[qop])
    fields = parse_directives(c.respond(JAVA_CHALLENGE))
    nonce = "3hMW7G1xV2IlBeC2jxS8YZ8bT0e0d6RdqlyI3oVF"
    args = ("user", "default", "pass", nonce, "fixedcnonce", "null/default", qop.value)
    assert fields["response"] == expected_response(*args, "AUTHENTICATE")
    assert fields["digest-uri"] == "null/default" and fields["realm"] == "default"
    assert fields["qop"] == qop.value and fields["nc"] == "00000001"
    assert fields.get("cipher") == ("3des" if qop is Qop.AUTH_CONF else None)
    layer = c.finish(b"rspauth=" + expected_response(*args, "").encode())
    assert layer.qop is qop


def test_wrong_rspauth() -> None:
    c = client()
    c.respond(JAVA_CHALLENGE)
    with pytest.raises(SaslError, match="not the real server"):
        c.finish(b"rspauth=ea40f60335c427b5527b84dbabcdfffd")
    with pytest.raises(SaslError, match="out of turn"):
        c.finish(b"rspauth=ea40f60335c427b5527b84dbabcdfffd")


def test_out_of_turn() -> None:
    c = client()
    with pytest.raises(SaslError, match="out of turn"):
        c.finish(b"rspauth=00")
    c.respond(JAVA_CHALLENGE)
    with pytest.raises(SaslError, match="second challenge"):
        c.respond(JAVA_CHALLENGE)
    c = client()
    c.respond(JAVA_CHALLENGE)
    with pytest.raises(SaslError, match="no rspauth"):
        c.finish(b"stale=true")


@pytest.mark.parametrize(
    ("challenge", "message"),
    [
        (b'realm="r",qop="auth",algorithm=md5-sess', "without a nonce"),
        (b'nonce="n",qop="auth"', "not md5-sess"),
        (b'nonce="n",algorithm=md5', "not md5-sess"),
        (b'nonce="n",nonce="m",algorithm=md5-sess', "more than once"),
        (b'nonce="n",algorithm=md5-sess,charset=latin-1', "charset"),
        (b'nonce="n",algorithm=md5-sess,maxbuf=0', "maxbuf"),
        (b'nonce="n",algorithm=md5-sess,maxbuf=x1', "maxbuf"),
        (b'nonce="n",algorithm=md5-sess,maxbuf=16777216', "maxbuf"),
        (b'nonce="n,algorithm=md5-sess', "unterminated"),
        (b'nonce="n\\', "unterminated"),
        (b'nonce="n"x,algorithm=md5-sess', "expected ','"),
        (b'nonce "n",algorithm=md5-sess', "malformed"),
        (b"=n,algorithm=md5-sess", "malformed"),
        (b'nonce="n",algorithm=md5-sess,rspauth=00', "rspauth in the first"),
        (b'nonce="' + b"n" * 2100 + b'",algorithm=md5-sess', "2"),
        (b'nonce="n",algorithm=md5-sess,qop="auth-int"', "no common protection"),
        (b"", "not md5-sess"),
    ],
)
def test_bad_challenges(challenge: bytes, message: str) -> None:
    with pytest.raises(SaslError, match=message):
        client(qops=[Qop.AUTH]).respond(challenge)


def test_challenge_parsing_as_java_writes_and_reads() -> None:
    ch = Challenge.parse(
        b' realm="a" , realm="b",nonce="x\\"y",QOP="auth-int, auth,x-new",'
        b'maxbuf="4096",cipher="rc4 3des",algorithm=md5-sess,unknown=1,,'
    )
    assert ch.realms == ("a", "b") and ch.nonce == b'x"y'
    assert ch.qops == (Qop.AUTH_INT, Qop.AUTH)  # unknown names dropped, keys in any case
    assert ch.maxbuf == 4096 and ch.ciphers == ("rc4", "3des") and not ch.utf8
    assert Challenge.parse(b'nonce="n",algorithm=md5-sess').qops == (Qop.AUTH,)
    upper = b'nonce="n",qop="AUTH-INT",algorithm=md5-sess'  # Java ignores the case too
    assert Challenge.parse(upper).qops == (Qop.AUTH_INT,)
    assert restrict_qop(upper, {Qop.AUTH_INT}) == b'nonce="n",qop="AUTH-INT",algorithm=md5-sess'


def test_parse_directives() -> None:
    fields = parse_directives(
        b'username="a\\\\b,c",realm="r1",realm="r2",nc=00000001,response=ff, qop=auth'
    )
    assert fields == {
        "username": "a\\b,c",
        "realm": "r1",
        "nc": "00000001",
        "response": "ff",
        "qop": "auth",
    }
    assert parse_directives('username="ñandú"'.encode()) == {"username": "ñandú"}
    assert parse_directives(b'username="\xf1"') == {"username": "ñ"}  # ISO-8859-1
    with pytest.raises(SaslError, match="more than once"):
        parse_directives(b"qop=auth,qop=auth-int")


def test_quoting_in_the_response() -> None:
    c = DigestClient('we"ird\\', "pw", qops=[Qop.AUTH], cnonce="c")
    response = c.respond(b'nonce="a\\"b",algorithm=md5-sess')
    assert b'username="we\\"ird\\\\"' in response and b'nonce="a\\"b"' in response
    assert b"charset" not in response and b"realm" not in response  # none offered, none sent
    fields = parse_directives(response)
    assert fields["username"] == 'we"ird\\' and fields["nonce"] == 'a"b'


def test_credentials_beyond_latin_1() -> None:
    # ISO-8859-1 in H(A1) when it fits, even under charset=utf-8 (Java's stringToByte_8859_1)
    c = DigestClient("josé", "pw", qops=[Qop.AUTH], cnonce="c")
    fields = parse_directives(c.respond(b'realm="r",nonce="n",algorithm=md5-sess,charset=utf-8'))
    assert fields["response"] == expected_response(
        "jos\xe9", "r", "pw", "n", "c", "null/default", "auth", "AUTHENTICATE"
    ).replace(*_latin1_hash("josé"))
    with pytest.raises(SaslError, match="charset=utf-8"):
        DigestClient("Ωmega", "pw", qops=[Qop.AUTH]).respond(b'nonce="n",algorithm=md5-sess')
    DigestClient("Ωmega", "pw", qops=[Qop.AUTH]).respond(
        b'nonce="n",algorithm=md5-sess,charset=utf-8'
    )


def _latin1_hash(user: str) -> tuple[str, str]:
    """expected_response encodes as UTF-8; redo its H(A1) part with ISO-8859-1 bytes."""
    utf8 = expected_response(user, "r", "pw", "n", "c", "null/default", "auth", "AUTHENTICATE")
    h = hashlib.md5
    a1 = h(f"{user}:r:pw".encode("latin-1")).digest() + b":n:c"
    a2 = h(b"AUTHENTICATE:null/default").hexdigest()
    latin1 = h(f"{h(a1).hexdigest()}:n:00000001:c:auth:{a2}".encode()).hexdigest()
    return utf8, latin1


def test_authzid() -> None:
    c = DigestClient("u", "p", qops=[Qop.AUTH], authzid="other", cnonce="c")
    response = c.respond(b'nonce="n",algorithm=md5-sess')
    assert response.endswith(b',authzid="other"')
    h = hashlib.md5
    a1 = h(b"u::p").digest() + b":n:c:other"
    kd = f"{h(a1).hexdigest()}:n:00000001:c:auth:{h(b'AUTHENTICATE:null/default').hexdigest()}"
    assert parse_directives(response)["response"] == h(kd.encode()).hexdigest()


# -- Choosing the protection --------------------------------------------------------------------


def offer(qops: str, ciphers: str | None = None) -> bytes:
    cipher = f',cipher="{ciphers}"' if ciphers is not None else ""
    return f'realm="default",nonce="n",qop="{qops}"{cipher},algorithm=md5-sess'.encode()


@pytest.mark.parametrize(
    ("qops", "ciphers", "allowed", "chosen", "cipher"),
    [
        ("auth-conf,auth-int,auth", "3des,rc4,des,rc4-56,rc4-40", None, Qop.AUTH_CONF, "3des"),
        ("auth,auth-int,auth-conf", "rc4,3des", None, Qop.AUTH_CONF, "3des"),  # ours, not theirs
        ("auth-conf,auth", "rc4", None, Qop.AUTH_CONF, "rc4"),
        ("auth-conf,auth-int", "rc4-40", None, Qop.AUTH_INT, None),  # no strong cipher shared
        ("auth-conf,auth-int,auth", "3des", [Qop.AUTH, Qop.AUTH_CONF], Qop.AUTH, None),
        ("auth-int,auth", None, [Qop.AUTH_CONF, Qop.AUTH_INT], Qop.AUTH_INT, None),
        ("auth-conf", None, [Qop.AUTH_CONF, Qop.AUTH_INT], None, None),  # auth-conf, no cipher
        ("auth-conf", "rc4-40", None, None, None),
        ("auth", None, [Qop.AUTH_CONF], None, None),
    ],
)
def test_choice(
    qops: str,
    ciphers: str | None,
    allowed: list[Qop] | None,
    chosen: Qop | None,
    cipher: str | None,
) -> None:
    c = client(qops=allowed) if allowed else client()
    if chosen is None:
        with pytest.raises(SaslError, match="no common protection"):
            c.respond(offer(qops, ciphers))
        return
    c.respond(offer(qops, ciphers))
    assert c.qop is chosen and (c.cipher.value if c.cipher else None) == cipher


def test_weak_ciphers_only_when_asked() -> None:
    c = client(qops=[Qop.AUTH_CONF], ciphers=JAVA_CIPHER_ORDER)
    c.respond(offer("auth-conf", "rc4-40,rc4-56,des"))
    assert c.cipher is DigestCipher.DES  # Java's order: des before rc4-56, rc4-40 last


def test_realm_choice() -> None:
    c = client(qops=[Qop.AUTH])
    c.respond(b'realm="one",realm="two",nonce="n",algorithm=md5-sess')
    assert c.realm == "one"
    c = client(qops=[Qop.AUTH], realm="two")
    assert b'realm="two"' in c.respond(b'realm="one",realm="two",nonce="n",algorithm=md5-sess')


def test_token_client_and_owner() -> None:
    ident = TokenIdentifier("alice", "proxy", "", 1, 2, 3, 4)
    token = HadoopToken(ident.to_bytes(), b"secret")
    c = DigestClient.for_token(token, qops=[Qop.AUTH], cnonce="c")
    response = c.respond(JAVA_CHALLENGE)
    assert token_owner(response) == "alice"
    assert parse_directives(response)["username"] == token.digest_username
    with pytest.raises(SaslError, match="without a username"):
        token_owner(b"qop=auth")
    with pytest.raises(SaslError, match="base64"):
        token_owner(b'username="alice"')


# -- A relay narrowing the offer ----------------------------------------------------------------


def test_restrict_qop() -> None:
    narrowed = restrict_qop(JAVA_CHALLENGE, {Qop.AUTH, Qop.AUTH_INT})
    assert narrowed == JAVA_CHALLENGE.replace(b"auth-conf,auth-int,auth", b"auth-int,auth")
    assert restrict_qop(JAVA_CHALLENGE, set(Qop)) == JAVA_CHALLENGE.replace(
        b'qop="auth-conf,auth-int,auth"', b'qop="auth-conf,auth-int,auth"'
    )
    no_qop = b'nonce="n",algorithm=md5-sess'
    assert restrict_qop(no_qop, {Qop.AUTH}) == no_qop
    with pytest.raises(SaslError, match="none of them allowed"):
        restrict_qop(no_qop, {Qop.AUTH_CONF})
    with pytest.raises(SaslError, match="none of them allowed"):
        restrict_qop(offer("auth-conf"), {Qop.AUTH, Qop.AUTH_INT})
    with pytest.raises(SaslError, match="more than once"):
        restrict_qop(b'qop="auth",qop="auth-int",nonce="n"', {Qop.AUTH})


def test_narrowing_does_not_change_the_digest() -> None:
    """The offered list is not hashed: the client's response is the same for the same pick."""
    full, narrowed = client(qops=[Qop.AUTH_INT]), client(qops=[Qop.AUTH_INT])
    assert full.respond(JAVA_CHALLENGE) == narrowed.respond(
        restrict_qop(JAVA_CHALLENGE, {Qop.AUTH_INT})
    )


# -- The security layers ------------------------------------------------------------------------

ALL_LAYERS = [(Qop.AUTH_INT, None), *((Qop.AUTH_CONF, c) for c in DigestCipher)]
# Recorded from this implementation, which the JDK reads and answers (the integration test):
# the first two frames of b"hello" for H(A1) = 00 01 .. 0f.
RECORDED = {
    None: ["68656c6c6fe41f0b64ca1f95a540ad000100000000"],
    "3des": [
        "0fc481df4f54a35422291c4d5f47c487000100000000",
        "1c539c28493194c621e218ccf78a4b69000100000001",
    ],
    "rc4": [
        "52145de40c089143776e1acb171f6f000100000000",
        "d6aeb4dfabc5044f51fca16fbcdb73000100000001",
    ],
    "des": [
        "d86842bd57fedd4fb4712a3e84cda148000100000000",
        "2c8d9de1a182d7589760b1cf1cae1bb2000100000001",
    ],
    "rc4-56": [
        "dbdb39368be8c41ecf783d414a2e33000100000000",
        "77612d6c863a8dc58ea371fcfba2c6000100000001",
    ],
    "rc4-40": [
        "90f9457ab688cf22f9c5ef8e77dfa5000100000000",
        "88dd133f15f435f8652d9bcbcf1b2b000100000001",
    ],
}


def pair(qop: Qop, cipher: DigestCipher | None) -> tuple[IntegrityLayer, IntegrityLayer]:
    c = security_layer(qop, HA1, 65536, cipher)
    s = security_layer(qop, HA1, 65536, cipher, server=True)
    assert c is not None and s is not None
    return c, s


def test_all_ciphers_available_here() -> None:
    assert available_ciphers() == frozenset(DigestCipher)


@pytest.mark.parametrize(("qop", "cipher"), ALL_LAYERS)
def test_recorded_frames(qop: Qop, cipher: DigestCipher | None) -> None:
    c, s = pair(qop, cipher)
    frames = RECORDED[cipher.value if cipher else None]
    for frame in frames:
        assert c.wrap(b"hello").hex() == frame
        assert s.unwrap(bytes.fromhex(frame)) == b"hello"


@pytest.mark.parametrize(("qop", "cipher"), ALL_LAYERS)
@settings(max_examples=25)
@given(messages=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=8))
def test_both_directions(qop: Qop, cipher: DigestCipher | None, messages: list[bytes]) -> None:
    c, s = pair(qop, cipher)
    for m in messages:
        frame = c.wrap(m)
        assert len(frame) <= len(m) + 16 + (8 if cipher and cipher.block_size > 1 else 0)
        assert s.unwrap(frame) == m
        assert c.unwrap(s.wrap(m)) == m
    if qop is Qop.AUTH_CONF:
        assert all(m not in c.wrap(m) for m in messages if len(m) > 4)


@pytest.mark.parametrize(("qop", "cipher"), ALL_LAYERS)
def test_replay_and_reorder(qop: Qop, cipher: DigestCipher | None) -> None:
    c, s = pair(qop, cipher)
    first = c.wrap(b"one")
    assert s.unwrap(first) == b"one"
    with pytest.raises(SaslError, match=r"out of sequence|MAC|padding"):
        s.unwrap(first)  # replayed
    with pytest.raises(SaslError, match="failed earlier"):
        s.unwrap(c.wrap(b"two"))  # and nothing after the failure
    c, s = pair(qop, cipher)
    c.wrap(b"one")
    with pytest.raises(SaslError, match=r"out of sequence|MAC|padding"):
        s.unwrap(c.wrap(b"two"))  # the first was dropped


def test_integrity_reorder_message() -> None:
    c, s = pair(Qop.AUTH_INT, None)
    one, two = c.wrap(b"one"), c.wrap(b"two")
    with pytest.raises(SaslError, match="frame 1 out of sequence \\(expected 0\\)"):
        s.unwrap(two)
    c, s = pair(Qop.AUTH_INT, None)
    s.unwrap(c.wrap(b"one"))
    with pytest.raises(SaslError, match="frame 0 out of sequence \\(expected 1\\)"):
        s.unwrap(one)


@pytest.mark.parametrize(("qop", "cipher"), ALL_LAYERS)
def test_tampering(qop: Qop, cipher: DigestCipher | None) -> None:
    frame = pair(qop, cipher)[0].wrap(b"get_table(db, tbl)")
    for i in range(len(frame)):
        s = pair(qop, cipher)[1]
        bad = bytearray(frame)
        bad[i] ^= 0x40
        with pytest.raises(SaslError):
            s.unwrap(bytes(bad))
    for size in range(1, len(frame)):
        with pytest.raises(SaslError):
            pair(qop, cipher)[1].unwrap(frame[:size])


def test_empty_frames_pass_as_in_java() -> None:
    c, s = pair(Qop.AUTH_CONF, DigestCipher.DES3)
    assert c.wrap(b"") == b"" and s.unwrap(b"") == b""
    assert s.unwrap(c.wrap(b"x")) == b"x"  # no sequence number spent on them


def test_message_type_is_checked() -> None:
    c, s = pair(Qop.AUTH_INT, None)
    frame = c.wrap(b"x")
    with pytest.raises(SaslError, match="message type 0002"):
        s.unwrap(frame[:-6] + b"\x00\x02" + frame[-4:])


def test_des_parity() -> None:
    assert des_key(bytes(7)) == b"\x01" * 8
    assert des_key(b"\xff" * 7) == b"\xfe" * 8
    assert des_key(bytes.fromhex("80000000000001")) == bytes.fromhex("8001010101010102")
    for key in (des_key(bytes([i] * 7)) for i in range(256)):
        assert all(b.bit_count() % 2 == 1 for b in key)


def test_max_send() -> None:
    assert max_send(Qop.AUTH, 65536) == 0
    assert max_send(Qop.AUTH_INT, 65536) == 65520
    assert max_send(Qop.AUTH_CONF, 65536, DigestCipher.RC4) == 65520
    assert max_send(Qop.AUTH_CONF, 65536, DigestCipher.DES3) == 65517
    for maxbuf in range(40, 200):
        for cipher in DigestCipher:
            layer = security_layer(Qop.AUTH_CONF, HA1, maxbuf, cipher)
            assert layer is not None
            assert len(layer.wrap(bytes(layer.max_send))) <= maxbuf
            assert len(layer.wrap(bytes(layer.max_send + 1))) > maxbuf
    with pytest.raises(SaslError, match="no room"):
        max_send(Qop.AUTH_CONF, 20, DigestCipher.DES3)


def test_layer_from_a_small_maxbuf() -> None:
    c = client(qops=[Qop.AUTH_INT])
    c.respond(offer("auth-int").replace(b"algorithm", b'maxbuf="1000",algorithm'))
    nonce, args = "n", ("user", "default", "pass")
    rspauth = expected_response(*args, nonce, "fixedcnonce", "null/default", "auth-int", "")
    layer = c.finish(b"rspauth=" + rspauth.encode())
    assert layer.max_send == 1000 - 16
