"""Where a call answered again spends its time, warm and after the CPU's caches were emptied.

    .venv/bin/python -m bench.again_steps [--evict-mib 64] [--runs 400]   # ~2 min

In process, against the scripted metastore of the unit tests (no sockets): a get_table
hit is answered once at once (``CallHandler.serve_hit_now``), then the same call is
answered again (``Again.answer``, proxy/handler/again.py) to a transport that only counts
its writes. Warm: one answer after another. Cold: before each, ``--evict-mib`` of memory
is written, as the metastore's JVM and the engine do on the same two cores between an
engine's calls; the request's bytes are made after that, as a socket's are fresh.

Beside ``Again.answer`` as it is, the same object is timed doing less, to show what each
part costs cold: its checks without its counts, the comparison and the write alone (the
least a repeated call can be answered with), the comparison alone, and a function that does
nothing (a Python call's own cost, cold). p50 us.

Then the same call answered at once as a connection's first (Trino opens one per call):
known by its bytes but for the seqid (``call_without_seqid``, then
``CallHandler.serve_known_now``), timed to the moment its reply is handed to the write
(what the client waits for) and to the end of the whole call (the counting after it too);
and as a connection's first call is answered since the answer is kept for every
connection (``KnownCalls.get``, then ``Again.answer``; the counting comes later).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import CountingTransport
from proxy import idl
from proxy.cache.l1 import Item
from proxy.handler import SessionState
from proxy.handler.again import Again
from proxy.wire.framing import Transport, call_without_seqid, whole_message
from tests.unit.inprocess import Client, Rig, message, rig


def checked_not_counted(self: Again, data: bytes, transport: Any) -> bool:
    """``Again.answer`` with no counts at all."""
    if (
        len(data) != self.length
        or not data.startswith(self.before)
        or not data.endswith(self.after)
    ):
        return False
    item = self.item()
    standing = self.standing
    now = time.monotonic()
    if (
        item is None
        or item.judged_under != item.scope.mark
        or now > standing.until
        or now >= item.expires_at
        or self.invalidations.pending
        or transport.get_write_buffer_size()
        or transport.is_closing()
    ):
        return False
    parts = item.answer
    if parts is None:
        return False
    at = self.at
    transport.write(self.head + data[at : at + 4] + parts[1])
    return True


def compared_and_written(self: Again, data: bytes, transport: Any) -> bool:
    if (
        len(data) != self.length
        or not data.startswith(self.before)
        or not data.endswith(self.after)
    ):
        return False
    at = self.at
    item = self.item()
    assert item is not None and item.answer is not None
    transport.write(self.head + data[at : at + 4] + item.answer[1])
    return True


def compared(self: Again, data: bytes, transport: Any) -> bool:
    return not (
        len(data) != self.length
        or not data.startswith(self.before)
        or not data.endswith(self.after)
    )


def nothing(self: Again, data: bytes, transport: Any) -> bool:
    return True


VARIANTS: dict[str, Callable[[Again, bytes, Any], bool]] = {
    "Again.answer": Again.answer,
    "checks, no counts": checked_not_counted,
    "compared and written": compared_and_written,
    "compared": compared,
    "nothing (a call)": nothing,
}


async def run(evict_bytes: int, runs: int) -> None:
    async with rig() as r:
        r.hms.add_table("bench", "t", v="1")
        session = SessionState("bench")
        request = idl.encode_call("get_table", 1, dbname="bench", tbl_name="t")
        for _ in range(2):  # a miss, then a hit the ordinary way (judged)
            await r.handler.handle(session, message(request), Client())
        whole = whole_message(request, Transport.BUFFERED, 1 << 24)
        assert whole is not None
        item = r.handler.serve_hit_now(session, whole, [].append)
        assert isinstance(item, Item)
        item.expires_at = float("inf")  # (cold runs are slow: nothing may expire meanwhile)
        again = r.handler.again(item, request, Transport.BUFFERED)
        assert again is not None
        transport = CountingTransport()
        evicted, zeros = bytearray(evict_bytes), bytes(evict_bytes)
        print(f"\nget_table answered again ({len(item.entry.payload):,} reply bytes); p50 us\n")
        print("| what | warm | cold |")
        print("|---|---:|---:|")
        for name, answer in VARIANTS.items():
            p50s = []
            for cold in (False, True):
                times = []
                for _ in range(runs if cold else runs * 20):
                    if cold:
                        evicted[:] = zeros
                    data = bytes(bytearray(request))
                    started = time.perf_counter()
                    answered = answer(again, data, transport)
                    times.append(time.perf_counter() - started)
                    assert answered, name
                p50s.append(statistics.median(times) * 1e6)
            print(f"| {name} | {p50s[0]:.1f} | {p50s[1]:.1f} |")
        await at_once(r, session, evicted, runs)


async def at_once(r: Rig, session: SessionState, evicted: bytearray, runs: int) -> None:
    """A connection's first call, answered at once, known by its bytes (see the docstring).
    A table of its own, cached now: the runs above may have outlived the other's entry."""
    r.hms.add_table("bench", "at_once", v="1")
    request = idl.encode_call("get_table", 1, dbname="bench", tbl_name="at_once")
    handler = r.handler
    for _ in range(2):
        await handler.handle(session, message(request), Client())
    zeros = bytes(len(evicted))
    p50s: dict[str, list[float]] = {
        "to its write": [],
        "the whole call": [],
        "the whole call, by the answer kept for it": [],
    }
    written: list[float] = []
    known, whole_call = call_without_seqid(request, Transport.BUFFERED), message(request)
    assert known is not None  # (remembered by its bytes from now on)
    item = handler.serve_hit_now(session, whole_call, [].append, known[0])
    calls = handler.known
    assert isinstance(item, Item) and calls is not None
    item.expires_at = float("inf")  # (cold runs are slow: nothing may expire meanwhile)
    kept = handler.again(item, request, Transport.BUFFERED)
    call = calls.get(session, known[0])
    assert kept is not None and call is not None
    calls.answer_with(call, kept)
    transport = CountingTransport()

    def write(reply: bytes) -> None:
        written.append(time.perf_counter())

    for cold in (False, True):
        to_write, whole = [], []
        for _ in range(runs if cold else runs * 20):
            if cold:
                evicted[:] = zeros
            data = bytes(bytearray(request))
            written.clear()
            started = time.perf_counter()
            repeat = call_without_seqid(data, Transport.BUFFERED)
            assert repeat is not None
            found = calls.get(session, repeat[0])
            assert found is not None
            hit = handler.serve_known_now(found, repeat[1], write)
            ended = time.perf_counter()
            assert isinstance(hit, Item) and len(written) == 1
            to_write.append(written[0] - started)
            whole.append(ended - started)
        p50s["to its write"].append(statistics.median(to_write) * 1e6)
        p50s["the whole call"].append(statistics.median(whole) * 1e6)
        # The way a connection's first call takes since the answers are kept for every
        # connection (proxy.handler.known_calls): its bytes, the kept answer, its write.
        whole = []
        for _ in range(runs if cold else runs * 20):
            if cold:
                evicted[:] = zeros
            data = bytes(bytearray(request))
            started = time.perf_counter()
            repeat = call_without_seqid(data, Transport.BUFFERED)
            assert repeat is not None
            found = calls.get(session, repeat[0])
            again = found.again if found is not None else None
            assert again is not None and again.answer(data, transport)
            whole.append(time.perf_counter() - started)
        p50s["the whole call, by the answer kept for it"].append(statistics.median(whole) * 1e6)
    print("\nthe same call answered at once, as a connection's first; p50 us\n")
    print("| what | warm | cold |")
    print("|---|---:|---:|")
    for name, (warm, cold_p50) in p50s.items():
        print(f"| {name} | {warm:.1f} | {cold_p50:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--evict-mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(run(args.evict_mib << 20, args.runs))


if __name__ == "__main__":
    main()
