"""Where an assembled hit's time goes, warm and after the CPU's caches were emptied.

    .venv/bin/python -m bench.assembled_steps [--partitions 3000] [--evict-mib 64]

In process, against the scripted metastore of the unit tests (no sockets): caches a table's
partitions in requests of 100, then answers requests of 100 other names, each once, as the
listener does (``CallHandler.serve_hit_now``), assembled from those partitions: names read
before (each request shares all but a few with the one before) and names all new. Each
kind runs warm (one after another) and cold: before each request, ``--evict-mib`` of memory
is written, as the metastore's JVM does on the same two cores between an engine's calls
(bench.cache's assembled case comes right after a 20 ms metastore call). The request's own
bytes are made after that, as a socket's are fresh.

Prints the p50 of the whole answer and of its steps, each timed by wrapping (not changing)
the function that is the step: whether the store is trusted, the request read for its names
(``Variants.of``), the reply judged and joined (``assembled.answer``, in C), names not
remembered yet found and remembered (``Variants.remember``), the write and its counts
(``_written``), the hit's counts after it (``count_assembled``). What the steps leave is the
dispatch between them (and whether the request was asked before: a hash and a look-up, not
a function of its own). A wrapper costs ~0.2 us warm.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from proxy import idl
from proxy.cache import partition_reads
from proxy.cache.store import MemoryStore
from proxy.handler import SessionState
from proxy.wire.framing import Transport, whole_message
from tests.unit.inprocess import Client, message, rig

DB, TABLE = "bench", "assembled"
BATCH = 100


class Steps:
    """Time spent in each wrapped function, per call."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, attribute)
        times = self.times.setdefault(name, [])
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                times.append(clock() - started)

        setattr(owner, attribute, timed)

    def clear(self) -> None:
        for times in self.times.values():
            times.clear()


def by_names(seqid: int, names: list[str]) -> bytes:
    return idl.encode_call(
        "get_partitions_by_names", seqid, db_name=DB, tbl_name=TABLE, names=names
    )


def us(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.1f}" if values else "-"


async def run(partitions: int, evict_bytes: int) -> None:
    days = [f"ds=p{i:06d}" for i in range(partitions)]
    store = MemoryStore(1 << 30)
    async with rig(store=store) as r:
        assert r.cache is not None and r.cache.l1 is not None
        r.cache.l1.max_bytes = 1 << 30  # (the rig's is small: every partition stays)
        r.hms.add_table(DB, TABLE, *(d[3:] for d in days), v="1")
        session = SessionState("shared")
        for first in range(0, partitions, BATCH):  # cached, and judged since (asked twice)
            for seqid in (1, 2):
                client = Client()
                await r.handler.handle(
                    session, message(by_names(seqid, days[first:][:BATCH])), client
                )
        steps = Steps()
        reads = r.cache.partitions
        steps.wrap(reads.store, "in_process", "in_process")
        steps.wrap(reads.variants, "of", "names read (Variants.of)")
        steps.wrap(partition_reads.assembled, "answer", "judged and joined (answer, C)")
        steps.wrap(reads.variants, "remember", "names remembered (remember)")
        steps.wrap(r.handler, "_written", "written and counted (_written)")
        steps.wrap(reads, "count_assembled", "hit counted (count_assembled)")
        evicted = bytearray(evict_bytes)
        # Requests start mid-way through a cached one (so none is a request cached whole):
        # the first half's every other partition, names read before but the last few; the
        # second half's, names new, warm in one quarter and cold in the other.
        half = partitions // 2 // BATCH * BATCH
        quarter = half + (partitions - half) // 2 // BATCH * BATCH
        kinds = [  # (name, the requests' first names, cold)
            ("names read before, warm", range(1, half - BATCH, 2), False),
            ("names read before, cold", range(2, half - BATCH, 2), True),
            ("names new, warm", range(half + BATCH // 2, quarter - BATCH, BATCH), False),
            ("names new, cold", range(quarter + BATCH // 2, partitions - BATCH, BATCH), True),
        ]
        rows = []
        for name, firsts, cold in kinds:
            steps.clear()
            totals = []
            for first in firsts:
                if first % BATCH == 0:
                    continue  # (a request cached whole: not assembled)
                if cold:
                    evicted[:] = bytes(evict_bytes)
                request = whole_message(
                    by_names(4, days[first:][:BATCH]), Transport.BUFFERED, 1 << 24
                )
                assert request is not None
                out: list[bytes] = []
                started = time.perf_counter()
                answered = r.handler.serve_hit_now(session, request, out.append)
                totals.append(time.perf_counter() - started)
                assert answered is True, f"{name}: not assembled at once"
            rows.append((name, len(totals), us(totals), [us(t) for t in steps.times.values()]))
        print(f"\n{partitions} partitions cached; each request names {BATCH}; p50 us\n")
        print("| requests | n | whole answer | " + " | ".join(steps.times) + " |")
        print("|---|---:|---:|" + "---:|" * len(steps.times))
        for name, n, total, parts in rows:
            print(f"| {name} | {n} | {total} | " + " | ".join(parts) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=3000)
    parser.add_argument("--evict-mib", type=int, default=64)
    args = parser.parse_args()
    if args.partitions < 4 * BATCH:
        parser.error(f"--partitions: at least {4 * BATCH}")
    asyncio.run(run(args.partitions, args.evict_mib << 20))


if __name__ == "__main__":
    main()
