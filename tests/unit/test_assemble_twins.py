"""The C twin of proxy.cache.assembled.py_answer (_assemble.c) against the Python one: the
same answers, the same items marked used, over random requests of items in every state a
judgement looks at and of names not remembered; and the reply the layout
proxy.cache.partitions.reply gives."""

from __future__ import annotations

import math
import random
import weakref
from dataclasses import dataclass

import pytest

from proxy.cache import assembled
from proxy.cache import partitions as parts
from proxy.cache.entry import ABSENT, Entry
from proxy.cache.l1 import RETIRED, Item
from proxy.wire.binary import MessageType, encode_header

GENERATION = 7
NOW, WALL = 1000.0, 1_700_000_000.0
METHODS = ["get_partitions_by_names", "get_partitions_by_names_req"]

c_answer = assembled.answer
py_answer = assembled.py_answer


def test_the_c_twin_is_built() -> None:
    # The fallback is for exotic platforms only; here a missing build is a packaging bug.
    assert c_answer is not py_answer


@dataclass
class Case:
    found: dict[bytes, weakref.ref[Item]]
    names: list[bytes]
    items: list[Item]  # every item made (alive while the case is)
    method: str
    seqid: int
    largest: int

    def args(self) -> tuple[object, ...]:
        head = encode_header(self.method, MessageType.REPLY, self.seqid)
        before, closing = parts.result_framing(self.method)
        return (
            self.found,
            self.names,
            GENERATION,
            NOW,
            WALL,
            head,
            before,
            closing,
            self.largest,
        )


def make_item(rnd: random.Random, n: int, flaws: float) -> Item:
    data = rnd.randbytes(rnd.randint(0, 40))
    payload: bytes | memoryview = data
    if rnd.random() < 0.3:  # a slice of a larger reply, as entries cut from one are
        payload = memoryview(b"<" + data + b">")[1:-1]
    flags = ABSENT if rnd.random() < 0.1 else rnd.choice([0, 1, 2])
    if flags & ABSENT:
        payload = b""
    stamp = GENERATION
    expires, entry_expires = NOW + rnd.uniform(0.001, 100), WALL + rnd.uniform(0.001, 100)
    if rnd.random() < flaws:
        which = rnd.randrange(6)
        if which == 0:
            stamp = rnd.choice([GENERATION - 1, GENERATION + 1, -1, RETIRED, 2**70])
        elif which == 1:
            expires = rnd.choice([NOW, NOW - 1])
        elif which == 2:
            entry_expires = rnd.choice([WALL, WALL - 5, 0.0])
        elif which == 3:  # ints, as Python compares them with floats
            expires = int(NOW) + rnd.choice([-1, 0, 1])  # type: ignore[assignment]
            entry_expires = int(WALL) + rnd.choice([-1, 0, 1])  # type: ignore[assignment]
        elif which == 4:
            entry_expires = rnd.choice([WALL + 1, WALL])
        else:  # never later than anything
            expires, entry_expires = rnd.choice([(math.nan, entry_expires), (expires, math.nan)])
    entry = Entry(b"fp", flags, payload, entry_expires)
    return Item(f"k{n}", entry, expires, 10, judged_under=stamp)


def make_case(rnd: random.Random, flaws: float) -> Case:
    count = rnd.randint(0, 12)
    items = [make_item(rnd, n, flaws / 4) for n in range(count)]
    names = [f"ds={rnd.randrange(10**6):06d}/h={n}".encode() for n in range(count)]
    found = {name: weakref.ref(item) for name, item in zip(names, items, strict=True)}
    asked = list(names)
    if rnd.random() < 0.5:
        rnd.shuffle(asked)
    if asked and rnd.random() < flaws:
        which = rnd.randrange(4)
        if which == 0:
            asked.append(rnd.choice(asked))  # a name asked twice
        elif which == 1:  # another name of the same partition
            other = b"other-" + asked[0]
            found[other] = found[asked[0]]
            asked.append(other)
        elif which == 2:
            asked.append(b"not remembered")
        else:  # an item gone (L1 let it go): its weak reference is dead
            gone = make_item(rnd, -1, 0)
            found[b"gone"] = weakref.ref(gone)
            del gone
            asked.insert(rnd.randrange(len(asked) + 1), b"gone")
    total = sum(len(i.entry.payload) for i in items) + 60
    largest = rnd.choice([1 << 20, total, rnd.randint(0, total)])
    seqid = rnd.randrange(-(2**31), 2**31)
    return Case(found, asked, items, rnd.choice(METHODS), seqid, largest)


