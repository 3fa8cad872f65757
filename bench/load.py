"""Load and soak: many connections and connection churn through the proxy, on loopback.

    .venv/bin/python -m bench.load --connections 256 --duration 60            # long-lived
    .venv/bin/python -m bench.load --connections 0 --churn-rate 200 --duration 60
    .venv/bin/python -m bench.load --soak      # 10 minutes; proxy RSS sampled every 5 s

Starts a real Hive Metastore (Derby, kept under .rig/bench/load, tables built once), Redis
(``--store redis``, the default) and the proxy, then worker processes (``--workers``) that
drive it with a Trino/Spark-shaped mix over many tables:

* long-lived Spark-shaped connections (``--connections``): ``set_ugi`` once, then
  ``get_table`` and ``get_partitions_by_filter`` back to back (``--think`` between queries);
* Trino-shaped queries arriving at a fixed rate, one new connection per call
  (``--churn-rate`` calls/s): ``get_table_req``, ``get_partition_names_ps``,
  ``get_partitions_by_names`` in batches of 20, ``get_partitions_statistics_req``;
* a write (``alter_partition``) every ``--write-every`` calls, which invalidates, and a share
  of ad-hoc queries (``--adhoc``) asking for something never asked before: both keep misses
  coming (and the ad-hoc ones keep the key space growing, which the cache budget must bound).

Hits and misses are told apart call by call: each worker owns its tables (nobody else reads
or writes them) and tracks what the cache can hold (see ``bench.load_client.Model``); a call
whose outcome it cannot be sure of (it raced a write or another fill of the same entry) is
counted as *unsure* and left out of both classes. The proxy runs with TTLs of a day and its
notification follower off, so writes of the mix are the only invalidations; afterwards the
proxy's own per-method hit and miss counters must agree (checked and printed).

Every run is bounded: ``--duration`` (at most an hour), ``--max-calls``, a per-call timeout
(``--call-timeout``), a hard deadline on the whole run; only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import array
import itertools
import multiprocessing
import os
import platform
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from bench.common import ReplayFloor, TimedConnection, percentile, reply_bytes
from bench.load_client import (
    CHURN,
    DB,
    HIT,
    LONG,
    MISS,
    UNSURE,
    WRITE,
    WorkerConfig,
    column_specs,
    part_value,
    worker_main,
)
from bench.load_probe import PROBE_TABLE, probe_main
from proxy import idl
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer

DATA = Path(__file__).resolve().parents[1] / ".rig" / "bench" / "load"
TICK = os.sysconf("SC_CLK_TCK")
MB = 1024 * 1024
LOUD = ("WARNING", "ERROR", "CRITICAL")
TTL_SCOPES = ("catalog", "database", "table", "partitions", "statistics")


# -- the metastore's data ------------------------------------------------------------------


def table_names(count: int) -> list[str]:
    return [f"t{i:03d}" for i in range(count)]


def ensure_tables(hms: MetastoreServer, count: int, partitions: int) -> None:
    """``loadgen.t000`` ... with ``partitions`` partitions each, made once (straight at the
    HMS) and kept with the metastore's Derby folder."""
    from hmsclient.genthrift.hive_metastore import ttypes as t

    from tests.rig.sample import client, storage_descriptor

    warehouse = hms.warehouse.as_uri()
    specs = column_specs()
    started = time.monotonic()
    with client(hms.host, hms.port) as c:
        if DB not in c.get_all_databases():
            c.create_database(t.Database(DB, "bench.load", f"{warehouse}/{DB}.db", {}))
        existing = set(c.get_all_tables(DB))
        if PROBE_TABLE not in existing:  # what the hit probe reads (see bench.load_probe)
            c.create_table(
                t.Table(
                    tableName=PROBE_TABLE,
                    dbName=DB,
                    owner="loadgen",
                    sd=storage_descriptor(f"{warehouse}/{DB}.db/{PROBE_TABLE}", specs),
                    partitionKeys=[t.FieldSchema("ds", "string", None)],
                    parameters={},
                    tableType="EXTERNAL_TABLE",
                )
            )
        for name in table_names(count):
            base = f"{warehouse}/{DB}.db/{name}"
            if name not in existing:
                c.create_table(
                    t.Table(
                        tableName=name,
                        dbName=DB,
                        owner="loadgen",
                        sd=storage_descriptor(base, specs),
                        partitionKeys=[t.FieldSchema("ds", "string", None)],
                        parameters={},
                        tableType="EXTERNAL_TABLE",
                    )
                )
            have = len(c.get_partition_names(DB, name, -1))
            if have >= partitions:
                continue
            c.add_partitions(
                [
                    t.Partition(
                        values=[part_value(i)],
                        dbName=DB,
                        tableName=name,
                        sd=storage_descriptor(f"{base}/ds={part_value(i)}", specs),
                        parameters={"numRows": "1000"},
                    )
                    for i in range(have, partitions)
                ]
            )
            print(
                f"  built {DB}.{name}: {partitions} partitions"
                f" ({time.monotonic() - started:.0f} s)",
                flush=True,
            )


