"""The client side of ``bench.load``: one process of asyncio connections driving the proxy.

A worker owns a disjoint set of tables: it is the only one to read or write them, so it
knows, for every call it makes, whether the proxy can have the reply cached (see
:class:`Model`). It runs long-lived Spark-shaped connections (``set_ugi`` once, then
``get_table`` and ``get_partitions_by_filter`` back to back) and Trino-shaped queries at a
fixed arrival rate, each call of which opens a new connection (``get_table_req``,
``get_partition_names_ps``, ``get_partitions_by_names`` in batches of 20,
``get_partitions_statistics_req``). Every ``write_every`` calls, the next action is a write
(``alter_partition`` on a random partition of one of its tables), which invalidates.
"""

from __future__ import annotations

import array
import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from proxy import idl
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message, MessageReader, Transport
from tests.rig.sample import storage_descriptor

DB = "loadgen"
COLUMNS = 10
BATCH = 20  # names per get_partitions_by_names, as Trino's hive.metastore partition batches

HIT, MISS, UNSURE, WRITE, ERROR = "hit", "miss", "unsure", "write", "error"
LONG, CHURN, WARM = "long-lived", "churn", "warm"

# What a reply must look like beyond "a REPLY without an exception".
EXPECT_NOTHING = -1
EXPECT_NAME = -2  # the table's name appears in the reply

_UNCERTAIN = -1  # model state of a key: filled or not, nobody can tell


@dataclass(frozen=True)
class WorkerConfig:
    index: int
    port: int
    tables: tuple[str, ...]
    partitions: int
    connections: int
    churn_rate: float  # calls per second, each on a new connection
    duration: float
    max_calls: int
    write_every: int  # 0: no writes
    adhoc: float  # share of queries asking for something never asked before
    call_timeout: float
    think: float  # seconds a long-lived connection waits between queries
    max_inflight: int  # churn queries in flight at most; arrivals beyond are shed
    seed: int
    warehouse: str


def part_value(i: int) -> str:
    return f"d{i:04d}"


def ranges(partitions: int) -> list[tuple[int, int]]:
    """The partition ranges queries read: 10, 20 or 40 partitions from a multiple of 10."""
    return [
        (lo, lo + length) for length in (10, 20, 40) for lo in range(0, partitions - length + 1, 10)
    ]


def column_specs() -> list[tuple[str, str]]:
    """(name, type) of the tables' columns."""
    kinds = ("string", "bigint", "int", "double", "string")
    return [(f"col_{i:02d}", kinds[i % len(kinds)]) for i in range(COLUMNS)]


def columns() -> list[Any]:
    m = idl.module()
    return [m.FieldSchema(name, kind, None) for name, kind in column_specs()]


def storage(location: str) -> Any:
    return storage_descriptor(location, column_specs(), idl.module())


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    template: bytes  # the request with seqid 0
    seqid_at: int
    keys: tuple[tuple[Any, ...], ...]  # what the reply depends on, in the cache
    table: str
    expect: int  # list length the reply must have, or EXPECT_*
    part: int = -1  # alter_partition: the partition written


def make_call(
    method: str, keys: tuple[tuple[Any, ...], ...], table: str, expect: int, **args: Any
) -> Call:
    request = idl.encode_call(method, 0, **args)
    return Call(method, request, 8 + len(method.encode()), keys, table, expect)


