"""The C twin of proxy.cache.keys.py_name_parts (``_names.c``) gives the Python one's answers.

A name new to the proxy is read by the C twin (every name of a ``get_partitions_by_names``
request the names memo does not hold); the Python twin is the reference, and the C one
hands it any name with a byte other than ASCII. The two are held to the same answers over
names the metastore writes (every character its escaping touches, in keys and values),
names it does not write (escapes in lower case, of characters it leaves alone, cut short,
upper-case keys, empty parts), names the database would match loosely (a trailing blank)
or lossily (beyond ASCII), which both refuse, and bytes changed at random.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.cache import keys

# What escapePathName escapes, what it leaves, and what a value is made of besides.
SPECIAL = "\"#%'*/:=?\\\x7f{[]^"
CHARACTERS = st.one_of(
    st.sampled_from(SPECIAL),
    st.characters(max_codepoint=0x1F),
    st.sampled_from("aZ09-_. ~`!@$&()+,;<>|}"),
    st.characters(min_codepoint=0x80),  # (to the Python twin)
)
KEYS = st.text(st.one_of(st.sampled_from("abz09_."), st.sampled_from("#*")), min_size=1)
VALUES = st.text(CHARACTERS, max_size=12)


@st.composite
def names(draw: st.DrawFn) -> bytes:
    """A name as the metastore writes it, or one changed: as a client may send one."""
    count = draw(st.integers(1, 4))
    columns = draw(st.lists(KEYS, min_size=count, max_size=count))
    values = draw(st.lists(VALUES, min_size=count, max_size=count))
    raw = bytearray(keys.partition_name(columns, values).encode("utf-8", "surrogatepass"))
    how = draw(st.sampled_from(["as it is", "as it is", "cut", "flipped", "lowered", "grown"]))
    if how == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif how == "flipped":
        raw[draw(st.integers(0, len(raw) - 1))] = draw(
            st.sampled_from(b"%/=Aa\x00\x7f\x80\xc3\xff")
        )
    elif how == "lowered":  # escapes in lower case, keys in upper
        raw = bytearray(draw(st.sampled_from([raw.lower(), raw.upper()])))
    elif how == "grown":
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.sampled_from([b"%", b"%2", b"%2f", b"%41", b"%25", b"/", b"="]))
    if draw(st.integers(0, 5)) == 0:  # padded, as a client may send one
        raw += draw(st.sampled_from([b" ", b"  ", b"\t", b" /r=1"]))
    return bytes(raw)


def test_the_c_twin_is_built() -> None:
    # The fallback is for exotic platforms only; here a missing build is a packaging bug.
    assert keys.name_parts is not keys.py_name_parts


@settings(max_examples=1500, deadline=None)
@given(raw=st.one_of(names(), st.binary(max_size=24)))
@example(raw=b"")
@example(raw=b"/")
@example(raw=b"ds=")
@example(raw=b"=1")
@example(raw=b"ds=1/")
@example(raw=b"a%23b=%22x%5C%0A%7F%01")  # an escaped key; every JSON escape of a value
@example(raw=b"a%2Fb=1")  # an escape with a letter in a key is upper case there
@example(raw=b"ds=%2")  # an escape cut short at the end
@example(raw=b"ds=__HIVE_DEFAULT_PARTITION__")
@example(raw=b"ds=\xc3\xa9/r=eu")  # UTF-8, to the Python twin
@example(raw=b"ds=\xed\xa0\x80")  # a surrogate's bytes: not UTF-8
@example(raw=("k=" + "%2F" * 300).encode())  # past the C twin's buffer on the stack
@example(raw=b"ds=1 ")  # a trailing blank: the database matches ds=1 (refused)
@example(raw=b"ds= ")
@example(raw=b" ")
@example(raw=b"ds=1 /r=eu")  # a blank inside: matched exactly
@example(raw=b"ds=1%20")  # an escape Hive does not write (refused)
def test_name_parts_twins_agree(raw: bytes) -> None:
    assert keys.name_parts(raw) == keys.py_name_parts(raw)


def test_the_twins_read_names_as_the_planner_does() -> None:
    # (So that the random cases above are not all refusals, and the tail is the field's.)
    raw = b"ds=2024-01-01/a%23b=x%2Fy%0A"
    assert keys.name_parts(raw) == ("ds/a%23b", b'["2024-01-01", "x/y\\n"]')
    tail = keys.partition_field(["2024-01-01", "x/y\n"])[2:]
    assert keys._columns_and_tail(raw) == ("ds/a%23b", tail)


def test_names_beyond_ascii_go_to_the_python_twin() -> None:
    from proxy.cache._names import configure

    asked: list[bytes] = []

    def twin(raw: bytes) -> tuple[str, bytes] | None:
        asked.append(raw)
        return keys.py_name_parts(raw)

    configure(twin)
    try:
        # Refused there: MySQL keeps names in latin1, where others become '?' (see keys).
        assert keys.name_parts(b"ds=\xc3\xa9") is None
        assert keys.name_parts(b"ds=1") == ("ds", b'["1"]')
    finally:
        configure(keys.py_name_parts)
    assert asked == [b"ds=\xc3\xa9"]


def test_names_the_database_matches_loosely_are_refused_by_both() -> None:
    for raw in (b"ds=1 ", b"ds=1/r=eu ", b"ds=\xc3\xa9", b"ds=1\xc2\xa0"):
        assert keys.py_name_parts(raw) is None
        assert keys.name_parts(raw) is None
        assert keys.columns_and_tail(raw) is None
    assert keys.name_parts(b"ds=1 /r=eu") == ("ds/r", b'["1 ", "eu"]')