# -- sampling /proc ------------------------------------------------------------------------


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process (its threads included), in clock ticks; 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def status_kib(pid: int, name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def machine_ticks() -> tuple[int, int, int]:
    """(busy, total, steal) clock ticks of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(values[:8])
    idle = values[3] + values[4]
    return total - idle, total, values[7]


@dataclass
class Sample:
    at: float  # seconds since the start of the measured window
    rss: int  # bytes
    ticks: dict[str, int]
    machine: tuple[int, int, int]
    requests: float  # the proxy's hmsproxy_requests_total, all methods
    cache_bytes: int  # the proxy's own count (embedded cache or Redis front)
    upstream: float = 0.0  # hmsproxy_upstream_requests_total
    cache_errors: float = 0.0  # hmsproxy_cache_errors_total
    failed: float = 0.0  # calls answered with an error by the proxy (not user errors)
    # hmsproxy_memo_bytes by memo: what the proxy keeps in process by its own count (the
    # cache's contents are "cache"; the others are the bounded memos of proxy.memo).
    memo_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def memos(self) -> float:
        """Bytes in the memos other than the cache's contents (-1: not known)."""
        if not self.memo_bytes:
            return -1.0
        return sum(v for name, v in self.memo_bytes.items() if name != "cache")

    @property
    def unexplained(self) -> float | None:
        """RSS beyond the cache's contents and the memos: what must stay flat."""
        if self.cache_bytes < 0 or self.memos < 0:
            return None
        return self.rss - self.cache_bytes - self.memos


@dataclass
class Rig:
    proxy: ProxyProcess
    hms: MetastoreServer
    redis: RedisServer | None
    pids: dict[str, int] = field(default_factory=dict)
    admin: Any = None

    def stats(self) -> Any:
        if self.admin is None:
            import grpc

            from proxy.admin._gen import admin_pb2_grpc as pb_grpc

            channel = grpc.insecure_channel(f"127.0.0.1:{self.proxy.admin_port}")
            self.admin = pb_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        from proxy.admin._gen import admin_pb2 as pb

        return self.admin.Stats(pb.StatsRequest(), timeout=10)

    def sample(self, origin: float) -> Sample:
        assert self.proxy.process is not None
        pid = self.proxy.process.pid
        metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        cache_bytes = -1
        try:
            metrics = self.proxy.metrics()
            cache_bytes = self.stats().bytes
        except Exception:  # a sample is worth less than the run: keep going
            pass

        def total(name: str, **match: str) -> float:
            return sum(
                v
                for (n, labels), v in metrics.items()
                if n == name and all(dict(labels).get(k) == x for k, x in match.items())
            )

        requests = total("hmsproxy_requests_total")
        return Sample(
            at=time.monotonic() - origin,
            rss=status_kib(pid, "VmRSS") * 1024,
            ticks={name: cpu_ticks(p) for name, p in self.pids.items()},
            machine=machine_ticks(),
            requests=requests,
            cache_bytes=cache_bytes,
            upstream=total("hmsproxy_upstream_requests_total"),
            cache_errors=total("hmsproxy_cache_errors_total"),
            failed=requests
            - total("hmsproxy_requests_total", outcome="ok")
            - total("hmsproxy_requests_total", outcome="user_error"),
            memo_bytes={
                dict(labels)["memo"]: v
                for (n, labels), v in metrics.items()
                if n == "hmsproxy_memo_bytes"
            },
        )


# -- the run -------------------------------------------------------------------------------


def start_rig(args: argparse.Namespace) -> Rig:
    hms = MetastoreServer(DATA / "hms")
    print("* starting the Hive Metastore (Derby under .rig/bench/load/hms)", flush=True)
    hms.start()
    redis = None
    proxy = None
    try:
        ensure_tables(hms, args.tables, args.partitions)
        extra = [
            "--log-level",
            "warning",
            "--notifications",
            "off",
            "--memory-cache-bytes",
            args.memory_cache_bytes,
        ]
        for scope in TTL_SCOPES:
            extra += [f"--ttl-{scope}", "86400"]
        if args.store == "redis":
            redis = RedisServer(DATA / "redis")
            redis.start()
            extra += ["--redis", redis.url]
        extra += args.proxy_arg
        proxy = ProxyProcess(DATA, hms.uri, *extra).start()
    except BaseException:
        if proxy is not None:
            proxy.stop()
        if redis is not None:
            redis.stop()
        hms.stop()
        raise
    assert proxy.process is not None and hms.process is not None
    rig = Rig(proxy, hms, redis)
    rig.pids = {"proxy": proxy.process.pid, "hms": hms.process.pid}
    if redis is not None and redis.process is not None:
        rig.pids["redis"] = redis.process.pid
    print(f"* proxy on 127.0.0.1:{proxy.port} ({' '.join(extra)})", flush=True)
    return rig


def stop_rig(rig: Rig) -> None:
    rig.proxy.stop()
    if rig.redis is not None:
        rig.redis.stop()
    rig.hms.stop()


def run(args: argparse.Namespace, rig: Rig) -> dict[str, Any]:
    names = table_names(args.tables)
    workers = args.workers
    configs = []
    for i in range(workers):
        conns = args.connections // workers + (1 if i < args.connections % workers else 0)
        configs.append(
            WorkerConfig(
                index=i,
                port=rig.proxy.port,
                tables=tuple(names[i::workers]),
                partitions=args.partitions,
                connections=conns,
                churn_rate=args.churn_rate / workers,
                duration=args.duration,
                max_calls=args.max_calls // workers,
                write_every=args.write_every,
                adhoc=args.adhoc,
                call_timeout=args.call_timeout,
                think=args.think / 1000,
                max_inflight=max(1, args.max_inflight // workers),
                seed=args.seed + i,
                warehouse=rig.hms.warehouse.as_uri(),
            )
        )
    time.sleep(1.0)
    assert rig.proxy.process is not None
    idle_rss = status_kib(rig.proxy.process.pid, "VmRSS") * 1024
    context = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    procs = []
    write_lock = context.Lock()
    for config in configs:
        mine, theirs = context.Pipe()
        proc = context.Process(target=worker_main, args=(config, theirs, write_lock), daemon=True)
        proc.start()
        theirs.close()
        pipes.append(mine)
        procs.append(proc)
        rig.pids[f"worker{config.index}"] = proc.pid  # type: ignore[assignment]
    results: list[dict[str, Any]] = []
    probe_request = idl.encode_call("get_table", 1, dbname=DB, tbl_name=PROBE_TABLE)
    direct = TimedConnection(rig.hms.port)
    floor = ReplayFloor(
        [(probe_request, reply_bytes(direct, probe_request))], _event_loop(), DATA / "floor"
    )
    direct.close()
    probe_pipe, theirs = context.Pipe()
    probe = context.Process(
        target=probe_main,
        args=(rig.proxy.port, floor.port, probe_request, theirs),
        daemon=True,
    )
    probe.start()
    theirs.close()
    procs.append(probe)
    try:
        print(
            f"* {workers} worker processes warming {args.tables} tables"
            f" x {args.partitions} partitions and opening {args.connections} connections",
            flush=True,
        )
        warm_deadline = time.monotonic() + args.warm_timeout

        def from_all(expected: str) -> list[Any]:
            got = []
            for pipe in pipes:
                if not pipe.poll(max(0.0, warm_deadline - time.monotonic())):
                    raise RuntimeError(f"a worker was not ready in {args.warm_timeout} s")
                kind, value = pipe.recv()
                if kind != expected:
                    raise RuntimeError(f"worker failed:\n{value}")
                got.append(value)
            return got

        from_all("warmed")
        for attempt in range(1, 6):
            # One more pass over every key; the run starts from a cache that missed nothing.
            seen = rig.proxy.metrics()
            for pipe in pipes:
                pipe.send("again")
            from_all("warmed")
            now = rig.proxy.metrics()
            missed = sum(
                now[k] - seen.get(k, 0.0)
                for k in now
                if k[0] == "hmsproxy_cache_lookups_total"
                and dict(k[1])["result"] in ("miss", "bypass")
            )
            print(f"  warm pass {attempt + 1}: {missed:.0f} misses", flush=True)
            if missed == 0:
                break
        else:
            raise RuntimeError("the cache kept missing after five warm passes")
        for pipe in pipes:
            pipe.send("done")
        warm = from_all("ready")
        print(f"* the hit probe, unloaded, for {PROBE_SECONDS:g} s", flush=True)
        probe_pipe.send(("measure", PROBE_SECONDS))
        if not probe_pipe.poll(PROBE_SECONDS + 60):
            raise RuntimeError("the hit probe did not answer")
        probe_unloaded = probe_pipe.recv()
        before = rig.proxy.metrics()
        start = time.monotonic() + 0.5
        wall_start = time.time() + 0.5
        load_start = Path("/proc/loadavg").read_text().split()[0]
        first = rig.sample(start)
        first.at = 0.0
        for pipe in pipes:
            pipe.send(start)
        probe_pipe.send(("measure", args.duration))
        print(f"* running for {args.duration:g} s", flush=True)
        samples = [first]
        hard_deadline = start + args.duration + 2 * args.call_timeout + 60
        pending = list(pipes)
        next_sample = start + args.sample_every
        window_end: Sample | None = None
        next_progress = start + 60
        while pending:
            now = time.monotonic()
            if now > hard_deadline:
                raise RuntimeError("workers did not finish by the hard deadline")
            for ready in wait(pending, timeout=max(0.0, min(next_sample, hard_deadline) - now)):
                assert isinstance(ready, Connection)
                kind, value = ready.recv()
                if kind != "result":
                    raise RuntimeError(f"worker failed:\n{value}")
                results.append(value)
                pending.remove(ready)
            now = time.monotonic()
            if now >= next_sample:
                sample = rig.sample(start)
                if window_end is None and sample.at >= args.duration - 0.01:
                    window_end = sample
                    wall_end = time.time()
                    load_end = Path("/proc/loadavg").read_text().split()[0]
                elif sample.at < args.duration:
                    samples.append(sample)
                next_sample += args.sample_every
                if now >= next_progress:
                    print(
                        f"  {sample.at:5.0f} s: proxy RSS {sample.rss / MB:.1f} MB,"
                        f" {sample.requests - first.requests:,.0f} calls so far",
                        flush=True,
                    )
                    next_progress += 60
        last = rig.sample(start)
        if window_end is None:
            window_end = last
            wall_end = time.time()
            load_end = Path("/proc/loadavg").read_text().split()[0]
        samples.append(window_end)
        after = rig.proxy.metrics()
        stats = rig.stats()
        if not probe_pipe.poll(60):
            raise RuntimeError("the hit probe did not finish")
        probe_loaded = probe_pipe.recv()
        probe_pipe.send("stop")
    finally:
        floor.stop()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    assert rig.proxy.process is not None
    return {
        "results": results,
        "warm": warm,
        "idle_rss": idle_rss,
        "samples": samples,
        "last": last,
        "before": before,
        "after": after,
        "hwm": status_kib(rig.proxy.process.pid, "VmHWM") * 1024,
        "entries": stats.entries,
        "cache_bytes": stats.bytes,
        "wall": (wall_start, wall_end),
        "loadavg": (load_start, load_end),
        "probe": {"unloaded": probe_unloaded, "loaded": probe_loaded},
    }


PROBE_SECONDS = 10.0  # the hit probe's unloaded measurement, before the load starts


def _event_loop() -> str:
    """The floor server's event loop: the proxy's (``--event-loop auto``)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


# -- the report ----------------------------------------------------------------------------


def delta(run_: dict[str, Any], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return float(run_["after"].get(key, 0.0) - run_["before"].get(key, 0.0))


def ms(value: float) -> str:
    return f"{value * 1000:.2f}"


def quantiles(samples: list[float]) -> tuple[str, str, str, str]:
    """p50, p99, p999, max in ms; a quantile is shown only with enough samples."""
    if not samples:
        return "-", "-", "-", "-"
    p99 = ms(percentile(samples, 0.99)) if len(samples) >= 100 else "-"
    p999 = ms(percentile(samples, 0.999)) if len(samples) >= 1000 else "-"
    return ms(percentile(samples, 0.5)), p99, p999, ms(max(samples))


def slope_mb_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, bytes) in MB per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    cov = sum((x - mx) * (y - my) for x, y in points)
    return cov / var * 60 / MB


def parse_size(text: str) -> int:
    units = {"kib": 1024, "mib": MB, "gib": 1024 * MB, "b": 1}
    lower = text.strip().lower()
    for suffix, factor in units.items():
        if lower.endswith(suffix):
            return int(float(lower[: -len(suffix)]) * factor)
    return int(lower)


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = status_line("/proc/meminfo", "MemTotal")
    return (
        f"{os.cpu_count()} cores ({model}), {mem / 1024 / 1024:.0f} GiB, Linux"
        f" {platform.release()}, Python {platform.python_version()}"
    )


def status_line(path: str, name: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def proxy_log_summary(rig: Rig, offset: int, window: tuple[float, float]) -> list[str]:
    """Log records at WARNING or above, before (warm-up) and during the measured window."""
    text = rig.proxy.log()[offset:]
    records: list[tuple[float | None, str]] = []
    for line in text.splitlines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            if records and line.strip():  # a traceback line: part of the record above
                records[-1] = (records[-1][0], records[-1][1] + " | " + line.strip())
            continue
        records.append((at, line[24:]))
    out = []
    for label, keep in (
        ("warm-up", lambda at: at < window[0]),
        ("measured window", lambda at: window[0] <= at <= window[1]),
        ("drain and stop", lambda at: at > window[1]),
    ):
        chosen = [
            msg
            for at, msg in records
            if at is not None and keep(at) and msg.split(" ", 1)[0] in LOUD
        ]
        out.append(f"Proxy log, {label}: {len(chosen)} records at WARNING or above.")
        distinct: Counter[str] = Counter(msg[:160] for msg in chosen)
        out += [f"  - {n} x `{msg}`" for msg, n in distinct.most_common(6)]
    return out


def report(args: argparse.Namespace, rig: Rig, r: dict[str, Any], log_offset: int) -> str:
    results = r["results"]
    latencies: dict[tuple[str, str], list[float]] = {}
    counts: Counter[tuple[str, str, str]] = Counter()
    errors: Counter[tuple[str, str, str]] = Counter()
    samples_text: dict[str, str] = {}
    connects: list[float] = []
    for res in results:
        for key, raw in res["latencies"].items():
            values = array.array("d")
            values.frombytes(raw)
            latencies.setdefault(key, []).extend(values)
        counts.update(res["counts"])
        errors.update(res["errors"])
        for kind, text in res["samples"].items():
            samples_text.setdefault(kind, text)
        values = array.array("d")
        values.frombytes(res["connects"])
        connects.extend(values)
    window = max(res["finished"] for res in results) - min(res["started"] for res in results)
    total_calls = sum(counts.values())
    total_errors = sum(errors.values())
    shed = sum(res["shed"] for res in results)
    samples: list[Sample] = r["samples"]
    first, end = samples[0], samples[-1]
    span = max(end.at - first.at, 1e-9)

    def cpu(name: str) -> float:
        return (end.ticks.get(name, 0) - first.ticks.get(name, 0)) / TICK / span * 100

    worker_cpu = sum(cpu(n) for n in first.ticks if n.startswith("worker"))
    busy = (end.machine[0] - first.machine[0]) / max(1, end.machine[1] - first.machine[1])
    ncpu = os.cpu_count() or 1
    machine_pct = busy * ncpu * 100
    ours = cpu("proxy") + cpu("hms") + cpu("redis") + worker_cpu
    steal = (end.machine[2] - first.machine[2]) / max(1, end.machine[1] - first.machine[1])
    peak_cpu = 0.0
    for a, b in itertools.pairwise(samples):
        if b.at > a.at:
            peak_cpu = max(peak_cpu, (b.ticks["proxy"] - a.ticks["proxy"]) / TICK / (b.at - a.at))
    rss_peak_sampled = max(s.rss for s in samples)

    out: list[str] = []
    command = ".venv/bin/python -m bench.load " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out.append(f"```sh\n{command}\n```\n")
    out.append(
        f"{date.today().isoformat()}; {machine()}; store: {args.store}; {args.workers} client"
        f" processes; {args.tables} tables x {args.partitions} partitions; a write every"
        f" {args.write_every} calls; ad-hoc share {args.adhoc:g}; proxy"
        f" --memory-cache-bytes {args.memory_cache_bytes}.\n"
    )
    proxy_hits = proxy_misses = proxy_bypass = 0.0
    for (name, labels), _ in r["after"].items():
        if name != "hmsproxy_cache_lookups_total":
            continue
        d = dict(labels)
        value = delta(r, name, **d)
        if d["result"] in ("hit", "negative_hit"):
            proxy_hits += value
        elif d["result"] == "miss":
            proxy_misses += value
        else:
            proxy_bypass += value
    looked = proxy_hits + proxy_misses + proxy_bypass
    out.append(
        "| connections | churn (new conn/s) | calls/s | proxy hit ratio | errors"
        " | proxy CPU avg / peak | proxy RSS idle / start / peak / end MB |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|---:|")
    churn_calls = len(connects)  # connections opened, whatever became of their call
    out.append(
        f"| {args.connections} | {args.churn_rate:g} (achieved {churn_calls / window:,.0f})"
        f" | {total_calls / window:,.0f} | {proxy_hits / looked if looked else 0:.1%}"
        f" | {total_errors} | {cpu('proxy'):.0f}% / {peak_cpu * 100:.0f}% of a core"
        f" | {r['idle_rss'] / MB:.0f} / {first.rss / MB:.0f}"
        f" / {max(r['hwm'], rss_peak_sampled) / MB:.0f} / {r['last'].rss / MB:.0f} |"
    )
    out.append("")
    out.append("| traffic | class | calls | share | p50 ms | p99 ms | p999 ms | max ms |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for mode in (LONG, CHURN):
        mode_total = sum(v for (m, _, _), v in counts.items() if m == mode)
        if not mode_total:
            continue
        for cls in (HIT, MISS, WRITE, UNSURE):
            n = sum(v for (m, _, c), v in counts.items() if m == mode and c == cls)
            if not n:
                continue
            p50, p99, p999, top = quantiles(latencies.get((mode, cls), []))
            out.append(
                f"| {mode} | {cls} | {n:,} | {n / mode_total:.1%} | {p50} | {p99} | {p999}"
                f" | {top} |"
            )
    if connects:
        p50, p99, p999, top = quantiles(connects)
        out.append(
            f"| churn | (TCP connect alone) | {len(connects):,} | | {p50} | {p99} | {p999}"
            f" | {top} |"
        )
    out.append("")
    out.append(
        "Latency is the client's: request sent to the last reply byte; for churn, from"
        " opening the connection. *unsure*: calls the client could not classify (they raced"
        " a write or another fill of the same entry); counted in calls/s, in neither class."
    )
    out.append("")
    # Which side saturates.
    out.append(
        f"CPU over the window (% of one core): proxy {cpu('proxy'):.0f}%, client processes"
        f" {worker_cpu:.0f}%, HMS {cpu('hms'):.0f}%"
        + (f", Redis {cpu('redis'):.0f}%" if "redis" in first.ticks else "")
        + f"; the machine {machine_pct:.0f}% of {ncpu * 100}%, of which"
        f" {max(0.0, machine_pct - ours):.0f}% other processes (steal {steal:.1%});"
        f" load average {r['loadavg'][0]} at the start, {r['loadavg'][1]} at the end."
    )
    if cpu("proxy") >= 90:
        verdict = "the proxy saturates: its one event loop is busy all the time"
    elif machine_pct >= 90 * ncpu:
        verdict = "the machine saturates: every core is busy, the proxy is not the limit alone"
    elif worker_cpu >= 90 * args.workers:
        verdict = "the load generator saturates: add --workers"
    else:
        verdict = "nothing saturates: the offered load is the limit"
    out.append(f"Saturation: {verdict}.")
    if shed:
        out.append(
            f"Churn arrivals shed at the client's in-flight cap ({args.max_inflight}): {shed}."
        )
    out.append("")
    # Errors.
    if errors:
        out.append("| errors: traffic | method | kind | count |")
        out.append("|---|---|---|---:|")
        for (mode, method, kind), n in sorted(errors.items()):
            out.append(f"| {mode} | {method} | {kind} | {n} |")
        out.append("")
        for kind, text in samples_text.items():
            out.append(f"- {kind}: {text[:300]}")
        out.append("")
    else:
        out.append(
            "Errors: 0 (no TApplicationException, no declared exception, no wrong or"
            " out-of-order reply, no timeout, no connection refused or lost)."
        )
        out.append("")
    warm_errors = sum(res["warm_errors"] for res in results)
    reconnects = sum(res["reconnects"] for res in results)
    client_errors = sum(
        delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_client_errors_total"
    )
    upstream_failed = sum(
        delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_upstream_requests_total" and dict(labels)["outcome"] != "ok"
    )
    cache_errors = {
        dict(labels)["operation"]: delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_cache_errors_total"
    }
    failed_ops = ", ".join(f"{k} {v:.0f}" for k, v in cache_errors.items() if v) or "none"
    out.append(
        f"Cache store errors during the window (hmsproxy_cache_errors_total): {failed_ops};"
        " the call it belonged to was answered from the HMS (fail open); connection errors, or"
        " timeouts outnumbering successes, send every call there for a back-off period."
    )
    upstream = sum(
        delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_upstream_requests_total"
    )
    hms_cpu = (end.ticks.get("hms", 0) - first.ticks.get("hms", 0)) / TICK
    out.append(
        f"Calls the proxy sent to the HMS: {upstream:,.0f} ({upstream / window:,.1f}/s);"
        f" HMS CPU per upstream call {hms_cpu / max(upstream, 1) * 1000:.1f} ms."
    )
    reads_up = sum(
        delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_upstream_requests_total" and _cacheable(dict(labels)["method"])
    )
    writes = sum(res["writes"] for res in results)
    shared = sum(
        delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_shared_reads_total"
    )
    out.append(
        f"Reads the proxy sent to the HMS: {reads_up:,.0f}, {reads_up / max(writes, 1):,.1f} per"
        f" write ({writes:,} writes; with --adhoc 0 every one of them is a write's doing: the"
        f" reads its invalidation causes); fenced reads answered by a shared call: {shared:,.0f}."
    )
    out.append(
        f"Also: warm-up errors {warm_errors}; reconnects of long-lived connections {reconnects};"
        f" the proxy's hmsproxy_client_errors_total +{client_errors:.0f},"
        f" failed upstream exchanges +{upstream_failed:.0f};"
        f" writes {sum(res['writes'] for res in results):,},"
        f" ad-hoc queries {sum(res['adhoc'] for res in results):,}."
    )
    out.append("")
    out += probe_section(r["probe"])
    out.append("")
    out += proxy_latency(r)
    out.append("")
    out += timeline(args, samples)
    out.append("")
    # The probe's calls in the window are get_table hits too (its first call was before).
    with_probe = counts + Counter({("probe", "get_table", HIT): len(r["probe"]["loaded"][0])})
    out += check_classes(r, with_probe, errors)
    out.append("")
    out += memory_section(args, r, samples)
    out.append("")
    out += proxy_log_summary(rig, log_offset, r["wall"])
    return "\n".join(out)


def probe_section(probe: dict[str, tuple[list[float], list[float]]]) -> list[str]:
    """The hit probe's figures, unloaded and under the load (see bench.load_probe)."""
    out = [
        "| hit probe (one connection, its own process) | calls | proxy hit p50 ms | p99 ms"
        " | p999 ms | floor p50 ms | floor p99 ms | hit p99 / floor p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for when in ("unloaded", "loaded"):
        hits, floor = probe[when]
        if not hits or not floor:
            continue
        p50, p99, p999, _ = quantiles(hits)
        f50, f99, _, _ = quantiles(floor)
        out.append(
            f"| {when} | {len(hits):,} | {p50} | {p99} | {p999} | {f50} | {f99}"
            f" | {percentile(hits, 0.99) / percentile(floor, 0.99):.2f}x |"
        )
    unloaded, loaded = probe["unloaded"][0], probe["loaded"][0]
    if unloaded and loaded:
        out.append("")
        out.append(
            f"Hit p99 under the load: {percentile(loaded, 0.99) / percentile(unloaded, 0.99):.1f}x"
            " the unloaded hit p99. The probe sends a get_table of a table the load never"
            " writes every 10 ms, to the proxy and to the floor server (a do-nothing asyncio"
            " server replaying the metastore's reply) in turn: the floor's p99 is what the"
            " machine's load does to any Python server's round trip."
        )
    return out


def proxy_latency(r: dict[str, Any]) -> list[str]:
    """Quantiles from the proxy's own histogram by source (cache or HMS): bucket bounds."""
    buckets: dict[str, dict[float, float]] = {}
    for name, labels in r["after"]:
        if name != "hmsproxy_request_duration_seconds_bucket":
            continue
        d = dict(labels)
        le = float(d["le"])
        got = delta(r, name, **d)
        per = buckets.setdefault(d["source"], {})
        per[le] = per.get(le, 0.0) + got
    out = []
    for source, per in sorted(buckets.items()):
        total = per[max(per)]
        if not total:
            continue
        out.append(
            f"The proxy's own histogram, served from {source}: {total:,.0f} calls,"
            f" p50 {bucket_bound(per, 0.5)}, p99 {bucket_bound(per, 0.99)},"
            f" p999 {bucket_bound(per, 0.999)} (time inside the proxy, bucket bounds)."
        )
    return out


def bucket_bound(cumulative: dict[float, float], q: float) -> str:
    """The upper bound of the histogram bucket holding quantile ``q``."""
    total = cumulative[max(cumulative)]
    for le in sorted(cumulative):
        if cumulative[le] >= q * total:
            return "> 30 s" if le == float("inf") else f"<= {le * 1000:g} ms"
    return "?"


def timeline(args: argparse.Namespace, samples: list[Sample]) -> list[str]:
    """The run as the proxy counted it, per 10 s (per minute for long runs)."""
    step = 60.0 if args.duration >= 300 else 10.0
    out = [
        "| from s | calls/s | sent to HMS/s | failed calls | cache store errors | RSS MB"
        " | cache MB | memos MB | rest MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    prev = samples[0]
    for s in samples[1:]:
        if s.at + 1e-6 < prev.at + step and s is not samples[-1]:
            continue
        span = max(1e-9, s.at - prev.at)
        cache = f"{s.cache_bytes / MB:.1f}" if s.cache_bytes >= 0 else "-"
        memos = f"{s.memos / MB:.1f}" if s.memos >= 0 else "-"
        rest = f"{s.unexplained / MB:.1f}" if s.unexplained is not None else "-"
        out.append(
            f"| {prev.at:.0f} | {(s.requests - prev.requests) / span:,.0f}"
            f" | {(s.upstream - prev.upstream) / span:,.1f} | {s.failed - prev.failed:,.0f}"
            f" | {s.cache_errors - prev.cache_errors:,.0f} | {s.rss / MB:.1f} | {cache}"
            f" | {memos} | {rest} |"
        )
        prev = s
    return out


def check_classes(
    r: dict[str, Any],
    counts: Counter[tuple[str, str, str]],
    errors: Counter[tuple[str, str, str]],
) -> list[str]:
    """The client's classes against the proxy's own per-method look-up counters."""
    store_errors = sum(
        delta(r, n, **dict(labels))
        for (n, labels) in r["after"]
        if n == "hmsproxy_cache_errors_total"
    )
    out = [
        "Classification check (client's prediction vs the proxy's hmsproxy_cache_lookups_total"
        " over the window): proxy - predicted must lie within [0, unsure + errors], give or"
        f" take the {store_errors:.0f} calls whose Redis look-up or fill failed (they went to"
        " the metastore):",
        "",
        "| method | predicted hit | proxy hit | predicted miss | proxy miss | unsure"
        " | errors | proxy bypass | agrees |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    methods = sorted({m for (_, m, c) in counts if c in (HIT, MISS, UNSURE)})
    all_ok = True
    for method in methods:
        ph = sum(v for (_, m, c), v in counts.items() if m == method and c == HIT)
        pm = sum(v for (_, m, c), v in counts.items() if m == method and c == MISS)
        pu = sum(v for (_, m, c), v in counts.items() if m == method and c == UNSURE)
        pe = sum(v for (_, m, _k), v in errors.items() if m == method)
        xh = delta(r, "hmsproxy_cache_lookups_total", method=method, result="hit")
        xh += delta(r, "hmsproxy_cache_lookups_total", method=method, result="negative_hit")
        xm = delta(r, "hmsproxy_cache_lookups_total", method=method, result="miss")
        xb = delta(r, "hmsproxy_cache_lookups_total", method=method, result="bypass")
        slack = pu + pe
        # A predicted hit the proxy did not serve from the cache: a look-up or a fill that
        # Redis did not answer in time (fail open: that call went to the metastore).
        lost = store_errors
        ok = (
            -(xb + lost) <= xh - ph <= slack
            and -slack <= xm - pm <= slack + lost
            and xb <= slack + lost
        )
        all_ok &= ok
        out.append(
            f"| {method} | {ph:,} | {xh:,.0f} | {pm:,} | {xm:,.0f} | {pu:,} | {pe:,}"
            f" | {xb:,.0f} | {'yes' if ok else '**no**'} |"
        )
    out.append("")
    out.append(
        "Classification: consistent with the proxy's counters."
        if all_ok
        else "Classification: **NOT consistent** with the proxy's counters (see the table)."
    )
    return out


WARM_UP = 300.0  # seconds of a long run whose memory growth is the warm-up's, not a leak's
# Flat: what the caches and memos do not explain grows less than this after the warm-up
# (3 MB in 30 minutes). A 1 MB/min rule called 20 MB in 30 minutes flat.
FLAT_MB_PER_MINUTE = 0.1


def memos_line(samples: list[Sample]) -> str:
    """Each memo's bytes at the start and the end of the window, by its own count."""
    first, last = samples[0], samples[-1]
    names = sorted(set(first.memo_bytes) | set(last.memo_bytes))
    start, end = first.memo_bytes, last.memo_bytes
    each = ", ".join(f"{n} {start.get(n, 0) / MB:.1f} -> {end.get(n, 0) / MB:.1f}" for n in names)
    return f"In-process memos, start -> end (MB, hmsproxy_memo_bytes): {each}."


def soak_verdict(points: list[tuple[float, float]], with_memos: bool, under_limit: bool) -> str:
    beyond = "the cache's contents and the memos" if with_memos else "the cache's contents"
    slope = slope_mb_per_minute(points)
    if abs(slope) < FLAT_MB_PER_MINUTE and under_limit:
        return (
            f"Soak verdict: memory flat (beyond {beyond}, which their budgets bound:"
            f" {slope:+.2f} MB/min after the warm-up, under {FLAT_MB_PER_MINUTE} MB/min; peak"
            " under the limit)."
        )
    return (
        f"Soak verdict: **memory NOT flat**: beyond {beyond}, {slope:+.2f} MB/min after the"
        f" warm-up{'' if under_limit else ', and the peak is over the limit'}"
        " (PYTHONPATH=bench/memprobe tells a leak from memory the allocators keep free)."
    )


def memos_settled(samples: list[Sample]) -> float | None:
    """When the memos (bounded, each filling towards its cap while new requests arrive)
    stopped growing: the first sample holding 98% of the most they held; ``None`` if not
    known. Until then their allocators' arenas grow with them (pymalloc keeps an arena
    while any of its blocks lives), which is warm-up, not a leak."""
    known = [(s.at, s.memos) for s in samples if s.memos >= 0]
    if not known:
        return None
    start, most = known[0][1], max(m for _, m in known)
    return next(at for at, m in known if m >= start + 0.98 * (most - start))


def memory_section(args: argparse.Namespace, r: dict[str, Any], samples: list[Sample]) -> list[str]:
    # The limit: idle, the cache's budget, and what the memos hold by their own counts at
    # most (each bounded by its own cap, see proxy.memo).
    budget = parse_size(args.memory_cache_bytes) + max(max(s.memos for s in samples), 0)
    idle = r["idle_rss"]
    peak = max(r["hwm"], max(s.rss for s in samples))
    points = [(s.at, float(s.rss)) for s in samples]
    half = [p for p in points if p[0] >= samples[-1].at / 2]
    # What the cache's own contents do not explain; then what neither they nor the memos
    # (bounded, and counted by the proxy) explain: the memory that must stay flat.
    rest = [(s.at, float(s.rss - s.cache_bytes)) for s in samples if s.cache_bytes >= 0]
    rest_half = [p for p in rest if p[0] >= samples[-1].at / 2]
    unexplained = [(s.at, s.unexplained) for s in samples if s.unexplained is not None]
    left_300 = [p for p in unexplained if p[0] >= WARM_UP]
    left_half = [p for p in unexplained if p[0] >= samples[-1].at / 2]
    settled = memos_settled(samples)
    warm_up = max(WARM_UP, settled if settled is not None else 0.0)
    left_warm = [p for p in unexplained if p[0] >= warm_up]
    out = [
        f"Proxy memory: RSS idle {idle / MB:.0f} MB, peak {peak / MB:.0f} MB (VmHWM),"
        f" limit idle + --memory-cache-bytes + the memos = {(idle + budget) / MB:.0f} MB:"
        f" {'under' if peak <= idle + budget else '**OVER**'};"
        f" slope {slope_mb_per_minute(points):+.2f} MB/min over the window,"
        f" {slope_mb_per_minute(half):+.2f} MB/min over its second half"
        f" ({slope_mb_per_minute(rest_half):+.2f} MB/min not counting the cache's contents);"
        f" the proxy's cache held {r['entries']:,} entries, {r['cache_bytes'] / MB:.1f} MB"
        " at the end.",
    ]
    if unexplained:
        out.append("")
        out.append(memos_line(samples))
        out.append(
            f"RSS beyond the cache's contents and the memos: {unexplained[0][1] / MB:.1f} MB"
            f" at the start, {unexplained[-1][1] / MB:.1f} MB at the end; slope"
            f" {slope_mb_per_minute(unexplained):+.2f} MB/min over the window,"
            f" {slope_mb_per_minute(left_half):+.2f} MB/min over its second half"
            + (
                f", {slope_mb_per_minute(left_300):+.2f} MB/min after the first {WARM_UP:.0f} s"
                if len(left_300) >= 2
                else ""
            )
            + (
                f", {slope_mb_per_minute(left_warm):+.2f} MB/min from {warm_up:.0f} s, when"
                " the memos had stopped growing (the warm-up)"
                if warm_up > WARM_UP and len(left_warm) >= 2
                else ""
            )
            + "."
        )
    if args.soak or args.duration >= 300:
        out.append("")
        # Whichever the run allows; a warm-up past the window's last third leaves too few.
        usable = len(left_warm) >= 2 and warm_up <= samples[-1].at * 2 / 3
        after_warm_up = (left_warm if usable else left_half) or rest_half
        out.append(soak_verdict(after_warm_up, bool(unexplained), peak <= idle + budget))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=256, help="long-lived connections")
    parser.add_argument(
        "--churn-rate", type=float, default=0.0, help="calls/s, each on a new connection"
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds measured (default 60; soak 600)"
    )
    parser.add_argument(
        "--soak", action="store_true", help="10 minutes, samples every 5 s (sets --duration 600)"
    )
    parser.add_argument("--store", choices=["redis", "embedded"], default="redis")
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--tables", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=100, help="per table (at least 40)")
    parser.add_argument("--write-every", type=int, default=10000, help="a write per N calls")
    parser.add_argument(
        "--adhoc", type=float, default=0.002, help="share of queries never asked before"
    )
    parser.add_argument("--think", type=float, default=0.0, help="ms between Spark queries")
    parser.add_argument("--memory-cache-bytes", default="256MiB", help="the proxy's budget")
    parser.add_argument("--max-calls", type=int, default=5_000_000, help="a cap on calls")
    parser.add_argument("--max-inflight", type=int, default=1024, help="churn queries in flight")
    parser.add_argument("--call-timeout", type=float, default=10.0, help="seconds per call")
    parser.add_argument("--warm-timeout", type=float, default=600.0)
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--proxy-arg", action="append", default=[], help="one more proxy argument (repeatable)"
    )
    args = parser.parse_args()
    if args.duration is None:
        args.duration = 600.0 if args.soak else 60.0
    if args.soak:
        args.sample_every = 5.0
    problems = []
    if not 0 < args.duration <= 3600:
        problems.append("--duration must be within (0, 3600] seconds")
    if not 0 <= args.connections <= 4000:
        problems.append("--connections must be within [0, 4000]")
    if not 0 <= args.churn_rate <= 2000:
        problems.append("--churn-rate must be within [0, 2000] calls/s")
    if args.connections == 0 and args.churn_rate == 0:
        problems.append("no load: give --connections or --churn-rate")
    if args.partitions < 40:
        problems.append("--partitions must be at least 40")
    if args.workers < 1 or args.tables < args.workers:
        problems.append("need at least one worker and one table per worker")
    if problems:
        parser.error("; ".join(problems))

    DATA.mkdir(parents=True, exist_ok=True)
    rig = start_rig(args)
    try:
        log_offset = len(rig.proxy.log())
        result = run(args, rig)
        text = report(args, rig, result, log_offset)
    finally:
        stop_rig(rig)
    print()
    print(text)
    print(f"\n(proxy log: {rig.proxy.log_path})")


def _cacheable(method: str) -> bool:
    from proxy import catalog

    spec = catalog.lookup(method)
    return spec is not None and spec.kind is catalog.Kind.CACHEABLE_READ


if __name__ == "__main__":
    main()
