"""Split arithmetic (both worked examples exactly, and properties) and the sealed rule."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.listing.seal import SealRule, parse_marker
from proxy.listing.splits import (
    MB,
    SparkRules,
    TrinoRules,
    plan,
    spark_max_split_bytes,
    spark_splits,
    trino_splits,
)

KB = 1024


def test_trino_worked_examples() -> None:
    assert trino_splits([500 * KB] * 10_080) == 10_080
    # Files take turns: the first 105 splits halve every file, then the halves fit whole.
    assert trino_splits([50 * MB] * 105) == 210


def test_trino_initial_splits_then_full_size() -> None:
    rules = TrinoRules(max_initial_splits=2, max_initial_split_size=10, max_split_size=100)
    # 25: 10 (initial), then 15 left with one initial split to go: <= 2*10, halves (7, 8).
    assert trino_splits([25], rules) == 3
    assert trino_splits([0, 0, 5], rules) == 1  # empty files make no split


@settings(max_examples=300)
@given(st.lists(st.integers(0, 500 * MB), max_size=60))
def test_trino_properties(sizes: list[int]) -> None:
    rules = TrinoRules()
    n = trino_splits(sizes, rules)
    nonempty = sum(1 for s in sizes if s)
    assert n >= nonempty  # every file at least once
    assert n >= math.ceil(sum(sizes) / rules.max_split_size)  # no split beyond the cap
    assert n <= sum(math.ceil(s / (rules.max_initial_split_size // 2)) for s in sizes if s)


def test_spark_max_split_bytes() -> None:
    assert spark_max_split_bytes([500 * MB]) == 128 * MB
    assert spark_max_split_bytes([1 * KB]) == 4 * MB + 1 * KB  # the file plus its open cost
    # 10 files of 100 MB cost 1,040 MB with open costs: 10.4 MB per core on 100 cores.
    assert spark_max_split_bytes([100 * MB] * 10, SparkRules(parallelism=100)) == 1040 * MB // 100


def test_spark_packs_small_files() -> None:
    # 500 KB files count ~4.5 MB each with the open cost: 29 of them go in one 128 MB task.
    assert spark_splits([500 * KB] * 58) == 2
    assert spark_splits([500 * KB] * 59) == 3
    assert spark_splits([200 * MB]) == 2  # chunks of 128 and 72 MB


@settings(max_examples=300)
@given(st.lists(st.integers(0, 400 * MB), min_size=1, max_size=60), st.integers(1, 64))
def test_spark_properties(sizes: list[int], parallelism: int) -> None:
    rules = SparkRules(parallelism=parallelism)
    n = spark_splits(sizes, rules)
    cap = spark_max_split_bytes(sizes, rules)
    assert n >= math.ceil(sum(sizes) / cap)
    assert n <= sum(max(1, math.ceil(s / cap)) for s in sizes)


def test_plan_summarises_small_files_and_compaction() -> None:
    p = plan([[500 * KB] * 10_080], "trino", target_file_size=128 * MB)
    assert (p.splits, p.files, p.small_files, p.partitions) == (10_080, 10_080, 10_080, 1)
    assert p.compacted_files == math.ceil(10_080 * 500 * KB / (128 * MB))  # 39
    # 39 files of ~126 MB, each cut in four 32 MB initial splits (156 of the 200 allowed).
    assert p.compacted_splits == 39 * 4
    # Compaction works per partition: 10 partitions of 1 MB make 10 files, not 1.
    per_partition = plan([[100 * KB] * 10] * 10, "spark")
    assert (per_partition.compacted_files, per_partition.partitions) == (10, 10)
    assert sum(b.files for b in p.histogram) == p.files
    assert sum(b.bytes for b in p.histogram) == p.bytes


def test_sealed_rule() -> None:
    rule = SealRule(seal_after=3600)
    old = {"transient_lastDdlTime": "1000"}
    assert rule.sealed(old, 1000 + 3600, None)
    assert not rule.sealed(old, 1000 + 3599, None)
    assert not rule.sealed({}, 10**10, None)  # no change time: open
    marked = SealRule(seal_after=3600, marker=parse_marker("sealed=true"))
    assert marked.sealed({"sealed": "true", "transient_lastDdlTime": str(10**10)}, 0, None)
    with_file = SealRule(seal_after=0, marker_file="_SUCCESS")
    assert not with_file.sealed(old, 5000, {"part-0.parquet"})
    assert with_file.sealed(old, 5000, {"part-0.parquet", "_SUCCESS"})
