"""The fuzz target (``tests/fuzz``) in the normal suite: a few hundred hostile inputs made
from real calls and from random bytes; proof that each of its checks can fail; and the bugs
the long run found, each as the input that showed it.

The long run is ``python -m tests.fuzz.run --inputs 1000000``.
"""

from __future__ import annotations

import os
import signal
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import catalog, idl
from proxy.cache.engine import CacheEngine
from proxy.cache.keys import Naming
from proxy.cache.planner import Planner, Ttls
from proxy.cache.store import MemoryStore
from proxy.catalog import Kind
from proxy.metrics import Metrics
from proxy.wire.binary import MessageType, PyStructScanner, parse_header
from proxy.wire.errors import MessageTooLarge
from proxy.wire.framing import Message, MessageReader, Transport
from tests.fuzz import sandbox, targets
from tests.fuzz.mutate import Mutator, encode_header
from tests.fuzz.seeds import Seed, seeds

SEEDS = seeds()
RIG_SEEDS = [s for s in SEEDS if s.source == "rig"]
HEADERS = [
    encode_header(b"get_table", MessageType.CALL, 1),
    encode_header(b"get_partitions_by_names", MessageType.CALL, 2),
    encode_header(b"alter_partition", MessageType.CALL, 3),
    encode_header(b"get_table", MessageType.REPLY, 4),
    struct.pack(">i", 9) + b"get_table" + b"\x01" + struct.pack(">i", 5),  # non-strict
]


def message_of(seed: Seed, seqid: int = 1) -> bytes:
    return encode_header(seed.method.encode(), MessageType.CALL, seqid) + seed.body


def run_isolated(data: bytes, cuts: list[int] | None = None) -> None:
    """The target on ``data`` in a forked child (memory and CPU capped); any failure fails
    the test."""
    try:
        outcome = sandbox.isolated(targets.check_bounded, data, cuts)
    except targets.Failure as exc:
        raise AssertionError(f"{exc}\ninput: {data.hex()}") from None
    if isinstance(outcome, sandbox.Died):
        raise AssertionError(f"the target's process was {outcome.how}; input: {data.hex()}")


# -- the seeds are real traffic ----------------------------------------------------------------


def test_every_catalog_method_has_seeds_the_proxy_reads_whole() -> None:
    declared = {s.name for s in catalog.all_methods()} & idl.method_names()
    assert {s.method for s in SEEDS} == declared
    assert len(RIG_SEEDS) > 200
    for seed in SEEDS:
        data = message_of(seed)
        reader = MessageReader(Transport.BUFFERED, 1 << 20)
        reader.feed(data)
        message = reader.next_message()
        assert message is not None and message.body == seed.body and reader.buffered == 0
        assert targets.desync(seed.method, seed.body) is None, seed
        if seed.source == "rig":
            idl.decode_args(seed.method, seed.body)  # what engines send decodes


def test_real_calls_pass_the_target_untouched() -> None:
    """No false alarms on what engines send: every rig call passes every check."""
    for seed in RIG_SEEDS:
        reached = targets.check_bounded(message_of(seed))
        assert reached.messages == 1 and reached.calls == 1


def test_the_target_plans_as_the_engine_does() -> None:
    planner = Planner(Naming(), Ttls(), per_user=False)
    engine = CacheEngine(
        MemoryStore(1 << 20), planner, Metrics(), l1_bytes=1 << 20, max_entry_bytes=1 << 20
    )
    compared = 0
    for seed in RIG_SEEDS:
        spec = catalog.lookup(seed.method)
        assert spec is not None
        data = message_of(seed)
        header = parse_header(data, 0, len(data))
        assert header is not None
        message = Message(header, data)
        args = idl.decode_args(seed.method, seed.body)
        if spec.kind is Kind.CACHEABLE_READ:
            mine: Any = targets.plan_read(planner, spec, args, seed.body, None)
            assert engine.plan_read(spec, message, None) == mine
            compared += 1
        elif spec.kind is Kind.WRITE:
            assert engine.plan_write(spec, message) == targets.plan_write(planner, spec, args)
            compared += 1
    assert compared > 150


# -- hostile inputs ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), cuts=st.lists(st.integers(0, 20_000), max_size=6))
def test_mutated_calls(rng: Any, cuts: list[int]) -> None:
    data = Mutator(SEEDS, rng).input()
    run_isolated(data, cuts)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.tuples(st.sampled_from(HEADERS), st.binary(max_size=300)).map(b"".join),
    ),
    cuts=st.lists(st.integers(0, 700), max_size=5),
)
def test_random_bytes(data: bytes, cuts: list[int]) -> None:
    run_isolated(data, cuts)


# -- each check can fail ---------------------------------------------------------------------------


def _get_table() -> bytes:
    return message_of(next(s for s in RIG_SEEDS if s.method == "get_table"))


def test_a_planner_that_raises_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(Planner, "read", broken)
    with pytest.raises(targets.Failure) as failure:
        targets.check(_get_table())
    assert failure.value.signature.startswith("planner: KeyError")


def test_a_decoder_that_raises_something_else_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(method: str, body: bytes) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(idl, "decode_args", broken)
    with pytest.raises(targets.Failure) as failure:
        targets.check(_get_table())
    assert failure.value.signature.startswith("decode: ValueError")