@pytest.mark.parametrize("seed", range(40))
def test_the_twins_answer_alike(seed: int) -> None:
    rnd = random.Random(seed)
    outcomes = set()
    for _ in range(150):
        case = make_case(rnd, flaws=rnd.choice([0.0, 0.1, 0.5]))
        got_c = c_answer(*case.args())
        used_c = [item.used for item in case.items]
        for item in case.items:
            item.used = False
        got_py = py_answer(*case.args())  # type: ignore[arg-type]
        used_py = [item.used for item in case.items]
        assert got_c == got_py
        assert used_c == used_py
        if got_py is None:
            outcomes.add("none")
            continue
        if isinstance(got_py, list):  # the names not remembered, or whose item is gone
            outcomes.add("not remembered")
            assert got_py == [
                at
                for at, name in enumerate(case.names)
                if name not in case.found or not case.found[name]()
            ]
            assert not any(used_py)
            continue
        reply, whole = got_py
        outcomes.add(f"{reply is not None} {whole}")
        if reply is not None:  # the layout partitions.reply gives, in name order
            pairs = [
                (name, item.entry.payload)
                for name, item in zip(
                    case.names, (case.found[n]() for n in case.names), strict=True
                )
                if item is not None and not item.entry.flags & ABSENT
            ]
            assert reply == parts.reply(case.method, case.seqid, pairs)
            assert len(reply) <= case.largest
    # Every way out was taken (else the random cases are not testing what they should).
    assert outcomes >= {"none", "not remembered", "True True", "True False"}


def test_a_reply_that_would_be_too_long_is_not_made() -> None:
    items = [Item(f"k{n}", Entry(b"", 0, b"x" * 10, WALL + 9), NOW + 9, 1) for n in range(3)]
    for item in items:
        item.judged_under = GENERATION
    names = [b"b", b"a", b"c"]
    found = {name: weakref.ref(item) for name, item in zip(names, items, strict=True)}
    for twin in (c_answer, py_answer):
        args = (found, names, GENERATION, NOW, WALL, b"H", b"<", b">")
        whole = b"H<\x00\x00\x00\x03" + b"x" * 30 + b">"
        assert twin(*args, len(whole)) == (whole, True)  # type: ignore[operator]
        assert twin(*args, len(whole) - 1) == (None, True)  # type: ignore[operator]
        assert twin(*args, -(2**62)) == (None, True)  # type: ignore[operator]


def test_the_c_twin_refuses_what_l1_never_keeps() -> None:
    """Where the types are not L1's (a stamp that is not an int, a flags field that is
    not one), the C twin refuses and the Python way decides: never a reply the twin would
    not give."""
    item = Item("k", Entry(b"", 0, b"x", WALL + 9), NOW + 9, 1, judged_under=GENERATION)
    found = {b"a": weakref.ref(item)}
    args = (found, [b"a"], GENERATION, NOW, WALL, b"", b"", b"", 1 << 20)
    assert c_answer(*args) == (b"\x00\x00\x00\x01x", True)
    item.judged_under = float(GENERATION)  # type: ignore[assignment]
    assert c_answer(*args) is None
    item.judged_under = GENERATION
    item.entry = Entry(b"", 0.0, b"x", WALL + 9)  # type: ignore[arg-type]
    assert c_answer(*args) is None


def test_configure_refuses_a_class_without_slots() -> None:
    from proxy.cache import _assemble

    class Plain:
        judged_under = 0

    with pytest.raises((TypeError, AttributeError)):
        _assemble.configure(Plain, Entry, ABSENT)
    c_answer(*make_case(random.Random(1), 0).args())  # (still configured as before)