class Requests:
    """Every request of the workload for one table, encoded once."""

    def __init__(self, table: str, partitions: int) -> None:
        m = idl.module()
        self.table = table
        self.names = [f"ds={part_value(i)}" for i in range(partitions)]
        t = table
        self.get_table = make_call("get_table", (("t", t),), t, EXPECT_NAME, dbname=DB, tbl_name=t)
        self.get_table_req = make_call(
            "get_table_req",
            (("tr", t),),
            t,
            EXPECT_NAME,
            req=m.GetTableRequest(dbName=DB, tblName=t),
        )
        self.names_ps = make_call(
            "get_partition_names_ps",
            (("n", t),),
            t,
            partitions,
            db_name=DB,
            tbl_name=t,
            part_vals=[""],
            max_parts=-1,
        )
        self.filters: dict[tuple[int, int], Call] = {}
        self.stats: dict[tuple[int, int], Call] = {}
        self.batches: dict[tuple[int, int], list[Call]] = {}
        for lo, hi in ranges(partitions):
            self.filters[(lo, hi)] = make_call(
                "get_partitions_by_filter",
                (("f", t, lo, hi),),
                t,
                hi - lo,
                db_name=DB,
                tbl_name=t,
                filter=self.filter(lo, hi),
                max_parts=-1,
            )
            self.stats[(lo, hi)] = self.stats_call(lo, hi, [c.name for c in columns()[:4]])
            self.batches[(lo, hi)] = [
                make_call(
                    "get_partitions_by_names",
                    tuple(("p", t, i) for i in range(start, min(start + BATCH, hi))),
                    t,
                    min(start + BATCH, hi) - start,
                    db_name=DB,
                    tbl_name=t,
                    names=self.names[start : min(start + BATCH, hi)],
                )
                for start in range(lo, hi, BATCH)
            ]

    @staticmethod
    def filter(lo: int, hi: int) -> str:
        return f'ds >= "{part_value(lo)}" and ds < "{part_value(hi)}"'

    def stats_call(
        self, lo: int, hi: int, cols: list[str], key: tuple[Any, ...] | None = None
    ) -> Call:
        m = idl.module()
        return make_call(
            "get_partitions_statistics_req",
            (key or ("s", self.table, lo, hi),),
            self.table,
            EXPECT_NOTHING,
            request=m.PartitionsStatsRequest(
                dbName=DB, tblName=self.table, colNames=cols, partNames=self.names[lo:hi]
            ),
        )

    def adhoc_filter(self, lo: int, hi: int, n: str) -> Call:
        """A filter nobody asked before (it excludes a value no partition has)."""
        return make_call(
            "get_partitions_by_filter",
            (("a", n),),
            self.table,
            hi - lo,
            db_name=DB,
            tbl_name=self.table,
            filter=f'{self.filter(lo, hi)} and ds <> "{n}"',
            max_parts=-1,
        )

    def adhoc_stats(self, lo: int, hi: int, n: str) -> Call:
        """Statistics for a column list nobody asked for before."""
        return self.stats_call(lo, hi, [columns()[0].name, f"col_{n}"], ("a", n))

    def write(self, part: int, warehouse: str, counter: int) -> Call:
        m = idl.module()
        value = part_value(part)
        new_part = m.Partition(
            values=[value],
            dbName=DB,
            tableName=self.table,
            sd=storage(f"{warehouse}/{DB}.db/{self.table}/ds={value}"),
            parameters={"numRows": "1000", "loadgen.writes": str(counter)},
        )
        call = make_call(
            "alter_partition",
            (),
            self.table,
            EXPECT_NOTHING,
            db_name=DB,
            tbl_name=self.table,
            new_part=new_part,
        )
        return Call(call.method, call.template, call.seqid_at, (), self.table, EXPECT_NOTHING, part)


@dataclass(slots=True)
class Ticket:
    statuses: list[tuple[str, int, int]]  # per key: status at send, start number, busy
    write_starts: int
    writing: int
    gen: int


