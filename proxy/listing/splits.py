"""How many splits an engine makes of a scan, and what small files cost (pure).

**Trino** (Hive connector, ``HiveSplitSource``): each file is cut into splits; the first
``max-initial-splits`` (200) splits are at most ``max-initial-split-size`` (32 MB), the rest at
most ``max-split-size`` (64 MB). When what is left of a file is more than one split but at
most two, it is cut in two even halves. Empty files make no split. Files take turns: a split
is cut off the file at the head of a queue, and the rest of it goes to the back, so the
initial splits are spread over many files (105 files of 50 MB: each cut in two 25 MB halves,
210 splits). This counts every file queued before the first cut; Trino queues files as its
listing finds them, so a slow listing lets it cut some files twice first, down to 205 for
those 105 files (Trino 476 made 209 and 210 in tests/e2e/test_trino.py).

**Spark** (``FilePartition``): ``maxSplitBytes = min(maxPartitionBytes, max(openCostInBytes,
totalBytes / parallelism))`` where every file counts its size plus ``openCostInBytes``; files
are cut into chunks of ``maxSplitBytes``, sorted largest first, and packed into partitions
(tasks): a partition is closed when the next chunk would take it past ``maxSplitBytes``, each
chunk adding its size plus the open cost.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass

MB = 1 << 20


@dataclass(frozen=True, slots=True)
class TrinoRules:
    max_initial_splits: int = 200
    max_initial_split_size: int = 32 * MB
    max_split_size: int = 64 * MB


@dataclass(frozen=True, slots=True)
class SparkRules:
    max_partition_bytes: int = 128 * MB
    open_cost_in_bytes: int = 4 * MB
    parallelism: int = 1  # spark.default.parallelism (or minPartitionNum) of the cluster


def trino_splits(sizes: Sequence[int], rules: TrinoRules = TrinoRules()) -> int:
    remaining_initial = rules.max_initial_splits
    # HiveSplitSource's queue: each turn cuts one split off the file at its head and puts what
    # is left back at its tail (AsyncQueue.borrowBatchAsync), so files take turns.
    queue = collections.deque(size for size in sizes if size > 0)
    splits = 0
    while queue:
        left = queue.popleft()
        limit = rules.max_split_size
        if remaining_initial > 0:
            remaining_initial -= 1
            limit = rules.max_initial_split_size
        if left <= limit:
            cut = left
        elif 2 * limit >= left:
            cut = left // 2  # the second-to-last split: two even halves
        else:
            cut = limit
        splits += 1
        if left > cut:
            queue.append(left - cut)
    return splits


def spark_max_split_bytes(sizes: Sequence[int], rules: SparkRules = SparkRules()) -> int:
    total = sum(s + rules.open_cost_in_bytes for s in sizes)
    per_core = total // max(1, rules.parallelism)
    return min(rules.max_partition_bytes, max(rules.open_cost_in_bytes, per_core))


def spark_splits(sizes: Sequence[int], rules: SparkRules = SparkRules()) -> int:
    max_bytes = spark_max_split_bytes(sizes, rules)
    chunks = []
    for size in sizes:
        offset = 0
        while offset < size:
            chunks.append(min(max_bytes, size - offset))
            offset += max_bytes
    chunks.sort(reverse=True)
    partitions = 0
    current_size = 0
    open_partition = False
    for chunk in chunks:
        if open_partition and current_size + chunk > max_bytes:
            partitions += 1
            current_size = 0
            open_partition = False
        current_size += chunk + rules.open_cost_in_bytes
        open_partition = True
    return partitions + (1 if open_partition else 0)


BUCKETS = (
    ("< 1 MB", 0, 1 * MB),
    ("1-16 MB", 1 * MB, 16 * MB),
    ("16-64 MB", 16 * MB, 64 * MB),
    ("64-128 MB", 64 * MB, 128 * MB),
    ("128-256 MB", 128 * MB, 256 * MB),
    (">= 256 MB", 256 * MB, math.inf),
)


@dataclass(frozen=True, slots=True)
class Bucket:
    label: str
    files: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Plan:
    engine: str
    splits: int
    files: int
    bytes: int
    histogram: tuple[Bucket, ...]
    small_files: int
    small_file_threshold: int
    compacted_files: int
    compacted_splits: int
    partitions: int = 0


def plan(
    partitions: Sequence[Sequence[int]],
    engine: str,
    *,
    trino: TrinoRules = TrinoRules(),
    spark: SparkRules = SparkRules(),
    small_file_threshold: int = 32 * MB,
    target_file_size: int = 128 * MB,
) -> Plan:
    """Splits ``engine`` ("trino" or "spark") makes of a scan of ``partitions`` (the file
    sizes of each), and what compacting each partition into files of ``target_file_size``
    would change (files are never merged across partitions)."""

    def count(files: Sequence[int]) -> int:
        return trino_splits(files, trino) if engine == "trino" else spark_splits(files, spark)

    sizes = [size for files in partitions for size in files]
    compacted: list[int] = []
    for files in partitions:
        total_p = sum(files)
        if total_p:
            n = math.ceil(total_p / target_file_size)
            compacted += [total_p // n + (1 if i < total_p % n else 0) for i in range(n)]
    histogram = tuple(
        Bucket(label, sum(1 for s in sizes if lo <= s < hi), sum(s for s in sizes if lo <= s < hi))
        for label, lo, hi in BUCKETS
    )
    return Plan(
        engine=engine,
        splits=count(sizes),
        files=len(sizes),
        bytes=sum(sizes),
        histogram=histogram,
        small_files=sum(1 for s in sizes if s < small_file_threshold),
        small_file_threshold=small_file_threshold,
        compacted_files=len(compacted),
        compacted_splits=count(compacted),
        partitions=len(partitions),
    )