def test_scanners_that_disagree_are_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    class OffByOne(PyStructScanner):
        def scan(self, buf: bytes | bytearray, end: int) -> bool:
            done = super().scan(buf, end)
            if done:
                self.pos += 1
            return done

    monkeypatch.setattr(targets, "SCANNERS", (PyStructScanner, OffByOne))
    with pytest.raises(targets.Failure) as failure:
        targets.check(_get_table())
    assert failure.value.signature == "scanner: C and Python disagree"


def test_an_allocation_past_the_bound_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    real = idl.decode_args
    hoard: list[bytearray] = []

    def greedy(method: str, body: bytes) -> Any:
        hoard.append(bytearray(targets.allocation_limit(body) + 1))
        return real(method, body)

    monkeypatch.setattr(idl, "decode_args", greedy)
    with pytest.raises(targets.Failure) as failure:
        targets.check_bounded(_get_table())
    assert failure.value.signature == "allocation: peak"


def _crash_here() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)  # in the child: its own pid


def test_a_process_that_dies_is_reported() -> None:
    assert sandbox.isolated(_crash_here) == sandbox.Died("killed by SIGSEGV")


# -- the bugs the fuzzer found, fixed -------------------------------------------------------------


def _string(raw: bytes) -> bytes:
    return struct.pack(">i", len(raw)) + raw


# 68 bytes: get_table with an unknown UUID field (16 bytes the scanner steps over and
# thriftpy2 does not), whose bytes then read as field 1, a string of 2**31 - 1 bytes.
UUID_GET_TABLE = encode_header(b"get_table", MessageType.CALL, 1) + (
    b"\x0b\x00\x01"
    + _string(b"proxy_it")
    + b"\x0b\x00\x02"
    + _string(b"sales")
    + b"\x10\x00\x63"
    + b"\x0b\x00\x01\x7f\xff\xff\xff"
    + bytes(9)
    + b"\x00"
)


def _skewed_alter_table() -> bytes:
    """61 bytes of arguments: alter_table whose new table's skewedColValueLocationMaps
    (map<list<string>, string>) says map<string, string>; thriftpy2 reads the key's string
    as a list header, then a string length of 2**31 - 1 from the key's bytes."""
    module = idl.module()

    def fid(cls: Any, name: str) -> int:
        return next(f for f, spec in cls.thrift_spec.items() if spec[1] == name)

    def field_(ttype: int, cls: Any, name: str) -> bytes:
        return struct.pack(">bh", ttype, fid(cls, name))

    key = b"\x00\x7f\xff\xff\xff"
    skewed = (
        field_(13, module.SkewedInfo, "skewedColValueLocationMaps")
        + b"\x0b\x0b"
        + struct.pack(">i", 1)
        + _string(key)
        + _string(b"v")
        + b"\x00"
    )
    sd = field_(12, module.StorageDescriptor, "skewedInfo") + skewed + b"\x00"
    table = field_(12, module.Table, "sd") + sd + b"\x00"
    body = b"\x0b\x00\x01" + _string(b"no_such_db") + b"\x0b\x00\x02" + _string(b"t")
    body += b"\x0c\x00\x03" + table + b"\x00"
    return encode_header(b"alter_table", MessageType.CALL, 1) + body


def test_a_uuid_field_does_not_derail_the_decoder() -> None:
    assert targets.desync("get_table", UUID_GET_TABLE[21:]) == "uuid"
    run_isolated(UUID_GET_TABLE)


def test_a_map_typed_as_strings_does_not_derail_the_decoder() -> None:
    data = _skewed_alter_table()
    assert targets.desync("alter_table", data[23:]) == "map"
    run_isolated(data)


def test_the_reader_refuses_a_message_once_it_outgrows_max_size() -> None:
    limit = 4096
    head = encode_header(b"get_table", MessageType.CALL, 1)
    pad = next(p for p in range(7) if (limit - len(head) - 7 - p) % 7 in (0, 1, 2))
    head += b"\x0b\x00\x62" + _string(b"p" * pad)
    field_ = b"\x08\x00\x63" + struct.pack(">i", 1)  # fields of 7 bytes: one straddles 4096
    reader = MessageReader(Transport.BUFFERED, limit)
    stream = head + field_ * ((limit - len(head)) // 7 + 2)
    reader.feed(stream[: limit - 1])
    assert reader.next_message() is None  # all within the limit: wait for the rest
    reader.feed(stream[limit - 1 :])
    with pytest.raises(MessageTooLarge):
        reader.next_message()  # refused with the first byte past the limit


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("get_partition", {"db_name": "d", "tbl_name": "t", "part_vals": ["x"]}),
        ("drop_partition", {"db_name": "d", "tbl_name": "t", "part_vals": ["x"]}),
        ("alter_partition", {"db_name": "d", "tbl_name": "t", "new_part": ["x"]}),
        ("add_partition", {"new_part": ["x"]}),
    ],
)
def test_partition_values_that_are_not_utf8_get_a_plan_or_none(
    method: str, args: dict[str, Any]
) -> None:
    if "new_part" in args:
        args = {
            **args,
            "new_part": idl.module().Partition(values=args["new_part"], dbName="d", tableName="t"),
        }
    body = idl.encode(idl.args_class(method)(**args)).replace(b"x", b"\xff")
    decoded = idl.decode_args(method, body)
    spec = catalog.lookup(method)
    assert spec is not None
    planner = Planner(Naming(), Ttls(), per_user=False)
    if spec.kind is Kind.CACHEABLE_READ:
        planner.read(spec, decoded, body, None)
    else:
        planner.write(spec, decoded)
