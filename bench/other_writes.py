"""What a write to one table costs the hits on the others, in process, hit by hit.

    .venv/bin/python -m bench.other_writes [--tables 24] [--rounds 400]   # ~1 min

``bench.mixed_load`` times these hits over loopback, where a judgement made again is lost in
the round trip's noise; this times the proxy's own part. In process, against the scripted
metastore of the unit tests (no sockets): ``--tables`` tables are cached and each one's
``get_table`` answered at once once. Then, round after round, a ``get_table`` hit on each,
answered as a connection's first call is (``KnownCalls.first``, then ``Again.answer``; if
that declines, ``CallHandler.serve_known_now``, which judges again what no longer stands),
to a transport that only counts its writes. Two phases: quiet, then with one
``alter_table`` of another table through the handler before each round. Prints p50 and p99
of the hits in microseconds, and the share answered by an ``Again`` (a judgement that
stood). Run it on two builds (a worktree of the other) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from bench.common import CountingTransport
from proxy import idl
from proxy.handler import SessionState
from proxy.wire.framing import Transport, call_without_seqid, whole_message
from tests.unit.inprocess import Rig, rig

DB = "db"
WRITTEN = "written"
M = idl.module()


def answered(r: Rig, data: bytes, transport: CountingTransport) -> bool:
    """Answer ``data`` as a connection's first call; whether an Again answered it."""
    known_calls = r.handler.known
    assert known_calls is not None
    repeat = call_without_seqid(data, Transport.BUFFERED)
    assert repeat is not None
    known = known_calls.first(repeat[0])
    assert known is not None, "not kept"
    if known.again is not None and known.again.answer(data, transport):  # type: ignore[arg-type]
        return True
    hit = r.handler.serve_known_now(known, repeat[1], transport.write)
    assert hit, "not a hit"
    return False


async def run(tables: int, rounds: int) -> None:
    async with rig() as r:
        names = [f"t{i:03d}" for i in range(tables)]
        for name in [*names, WRITTEN]:
            r.hms.add_table(DB, name, v="1")
        session = SessionState("bench")
        calls = []
        for name in names:
            await r.call(session, "get_table", 1, dbname=DB, tbl_name=name)  # cached
            data = idl.encode_call("get_table", 2, dbname=DB, tbl_name=name)
            found = whole_message(data, Transport.BUFFERED, 1 << 20)
            repeat = call_without_seqid(data, Transport.BUFFERED)
            assert found is not None and repeat is not None
            out: list[bytes] = []
            item = r.handler.serve_hit_now(session, found, out.append, repeat[0])
            assert item is not None and item is not True
            known = r.handler.known.get(session, repeat[0])  # type: ignore[union-attr]
            assert known is not None
            again = r.handler.again(item, data, Transport.BUFFERED)
            if again is not None:
                r.handler.known.answer_with(known, again)  # type: ignore[union-attr]
            calls.append(idl.encode_call("get_table", 3, dbname=DB, tbl_name=name))
        transport = CountingTransport()
        print(f"{tables} tables, {rounds} rounds; p50 and p99 in us of each get_table hit")
        print("| phase | hits | p50 us | p99 us | answered by an Again |")
        print("|---|---:|---:|---:|---:|")
        for phase in ("quiet", "a write to another table each round"):
            spent: list[float] = []
            by_again = 0
            for n in range(rounds):
                if phase != "quiet":
                    changed = M.Table(tableName=WRITTEN, dbName=DB, parameters={"v": str(n)})
                    await r.call(
                        session, "alter_table", 4, dbname=DB, tbl_name=WRITTEN, new_tbl=changed
                    )
                for data in calls:
                    start = time.perf_counter()
                    by_again += answered(r, data, transport)
                    spent.append(time.perf_counter() - start)
            spent.sort()
            p50 = statistics.median(spent) * 1e6
            p99 = spent[int(len(spent) * 0.99)] * 1e6
            share = 100 * by_again / len(spent)
            print(f"| {phase} | {len(spent)} | {p50:.1f} | {p99:.1f} | {share:.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(run(args.tables, args.rounds))


if __name__ == "__main__":
    main()
