"""Hadoop tokens and WritableUtils integers (proxy/sasl/tokens.py); Java's own encoding is
checked live in tests/integration/test_sasl_digest_java.py, and recorded once here."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.sasl.layer import SaslError
from proxy.sasl.tokens import (
    HIVE_DELEGATION_KIND,
    HadoopToken,
    TokenIdentifier,
    decode_identifier,
    encode_identifier,
    encode_password,
    read_vint,
    read_vlong,
    write_vint,
    write_vlong,
)

LONGS = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
INTS = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)

# Printed by tests/rig/java/DigestPeer.java (Hadoop 3.5.0's Token.encodeToUrlString of a Hive
# 2.3.10 DelegationTokenIdentifier for bob, renewer proxy).
JAVA_TOKEN = (
    "HAADYm9iBXByb3h5AIoBojG0cUKKAaJVwPVCAQIUjj-rGU5IbosZNTIyAxeg-7juX98VSElWRV9ERUxFR0FUSU9O"
    "X1RPS0VOAA"
)

VECTORS = [  # WritableUtils.writeVLong, worked by hand from its source
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (-1, "ff"),
    (-112, "90"),
    (128, "8f80"),
    (255, "8fff"),
    (256, "8e0100"),
    (-113, "8770"),
    (-256, "87ff"),
    (-257, "860100"),
    ((1 << 31) - 1, "8c7fffffff"),
    (-(1 << 31), "847fffffff"),
    ((1 << 63) - 1, "887fffffffffffffff"),
    (-(1 << 63), "807fffffffffffffff"),
]


@pytest.mark.parametrize(("value", "encoded"), VECTORS)
def test_vlong_vectors(value: int, encoded: str) -> None:
    assert write_vlong(value).hex() == encoded
    assert read_vlong(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


@given(LONGS)
def test_vlong_round_trip(value: int) -> None:
    data = write_vlong(value)
    assert read_vlong(data) == (value, len(data))
    assert read_vlong(b"junk" + data + b"more", 4) == (value, 4 + len(data))
    # the shortest form: one byte, or a marker and as few bytes as the magnitude needs
    magnitude = ~value if value < 0 else value
    assert len(data) == (1 if -112 <= value <= 127 else 1 + (magnitude.bit_length() + 7) // 8)


@given(LONGS)
def test_vlong_truncated_is_an_error(value: int) -> None:
    data = write_vlong(value)
    for cut in range(len(data)):
        with pytest.raises(SaslError, match="truncated"):
            read_vlong(data[:cut])


@given(INTS)
def test_vint_round_trip(value: int) -> None:
    assert read_vint(write_vint(value)) == (value, len(write_vint(value)))


@given(
    st.one_of(st.integers(max_value=-(1 << 31) - 1), st.integers(min_value=1 << 31)).filter(
        lambda v: -(1 << 63) <= v < (1 << 63)
    )
)
def test_vint_out_of_range(value: int) -> None:
    with pytest.raises(SaslError, match="Java int"):
        read_vint(write_vlong(value))
    with pytest.raises(ValueError):
        write_vint(value)


def test_vlong_longer_than_needed_is_read_as_java_does() -> None:
    assert read_vlong(bytes.fromhex("8e0001")) == (1, 3)  # 2 bytes for 1
    # 8 bytes with the top bit set: a negative Java long
    assert read_vlong(bytes.fromhex("88ffffffffffffffff")) == (-1, 9)
    with pytest.raises(ValueError):
        write_vlong(1 << 63)


def test_the_token_java_wrote() -> None:
    token = HadoopToken.decode(JAVA_TOKEN)
    assert token.kind == HIVE_DELEGATION_KIND and token.service == ""
    assert token.encode() == JAVA_TOKEN
    ident = token.token_identifier()
    assert ident == TokenIdentifier(
        owner="bob",
        renewer="proxy",
        real_user="",
        issue_date=1796130238786,
        max_date=1796735038786,
        sequence=1,
        master_key=2,
    )
    assert ident.to_bytes() == token.identifier
    # DIGEST-MD5 credentials: standard base64 with padding (Hadoop's encodeIdentifier/Password)
    assert token.digest_username == base64.b64encode(token.identifier).decode()
    assert token.digest_password == base64.b64encode(token.password).decode()
    assert TokenIdentifier.from_username(token.digest_username) == ident


def test_decode_takes_padding_and_surrounding_space() -> None:
    token = HadoopToken.decode(JAVA_TOKEN)
    padded = JAVA_TOKEN + "=" * (-len(JAVA_TOKEN) % 4)
    assert HadoopToken.decode(f" {padded}\n") == token


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
IDENTIFIERS = st.builds(
    TokenIdentifier,
    owner=TEXT,
    renewer=TEXT,
    real_user=TEXT,
    issue_date=LONGS,
    max_date=LONGS,
    sequence=INTS,
    master_key=INTS,
    trailing=st.binary(max_size=8),
)
TOKENS = st.builds(
    HadoopToken,
    identifier=st.binary(max_size=300),
    password=st.binary(max_size=64),
    kind=TEXT,
    service=TEXT,
)


@given(TOKENS)
def test_token_round_trip(token: HadoopToken) -> None:
    text = token.encode()
    assert "=" not in text and "+" not in text and "/" not in text
    assert HadoopToken.decode(text) == token
    assert HadoopToken.from_bytes(token.to_bytes()) == token


@given(TOKENS)
def test_truncated_token_is_an_error(token: HadoopToken) -> None:
    data = token.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(SaslError):
            HadoopToken.from_bytes(data[:cut])


@given(IDENTIFIERS)
def test_identifier_round_trip(ident: TokenIdentifier) -> None:
    data = ident.to_bytes()
    assert TokenIdentifier.from_bytes(data) == ident
    assert TokenIdentifier.from_username(encode_identifier(data)) == ident
    assert decode_identifier(encode_identifier(data)) == data


@given(IDENTIFIERS)
def test_truncated_identifier_is_an_error(ident: TokenIdentifier) -> None:
    data = dataclasses.replace(ident, trailing=b"").to_bytes()
    for cut in range(len(data)):
        with pytest.raises(SaslError):
            TokenIdentifier.from_bytes(data[:cut])


def test_bad_tokens() -> None:
    good = HadoopToken(b"id", b"pw", HIVE_DELEGATION_KIND, "svc")
    with pytest.raises(SaslError, match="stray"):
        HadoopToken.from_bytes(good.to_bytes() + b"\0")
    with pytest.raises(SaslError, match="non-base64"):
        HadoopToken.decode(good.encode()[:-2] + "+/")  # the standard alphabet is not URL-safe
    with pytest.raises(SaslError, match="non-base64"):
        HadoopToken.decode("AAAA=AAA")
    with pytest.raises(SaslError, match="impossible length"):
        HadoopToken.decode("AAAAA")
    with pytest.raises(SaslError, match="negative length"):
        HadoopToken.from_bytes(write_vint(-1))
    with pytest.raises(SaslError, match="truncated"):
        HadoopToken.from_bytes(write_vint(1000) + b"short")
    with pytest.raises(SaslError, match="not UTF-8"):
        HadoopToken.from_bytes(b"\0\0\x02\xff\xfe\0")


def test_bad_identifiers() -> None:
    ident = TokenIdentifier("bob", "proxy", "", 1, 2, 3, 4)
    with pytest.raises(SaslError, match="version 1"):
        TokenIdentifier.from_bytes(b"\x01" + ident.to_bytes()[1:])
    with pytest.raises(SaslError, match="not UTF-8"):
        TokenIdentifier.from_bytes(b"\0\x01\xff" + ident.to_bytes()[5:])
    with pytest.raises(SaslError, match="limit"):
        TokenIdentifier.from_bytes(b"\0" + write_vint(2 << 20) + b"x")
    with pytest.raises(SaslError, match="not a base64"):
        TokenIdentifier.from_username("bob")
    with pytest.raises(SaslError, match="not a base64"):
        TokenIdentifier.from_username("ñandú")
    with pytest.raises(SaslError):
        TokenIdentifier.from_username("")


def test_password_encoding() -> None:
    assert encode_password(b"\xfb\xff") == "+/8="  # standard alphabet, padded