class Model:
    """What the proxy's cache holds for this worker's tables, call by call.

    A key is the cache entry a call reads (one per call, or one per partition for
    get_partitions_by_names). Its state is the write generation it was filled at, absent,
    or uncertain. A call is a **hit** if every key it reads was filled and nothing it
    depends on has been written since; a **miss** if one of its keys was never filled or
    was invalidated, and no other call could have filled it meanwhile (no other call of
    the same key in flight, no write to the table overlapping the call); otherwise
    **unsure** (counted, but in neither class). The proxy runs with TTLs longer than the
    run and the notification follower off, so writes are the only invalidations; the
    proxy's own per-method counters check the result afterwards.
    """

    def __init__(self, tables: tuple[str, ...], partitions: int) -> None:
        self.gen = 0
        self.table_gen = dict.fromkeys(tables, 0)
        self.part_gen = {t: [0] * partitions for t in tables}
        self.write_starts = dict.fromkeys(tables, 0)
        self.writing = dict.fromkeys(tables, 0)
        self.state: dict[tuple[Any, ...], int] = {}
        self.starts: dict[tuple[Any, ...], int] = {}
        self.inflight: dict[tuple[Any, ...], int] = {}

    def _depends(self, key: tuple[Any, ...]) -> int:
        """The last write generation the entry of ``key`` depends on."""
        kind = key[0]
        if kind == "f":  # a whole list: any partition of the table
            return self.table_gen[key[1]]
        if kind == "s":  # statistics of a range: its partitions
            return max(self.part_gen[key[1]][key[2] : key[3]])
        if kind == "p":  # one partition
            return self.part_gen[key[1]][key[2]]
        return 0  # the table object and the partition names: no write here changes them

    def begin(self, call: Call) -> Ticket:
        statuses = []
        for key in call.keys:
            state = self.state.get(key)
            if state is None:
                status = MISS
            elif state == _UNCERTAIN:
                status = UNSURE
            elif self._depends(key) > state:
                status = MISS
            else:
                status = HIT
            start = self.starts.get(key, 0) + 1
            self.starts[key] = start
            busy = self.inflight.get(key, 0)
            self.inflight[key] = busy + 1
            statuses.append((status, start, busy))
        t = call.table
        return Ticket(statuses, self.write_starts[t], self.writing[t], self.gen)

    def end(self, call: Call, ticket: Ticket, ok: bool) -> str:
        t = call.table
        overlapped = ticket.writing > 0 or self.write_starts[t] != ticket.write_starts
        certain_miss = False
        unsure = overlapped
        for key, (status, start, busy) in zip(call.keys, ticket.statuses, strict=True):
            raced = busy > 0 or self.starts[key] != start
            left = self.inflight[key] - 1
            if left:
                self.inflight[key] = left
            else:
                del self.inflight[key]
                del self.starts[key]
            if status == MISS:
                if raced:
                    status = UNSURE
                else:
                    certain_miss = True
            if status == UNSURE:
                unsure = True
            if key[0] == "a":
                continue  # never asked again: no state to keep
            if overlapped or (not ok and status != HIT):
                self.state[key] = _UNCERTAIN
            elif status != HIT:
                self.state[key] = ticket.gen
        if not ok:
            return ERROR
        if overlapped:
            return UNSURE
        return MISS if certain_miss else UNSURE if unsure else HIT

    def begin_write(self, table: str) -> None:
        self.write_starts[table] += 1
        self.writing[table] += 1

    def end_write(self, table: str, part: int) -> None:
        """alter_partition changes the partition (and every whole list of the table)."""
        self.writing[table] -= 1
        self.gen += 1
        self.part_gen[table][part] = self.gen
        self.table_gen[table] = self.gen


