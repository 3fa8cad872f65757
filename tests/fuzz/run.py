"""The dedicated fuzz run: a million (or more) hostile inputs through the fuzz target.

    .venv/bin/python -m tests.fuzz.run --inputs 1000000            # all cores, ~30 min
    .venv/bin/python -m tests.fuzz.run --replay fuzz-out/<file>.bin  # one saved input again

Input ``i`` of a run is made by the mutator from ``(--seed, i)`` alone, so any input can be
made again. Worker processes (one per core) each take every ``workers``-th index, run it
under tracemalloc (:func:`targets.check_bounded`) with an address-space cap (an allocation
of gigabytes fails at once instead of swapping the machine), and report failures with their
input. A worker that dies (a segfault in C code, the cap) or stops making progress (a hang)
is replaced, and the input it was on is recorded as a failure of its own.

The run prints throughput, the largest traced allocation peak of one input, the workers'
peak RSS, how far inputs got (messages, decoded arguments, plans) and every distinct failure
(by signature) with a count; the smallest input of each is saved in ``--out`` as ``.bin``
with a ``.txt`` beside it (hex, traceback, how to replay). The exit status is 1 if anything
failed, else 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import random
import re
import resource
import signal
import sys
import time
import traceback
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from tests.fuzz import sandbox, targets
from tests.fuzz.mutate import Mutator
from tests.fuzz.seeds import seeds

STATS_EVERY = 2000  # inputs between a worker's reports


def make_input(mutator: Mutator, seed: int, index: int) -> bytes:
    """Input ``index`` of the run with ``seed`` (a pure function of the two)."""
    mutator.rng.seed((seed << 40) + index)
    return mutator.input()


@dataclass
class Options:
    inputs: int
    seed: int
    workers: int
    max_size: int
    headroom: int
    hang_seconds: float
    slow_seconds: float
    tracemalloc: bool


# -- worker -------------------------------------------------------------------------------------


def _worker(conn: Connection, opts: Options, start: int, progress: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C
    sandbox.limit_memory(opts.headroom)
    mutator = Mutator(seeds(), random.Random())
    targets.warm()
    if opts.tracemalloc:
        # Once for the whole run: check_bounded would otherwise start and stop tracing for
        # every input, and tracemalloc's own bookkeeping then grows the worker by ~4 MB per
        # thousand inputs (the proxy's code does not: its RSS stays flat without tracing).
        tracemalloc.start()
    run = targets.check_bounded if opts.tracemalloc else targets.check
    stats = _fresh()
    for index in range(start, opts.inputs, opts.workers):
        progress.value = index
        try:
            data = make_input(mutator, opts.seed, index)
        except Exception as exc:  # a bug of the mutator, not of the proxy
            detail = "".join(traceback.format_exception(exc))
            conn.send(("failure", index, f"mutator: {type(exc).__name__}", detail, b""))
            continue
        began = time.perf_counter()
        try:
            reached = run(data, max_size=opts.max_size)
        except targets.Failure as exc:
            conn.send(("failure", index, exc.signature, exc.detail, data))
            reached = None
        except MemoryError as exc:  # the cap, outside the decoder's own handling
            detail = "".join(traceback.format_exception(exc))
            conn.send(("failure", index, "MemoryError escaped", detail, data))
            reached = None
        took = time.perf_counter() - began
        if reached is not None and took > opts.slow_seconds:  # a failure explains itself
            detail = f"{targets.describe(data)}: {took:.1f} s"
            conn.send(("failure", index, f"slow: over {opts.slow_seconds:g} s", detail, data))
        _count(stats, reached, took, index)
        if stats["inputs"] >= STATS_EVERY:
            conn.send(("stats", stats))
            stats = _fresh()
    conn.send(("stats", stats))
    conn.send(("done",))


def _fresh() -> dict[str, Any]:
    return {
        "inputs": 0,
        "seconds": 0.0,
        "messages": 0,
        "calls": 0,
        "decoded": 0,
        "plans": 0,
        "errors": Counter(),
        "peak": 0,
        "peak_index": -1,
        "slowest": 0.0,
        "slowest_index": -1,
    }


def _count(stats: dict[str, Any], reached: targets.Reached | None, took: float, index: int) -> None:
    stats["inputs"] += 1
    stats["seconds"] += took
    if took > stats["slowest"]:
        stats["slowest"], stats["slowest_index"] = took, index
    if reached is None:
        return
    stats["messages"] += reached.messages
    stats["calls"] += reached.calls
    stats["decoded"] += reached.decoded
    stats["plans"] += reached.plans
    stats["errors"].update(reached.errors)
    if reached.peak > stats["peak"]:
        stats["peak"], stats["peak_index"] = reached.peak, index


# -- parent -------------------------------------------------------------------------------------


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    progress: Any
    seen: int = -1
    seen_at: float = field(default_factory=time.monotonic)


@dataclass
class _Found:
    count: int
    index: int
    data: bytes
    detail: str


class Run:
    def __init__(self, opts: Options, out: Path) -> None:
        self.opts = opts
        self.out = out
        self.ctx = multiprocessing.get_context("fork")
        self.totals = _fresh()
        self.found: dict[str, _Found] = {}
        self.deaths = 0

    def start_worker(self, start: int) -> _Worker:
        receive, send = self.ctx.Pipe(duplex=False)
        progress = self.ctx.Value("q", -1, lock=False)
        process = self.ctx.Process(
            target=_worker, args=(send, self.opts, start, progress), daemon=True
        )
        process.start()
        send.close()
        return _Worker(process, receive, progress)

    def record(self, index: int, signature: str, detail: str, data: bytes) -> None:
        known = self.found.get(signature)
        if known is None:
            self.found[signature] = _Found(1, index, data, detail)
            self.save(signature)
            print(f"  new failure at input {index}: {signature}", flush=True)
            return
        known.count += 1
        if len(data) < len(known.data):
            known.index, known.data, known.detail = index, data, detail
            self.save(signature)

    def save(self, signature: str) -> None:
        found = self.found[signature]
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.out / _slug(signature)
        stem.with_suffix(".bin").write_bytes(found.data)
        stem.with_suffix(".txt").write_text(
            f"signature: {signature}\n"
            f"input: #{found.index} of seed {self.opts.seed}, {targets.describe(found.data)}\n"
            f"replay: .venv/bin/python -m tests.fuzz.run --replay {stem.with_suffix('.bin')}\n"
            f"hex: {found.data.hex()}\n\n{found.detail}\n"
        )

    def merge(self, stats: dict[str, Any]) -> None:
        t = self.totals
        for key in ("inputs", "seconds", "messages", "calls", "decoded", "plans"):
            t[key] += stats[key]
        t["errors"].update(stats["errors"])
        if stats["peak"] > t["peak"]:
            t["peak"], t["peak_index"] = stats["peak"], stats["peak_index"]
        if stats["slowest"] > t["slowest"]:
            t["slowest"], t["slowest_index"] = stats["slowest"], stats["slowest_index"]

    def execute(self) -> float:
        opts = self.opts
        began = time.monotonic()
        workers = [self.start_worker(w) for w in range(opts.workers)]
        last_report = began
        mutator = Mutator(seeds(), random.Random())
        try:
            self._loop(workers, mutator, began, last_report)
        except KeyboardInterrupt:
            print("interrupted: the report covers the inputs run so far", flush=True)
        finally:
            for w in workers:
                w.process.kill()
                w.process.join()
        return time.monotonic() - began

    def _loop(
        self, workers: list[_Worker], mutator: Mutator, began: float, last_report: float
    ) -> None:
        opts = self.opts
        while workers:
            ready = wait([w.conn for w in workers], timeout=1.0)
            now = time.monotonic()
            for w in list(workers):
                if w.conn in ready:
                    try:
                        while w.conn.poll():
                            message = w.conn.recv()
                            if message[0] == "failure":
                                self.record(*message[1:])
                            elif message[0] == "stats":
                                self.merge(message[1])
                            else:
                                workers.remove(w)
                                w.process.join()
                                break
                        continue
                    except (EOFError, OSError):
                        pass  # the worker is gone: handled below
                else:
                    index = w.progress.value
                    if index != w.seen:
                        w.seen, w.seen_at = index, now
                        continue
                    if w.process.is_alive() and now - w.seen_at < opts.hang_seconds:
                        continue
                    if w.process.is_alive():
                        w.process.kill()
                w.process.join()
                if w not in workers:
                    continue
                workers.remove(w)
                index = w.progress.value
                if index < 0:
                    raise SystemExit(f"a worker died before its first input: {w.process.exitcode}")
                code = w.process.exitcode
                how = (
                    f"hang: no progress for {opts.hang_seconds:g} s (killed)"
                    if code == -signal.SIGKILL
                    else f"worker died: {_exit(code)}"
                )
                self.deaths += 1
                try:
                    data = make_input(mutator, opts.seed, index)
                except Exception:
                    data = b""
                self.record(index, how, f"{targets.describe(data)}: {how}", data)
                self.totals["inputs"] += 1
                if index + opts.workers < opts.inputs:
                    workers.append(self.start_worker(index + opts.workers))
            if now - last_report > 10:
                last_report = now
                done = self.totals["inputs"]
                print(
                    f"{done:>9} inputs  {done / (now - began):7.0f}/s  "
                    f"failures: {sum(f.count for f in self.found.values())} "
                    f"({len(self.found)} distinct)",
                    flush=True,
                )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _slug(signature: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", signature).strip("-")[:80]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__)
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-size", type=int, default=targets.MAX_SIZE)
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"))
    parser.add_argument(
        "--headroom-gib", type=float, default=3.0, help="address space a worker may add"
    )
    parser.add_argument("--hang-seconds", type=float, default=60.0)
    parser.add_argument("--slow-seconds", type=float, default=2.0)
    parser.add_argument("--no-tracemalloc", action="store_true")
    parser.add_argument("--replay", type=Path, nargs="*", help="run saved inputs, then exit")
    args = parser.parse_args(argv)
    if args.replay:
        return replay(args.replay, args.max_size)
    opts = Options(
        inputs=args.inputs,
        seed=args.seed,
        workers=max(1, args.workers),
        max_size=args.max_size,
        headroom=int(args.headroom_gib * sandbox.GiB),
        hang_seconds=args.hang_seconds,
        slow_seconds=args.slow_seconds,
        tracemalloc=not args.no_tracemalloc,
    )
    print(
        f"{len(seeds())} seed calls; {opts.inputs} inputs, seed {opts.seed}, "
        f"{opts.workers} workers, max_size {opts.max_size}, "
        f"tracemalloc {'on' if opts.tracemalloc else 'off'}",
        flush=True,
    )
    run = Run(opts, args.out)
    signal.signal(signal.SIGTERM, _interrupt)
    elapsed = run.execute()
    return report(run, elapsed)


def report(run: Run, elapsed: float) -> int:
    t = run.totals
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print()
    print(f"inputs:       {t['inputs']} in {elapsed:.0f} s ({t['inputs'] / elapsed:.0f}/s)")
    print(
        f"reached:      {t['messages']} complete messages, {t['calls']} calls, "
        f"{t['decoded']} argument structs decoded, {t['plans']} planned"
    )
    print(f"reader errors: {dict(t['errors'].most_common())}")
    if run.opts.tracemalloc:
        limit = targets.allocation_limit(b"", run.opts.max_size)
        print(
            f"peak memory:  largest traced allocation peak of one input {t['peak']} bytes "
            f"(input #{t['peak_index']}; bound {limit} + 16 x input), workers' peak RSS "
            f"{rss / 2**20:.0f} MiB"
        )
    print(f"slowest:      input #{t['slowest_index']}, {t['slowest']:.2f} s")
    print(f"worker deaths: {run.deaths}")
    if not run.found:
        print("failures:     none")
    for signature, found in sorted(run.found.items(), key=lambda kv: -kv[1].count):
        print(
            f"FAILURE x{found.count:<7} {signature}\n"
            f"        smallest: input #{found.index}, {len(found.data)} bytes -> "
            f"{run.out / _slug(signature)}.bin"
        )
    summary = {
        "inputs": t["inputs"],
        "seconds": round(elapsed, 1),
        "per_second": round(t["inputs"] / elapsed),
        "seed": run.opts.seed,
        "max_size": run.opts.max_size,
        "largest_traced_peak": t["peak"],
        "workers_peak_rss": rss,
        "reached": {k: t[k] for k in ("messages", "calls", "decoded", "plans")},
        "reader_errors": dict(t["errors"]),
        "worker_deaths": run.deaths,
        "failures": {s: {"count": f.count, "input": f.index} for s, f in run.found.items()},
    }
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if run.found else 0


def replay(paths: list[Path], max_size: int) -> int:
    seeds()
    targets.warm()
    status = 0
    for path in paths:
        data = path.read_bytes()
        print(f"{path}: {targets.describe(data)}")
        try:
            outcome = sandbox.isolated(
                functools.partial(targets.check_bounded, max_size=max_size), data
            )
        except targets.Failure as exc:
            print(f"  FAILURE {exc.signature}\n{exc.detail}")
            status = 1
            continue
        if isinstance(outcome, sandbox.Died):
            print(f"  FAILURE the input's process {outcome.how}")
            status = 1
        else:
            print(f"  ok: {outcome}")
    return status


if __name__ == "__main__":
    sys.exit(main())
