"""A repeated get_partitions_by_names of an engine's size: known by its bytes, or not.

    .venv/bin/python -m bench.repeat_size [--names 100] [--calls 400] [--rounds 4]

In process, through the real listener on a loopback port, against the scripted metastore of
the unit tests: one client asks the same ``get_partitions_by_names`` again and again (100
names a few levels deep, as an engine batches them: ~5 KB), and the proxy's own time per
call is taken around its socket callback (``data_received``, where such a call is answered
at once). Two ways, alternating round by round in one run: the request known by its bytes
but for the seqid (``framing.call_without_seqid``, up to ``binary.REPEAT_BYTES``), so that
its last answer answers it again; and the same request above the limit (the limit lowered to
the 4 KiB it was, on the Python twin), which takes the looked-up way each time: the end of
the message found, the memo of requests, the plan, the entry. Both answer with the
metastore's bytes (checked). p50 and p90 in us, warm (one call after another).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from proxy import idl
from proxy.conn.protocol import ClientProtocol
from proxy.wire import binary, framing
from tests.unit.test_server_shortcut import connect, listening

DB, TABLE = "db", "t"
OLD_LIMIT = 4096  # what REPEAT_BYTES was before issue 16's twentieth step


def timed_callbacks(spent: list[float]) -> None:
    """Take the time of every ``data_received`` of a client connection's protocol."""
    original = ClientProtocol.data_received

    def timed(self: Any, data: bytes) -> None:
        started = time.perf_counter()
        original(self, data)
        spent.append(time.perf_counter() - started)

    ClientProtocol.data_received = timed  # type: ignore[method-assign]


async def run(names: int, calls: int, rounds: int) -> None:
    spent: list[float] = []
    timed_callbacks(spent)
    values = [f"2024-01-{i:03d}-region-us-east-1-bucket-{i:05d}" for i in range(names)]
    asked = [f"ds={v}" for v in values]

    def request(seqid: int) -> bytes:
        return idl.encode_call(
            "get_partitions_by_names", seqid, db_name=DB, tbl_name=TABLE, names=asked
        )

    size = len(request(1))
    assert OLD_LIMIT < size <= binary.REPEAT_BYTES, f"{size} bytes: not between the limits"
    limits = {"known by its bytes": binary.REPEAT_BYTES, "looked up (limit 4 KiB)": OLD_LIMIT}
    framing.without_seqid = framing.py_without_seqid  # (the twin reads binary.REPEAT_BYTES)
    times: dict[str, list[float]] = {way: [] for way in limits}
    async with listening() as (r, _counted, port):
        r.hms.add_table(DB, TABLE, *values, v="1")
        client = await connect(r, port)
        for seqid in range(1, 6):  # a miss, judged, kept whole, then hits
            await client.call(request(seqid))
        await client.close()
        for _ in range(rounds):
            for way, limit in limits.items():
                # A connection of its own each time: one that answered the request again
                # keeps its answer, which compares the bytes in place whatever the limit.
                binary.REPEAT_BYTES = limit  # type: ignore[misc]
                client = await connect(r, port)
                try:
                    for seqid in range(10):  # (settled into this way)
                        await client.call(request(seqid))
                    spent.clear()
                    for seqid in range(calls):
                        reply = await client.call(request(seqid))
                finally:
                    await client.close()
                expected = r.hms.answer(
                    "get_partitions_by_names", seqid, db_name=DB, tbl_name=TABLE, names=asked
                )
                assert reply == expected
                times[way] += spent
    print(f"\n{names} names, a {size:,}-byte request, {rounds} rounds of {calls} calls each way")
    print("\n| the request | p50 us | p90 us |\n|---|---:|---:|")
    p50 = {}
    for way, spans in times.items():
        cuts = statistics.quantiles(spans, n=10)
        p50[way] = statistics.median(spans) * 1e6
        print(f"| {way} | {p50[way]:.1f} | {cuts[8] * 1e6:.1f} |")
    known, looked = p50.values()
    print(f"\nlooked up / known by its bytes: {looked / known:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--names", type=int, default=100)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args.names, args.calls, args.rounds))


if __name__ == "__main__":
    main()