class ThriftConnection:
    """One Thrift connection (buffered transport), one call at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = MessageReader(Transport.BUFFERED, 1 << 30)

    async def call(self, request: bytes) -> Message:
        self.writer.write(request)
        while True:
            message = self.parser.next_message()
            if message is not None:
                return message
            data = await self.reader.read(1 << 18)
            if not data:
                raise EOFError("the proxy closed the connection")
            self.parser.feed(data)

    def close(self) -> None:
        self.writer.close()


def app_error_text(body: bytes) -> str:
    """The message of a TApplicationException (field 1, a string), if it has one."""
    if len(body) >= 7 and body[0] == 11 and body[1:3] == b"\x00\x01":
        n = int.from_bytes(body[3:7], "big")
        return body[7 : 7 + n].decode(errors="replace")
    return body[:80].hex()


def check_reply(call: Call, seqid: int, message: Message) -> tuple[str, str] | None:
    """(error kind, detail) if the reply is not a proper answer to the call."""
    header = message.header
    body = message.body
    if header.type == MessageType.EXCEPTION:
        return "app_exception", f"{call.method}: {app_error_text(body)}"
    if header.type != MessageType.REPLY or header.name != call.method or header.seqid != seqid:
        return "wrong_reply", (
            f"{call.method} seqid {seqid}: got type {header.type} {header.name} {header.seqid}"
        )
    if not body:
        return "wrong_reply", f"{call.method}: empty result"
    if body[0] == 0:  # STOP: a void result, success
        return None if call.method == "alter_partition" else ("wrong_reply", "empty result")
    fid = int.from_bytes(body[1:3], "big", signed=True)
    if fid != 0:
        return "declared_exception", f"{call.method}: result field {fid} ({body[:200]!r})"
    if call.expect >= 0:
        size = int.from_bytes(body[4:8], "big", signed=True) if len(body) >= 8 else -1
        if body[0] != 15 or size != call.expect:
            return "wrong_reply", f"{call.method}: {size} items, expected {call.expect}"
    elif call.expect == EXPECT_NAME and call.table.encode() not in body:
        return "wrong_reply", f"{call.method}: the reply does not name {call.table}"
    return None


class Worker:
    def __init__(self, config: WorkerConfig, write_lock: Any = None) -> None:
        self.cfg = config
        # One write at a time across all workers: the rig's HMS fails concurrent
        # alter_partition calls (its notification listener builds messages with Hive's
        # JSONMessageFactory, whose shared Thrift JSON deserializer is not thread-safe:
        # "Event not set up correctly"). Not the proxy's doing; kept out of the figures.
        self.write_lock = write_lock
        self.random = random.Random(config.seed)
        self.requests = {t: Requests(t, config.partitions) for t in config.tables}
        self.ranges = ranges(config.partitions)
        self.model = Model(config.tables, config.partitions)
        self.seqid = 0
        self.reads_since_write = 0
        self.writes = 0
        self.adhoc_made = 0
        self.issued = 0
        self.deadline = float("inf")
        self.latencies: dict[tuple[str, str], array.array[float]] = {}
        self.connects: array.array[float] = array.array("d")
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (mode, method, class)
        self.errors: Counter[tuple[str, str, str]] = Counter()  # (mode, method, kind)
        self.samples: dict[str, str] = {}  # one detail per error kind
        self.shed = 0
        self.churn_inflight = 0
        self.churn_peak = 0
        self.reconnects = 0
        self.warm_errors = 0
        # Trino-shaped queries make this many calls on average (for the arrival rate).
        self.calls_per_query = 3 + sum(
            len(self.requests[config.tables[0]].batches[r]) for r in self.ranges
        ) / len(self.ranges)

    # -- what to do next -------------------------------------------------------------------

    def stopping(self) -> bool:
        return time.monotonic() >= self.deadline or self.issued >= self.cfg.max_calls

    def _next_write(self) -> list[Call] | None:
        if self.cfg.write_every <= 0 or self.reads_since_write < self.cfg.write_every:
            return None
        self.reads_since_write = 0
        self.writes += 1
        table = self.random.choice(self.cfg.tables)
        part = self.random.randrange(self.cfg.partitions)
        counter = self.cfg.index * 1_000_000_000 + self.writes
        return [self.requests[table].write(part, self.cfg.warehouse, counter)]

    def _adhoc_name(self) -> str:
        self.adhoc_made += 1
        return f"w{self.cfg.index}x{self.adhoc_made}"

    def _pick(self) -> tuple[Requests, tuple[int, int], bool]:
        """A table's requests, a partition range, and whether this query is ad hoc."""
        req = self.requests[self.random.choice(self.cfg.tables)]
        return req, self.random.choice(self.ranges), self.random.random() < self.cfg.adhoc

    def spark_query(self) -> list[Call]:
        write = self._next_write()
        if write:
            return write
        req, (lo, hi), adhoc = self._pick()
        listing = req.adhoc_filter(lo, hi, self._adhoc_name()) if adhoc else req.filters[(lo, hi)]
        return [req.get_table, listing]

    def trino_query(self) -> list[Call]:
        write = self._next_write()
        if write:
            return write
        req, (lo, hi), adhoc = self._pick()
        stats = req.adhoc_stats(lo, hi, self._adhoc_name()) if adhoc else req.stats[(lo, hi)]
        return [req.get_table_req, req.names_ps, *req.batches[(lo, hi)], stats]

    def warm_calls(self) -> list[Call]:
        out = []
        for req in self.requests.values():
            out += [req.get_table, req.get_table_req, req.names_ps]
            out += [c for r in self.ranges for c in req.batches[r]]
            out += [req.stats[r] for r in self.ranges]
            out += [req.filters[r] for r in self.ranges]
        return out

    # -- calls -----------------------------------------------------------------------------

    async def connect(self, set_ugi: bool) -> ThriftConnection:
        async with asyncio.timeout(self.cfg.call_timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.cfg.port)
        conn = ThriftConnection(reader, writer)
        if set_ugi:  # as Hive's client (Spark) does on every new connection
            self.seqid += 1
            request = idl.encode_call(
                "set_ugi", self.seqid, user_name="spark", group_names=["spark"]
            )
            async with asyncio.timeout(self.cfg.call_timeout):
                reply = await conn.call(request)
            if reply.header.type != MessageType.REPLY:
                conn.close()
                raise ConnectionError(f"set_ugi: {app_error_text(reply.body)}")
        return conn

    def _error(self, mode: str, method: str, kind: str, detail: str) -> None:
        if mode == WARM:
            self.warm_errors += 1
        else:
            self.errors[(mode, method, kind)] += 1
        self.samples.setdefault(kind, detail)

    async def run_call(
        self, conn: ThriftConnection, call: Call, mode: str, started: float | None = None
    ) -> bool:
        """Make one call on ``conn``; ``False`` if the connection is no good any more."""
        if call.method != "alter_partition" or self.write_lock is None:
            return await self._run_call(conn, call, mode, started)
        waited = time.perf_counter()
        while not self.write_lock.acquire(False):
            await asyncio.sleep(0.002)
        if started is not None:  # waiting for the lock is not part of the call
            started += time.perf_counter() - waited
        try:
            return await self._run_call(conn, call, mode, started)
        finally:
            self.write_lock.release()

    async def _run_call(
        self, conn: ThriftConnection, call: Call, mode: str, started: float | None
    ) -> bool:
        self.seqid = self.seqid % 0x7FFFFFFF + 1
        seqid = self.seqid
        at = call.seqid_at
        request = call.template[:at] + seqid.to_bytes(4, "big") + call.template[at + 4 :]
        writing = call.method == "alter_partition"
        ticket = None
        if writing:
            self.model.begin_write(call.table)
        else:
            ticket = self.model.begin(call)
            self.reads_since_write += 1
        if mode != WARM:
            self.issued += 1
        if started is None:
            started = time.perf_counter()
        problem: tuple[str, str] | None = None
        alive = True
        try:
            async with asyncio.timeout(self.cfg.call_timeout):
                reply = await conn.call(request)
            problem = check_reply(call, seqid, reply)
        except TimeoutError:
            detail = f"{call.method}: no reply in {self.cfg.call_timeout} s"
            problem, alive = ("timeout", detail), False
        except (ConnectionError, EOFError, OSError) as exc:
            problem, alive = ("connection_lost", f"{call.method}: {exc!r}"), False
        except ProtocolError as exc:
            problem, alive = ("protocol", f"{call.method}: {exc}"), False
        elapsed = time.perf_counter() - started
        if writing:
            self.model.end_write(call.table, call.part)
            cls = ERROR if problem else WRITE
        else:
            assert ticket is not None
            cls = self.model.end(call, ticket, problem is None)
        if problem is not None:
            self._error(mode, call.method, *problem)
            return alive and problem[0] not in ("wrong_reply",)
        if mode != WARM:
            self.counts[(mode, call.method, cls)] += 1
            self.latencies.setdefault((mode, cls), array.array("d")).append(elapsed)
        return True

    # -- the three kinds of traffic --------------------------------------------------------

    async def warm(self, concurrency: int = 8) -> None:
        """Every key of every owned table, once, so the run starts from a warm cache."""
        calls = self.warm_calls()
        self.random.shuffle(calls)
        queue: asyncio.Queue[Call] = asyncio.Queue()
        for call in calls:
            queue.put_nowait(call)

        async def one() -> None:
            conn = await self.connect(set_ugi=False)
            while not queue.empty():
                if not await self.run_call(conn, queue.get_nowait(), WARM):
                    conn.close()
                    conn = await self.connect(set_ugi=False)
            conn.close()

        await asyncio.gather(*(one() for _ in range(concurrency)))

    async def open_long_lived(self) -> list[ThriftConnection]:
        conns: list[ThriftConnection] = []
        for start in range(0, self.cfg.connections, 32):  # the listener's backlog is 100
            n = min(32, self.cfg.connections - start)
            conns += await asyncio.gather(*(self.connect(set_ugi=True) for _ in range(n)))
        return conns

    async def long_lived(self, conn: ThriftConnection | None) -> None:
        while not self.stopping():
            if conn is None:
                try:
                    conn = await self.connect(set_ugi=True)
                    self.reconnects += 1
                except (OSError, ConnectionError, TimeoutError, EOFError) as exc:
                    self._error(LONG, "connect", "connect", repr(exc))
                    await asyncio.sleep(0.1)
                    continue
            for call in self.spark_query():
                if self.stopping():
                    break
                if not await self.run_call(conn, call, LONG):
                    conn.close()
                    conn = None
                    break
            if self.cfg.think > 0:
                await asyncio.sleep(self.cfg.think)
        if conn is not None:
            conn.close()

    async def churn_query(self) -> None:
        self.churn_inflight += 1
        self.churn_peak = max(self.churn_peak, self.churn_inflight)
        try:
            for call in self.trino_query():
                if self.stopping():
                    return
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(self.cfg.call_timeout):
                        reader, writer = await asyncio.open_connection("127.0.0.1", self.cfg.port)
                except (OSError, TimeoutError) as exc:
                    self._error(CHURN, call.method, "connect", repr(exc))
                    return  # the engine's query fails
                self.connects.append(time.perf_counter() - started)
                conn = ThriftConnection(reader, writer)
                ok = await self.run_call(conn, call, CHURN, started)
                conn.close()
                if not ok:
                    return
        finally:
            self.churn_inflight -= 1

    async def churn(self, start: float) -> None:
        """Trino-shaped queries arriving at a fixed rate (open loop), calls at churn_rate/s."""
        interval = self.calls_per_query / self.cfg.churn_rate
        tasks: set[asyncio.Task[None]] = set()
        due = start
        while not self.stopping():
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            due += interval
            if self.churn_inflight >= self.cfg.max_inflight:
                self.shed += 1
                continue
            task = asyncio.create_task(self.churn_query())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def run(self, pipe: Connection) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        warm_started = time.monotonic()
        await self.warm()
        # The coordinator asks for more passes until one makes the proxy miss nothing: a
        # fill the proxy could not store (a Redis deadline under load) must not count as
        # cached when the run starts.
        while True:
            pipe.send(("warmed", None))
            if await loop.run_in_executor(None, pipe.recv) != "again":
                break
            await self.warm()
        warm_seconds = time.monotonic() - warm_started
        self.reads_since_write = 0
        conns = await self.open_long_lived()
        pipe.send(("ready", warm_seconds))
        start = await loop.run_in_executor(None, pipe.recv)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        self.deadline = start + self.cfg.duration
        cpu = time.process_time()
        jobs = [self.long_lived(c) for c in conns]
        if self.cfg.churn_rate > 0:
            jobs.append(self.churn(start))
        await asyncio.gather(*jobs)
        finished = time.monotonic()
        return {
            "index": self.cfg.index,
            "warm_seconds": warm_seconds,
            "warm_errors": self.warm_errors,
            "started": start,
            "finished": finished,
            "cpu_seconds": time.process_time() - cpu,
            "latencies": {k: v.tobytes() for k, v in self.latencies.items()},
            "connects": self.connects.tobytes(),
            "counts": dict(self.counts),
            "errors": dict(self.errors),
            "samples": self.samples,
            "shed": self.shed,
            "churn_peak": self.churn_peak,
            "reconnects": self.reconnects,
            "writes": self.writes,
            "adhoc": self.adhoc_made,
            "issued": self.issued,
        }


def worker_main(config: WorkerConfig, pipe: Connection, write_lock: Any) -> None:
    """Entry point of a worker process; ``write_lock`` is shared by all workers."""
    try:
        result = asyncio.run(Worker(config, write_lock).run(pipe))
        pipe.send(("result", result))
    except BaseException as exc:  # report, never hang the coordinator
        import traceback

        pipe.send(("failed", "".join(traceback.format_exception(exc))))
    finally:
        pipe.close()
