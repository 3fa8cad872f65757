"""A randomised adversary for the proxies' coherence promise (issue 39), and its judge.

Writers bump a counter ``v`` in the parameters of tables and partitions, one write at a
time per table, through a random proxy or straight at the metastore; bursts of writes
straight at the metastore are released together by a barrier (HMS 2.3 then gives several
events one id, HIVE-16886); Redis is made to refuse writes while it serves reads (``CLIENT
PAUSE WRITE``, ``min-replicas-to-write`` unmet: NOREPLICAS); readers read through random
proxies, on long-lived and fresh connections, spelling names as clients may (upper case,
blanks around database and table names, partition names padded with blanks, which the
database matches loosely). Every call is recorded with when it started and ended, by this
process's monotonic clock.

:func:`judge` then holds every read to the README's "Coherence guarantees":

* a value older than a write acknowledged before the read started is wrong: at once for a
  write through the same proxy (read-your-writes); :data:`PEER_SLACK` later for a write
  through another proxy on the same Redis (the invalidation's delivery, at most
  ``--redis-tracking-max-lag``, 1 s); :data:`SLACK` later for any other (straight at the
  metastore, or between the stores: a notification poll of 0.3 s);
* a value no write had yet been sent for is wrong (not the metastore's);
* ``get_partitions_by_names`` must hold exactly the partitions the metastore returns for the
  same names (asked straight at it right after), ``get_partitions`` all of the table's, and
  every object must be the table or partition asked for;
* an error where the metastore answers the same call is wrong.

A write that was not acknowledged requires nothing (HMS 2.3's "Event not set up correctly"
under concurrent writes: committed but not logged, which no follower can see, as the README
says; a dropped connection): until the next acknowledged write of the object, any value it
may have left is accepted. Writers read the counter straight from the metastore before each
write, so the next write counts on from whatever the failed one left.

Readers pick their proxy at random (``read_weights``); one of them (the hot reader) reads
only tables and partitions named as written, which stay cached: a lost invalidation shows
there first. Bursts and Redis's refusals take turns, so that what a stale read missed tells
which shape it has (:func:`shapes`, :func:`report`: the event ids the metastore gave each
write are read from its log after the run, :func:`logged`).

After the workload, with every bound passed, each object is read through every proxy in
several spellings, twice (:meth:`Adversary.sweep`): whatever a shape left stale until the
TTL shows there.

Not sent: ``get_partition`` and ``get_partition_by_name`` with a padded partition name.
HMS 2.3.10 answers them "Expecting a partition with name ds=p0 , but metastore is returning
a partition with name ds=p0." and leaves the transaction of that connection's handler open:
every later call on the connection runs inside it, writes are acknowledged but rolled back
when it closes, and its Derby locks stall other connections (seen here, straight at the
metastore). Through a proxy, whose metastore connections are pooled, that would poison the
pool, which is not what this test is about.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from hmsclient import hmsclient
from hmsclient.genthrift.hive_metastore import ttypes as t
from thrift.protocol.TJSONProtocol import TJSONProtocol
from thrift.transport.TTransport import TMemoryBuffer

from proxy import idl
from proxy.wire.binary import MessageType
from tests.rig import raw
from tests.rig.sample import client, partition, storage_descriptor, table

# Seconds a write made elsewhere may take to be seen. Through the notification log: a poll
# (0.3 s here; the README says "about a second" at its default of 1 s). Through another proxy
# on the same Redis: the invalidation's delivery, "never later than --redis-tracking-max-lag"
# (1 s). What runs here takes a few hundred milliseconds and none at all (the summary's
# "longest ... read"), on a busy machine too.
SLACK = 2.0
PEER_SLACK = 1.0
HMS = "hms"  # the route of a write straight at the metastore

KEY = "ds"
VALUES = ("p0", "p1", "p2")
PARTITIONED = ("t0", "t1", "t2", "t3")
TABLES = (*PARTITIONED, "t4", "t5", "t6", "t7")

Obj = tuple[str, ...]  # (table,) or (table, partition name)
Client = hmsclient.HMSClient


def pname(value: str) -> str:
    return f"{KEY}={value}"


def show(obj: Obj) -> str:
    return " ".join(obj)


def create(host: str, port: int, db: str) -> None:
    """The database, its tables and partitions, every counter at 0."""
    zero = {"v": "0"}
    with client(host, port) as c:
        c.create_database(t.Database(db, "adversary", None, {}))
        for name in TABLES:
            keys = (KEY,) if name in PARTITIONED else ()
            c.create_table(table(db, name, storage_descriptor(None), keys=keys, parameters=zero))
        for name in PARTITIONED:
            c.add_partitions(
                [partition(db, name, [v], storage_descriptor(None), zero) for v in VALUES]
            )


# -- spellings -----------------------------------------------------------------------------

Spell = Callable[[str], str]
DB_SPELLINGS: list[Spell] = [
    lambda n: n,
    str.upper,
    lambda n: " " + n,
    lambda n: n + " ",
]
TABLE_SPELLINGS: list[Spell] = [
    lambda n: n,
    str.upper,
    lambda n: n + " ",
    lambda n: " " + n.upper() + " ",
]
# What HMS 2.3 takes in a write: alter_table trims nothing (a blank makes it a rename to a
# table that exists, refused), alter_partition(s) trims.
TABLE_WRITES: list[tuple[Spell, Spell]] = [
    (DB_SPELLINGS[0], TABLE_SPELLINGS[0]),
    (DB_SPELLINGS[1], TABLE_SPELLINGS[1]),
    (DB_SPELLINGS[0], TABLE_SPELLINGS[1]),
]
PARTITION_WRITES: list[tuple[Spell, Spell]] = [
    (DB_SPELLINGS[0], TABLE_SPELLINGS[0]),
    (DB_SPELLINGS[1], TABLE_SPELLINGS[1]),
    (DB_SPELLINGS[2], TABLE_SPELLINGS[2]),
    (DB_SPELLINGS[0], TABLE_SPELLINGS[3]),
]
# Each database spelling and each table spelling at least once.
SWEEP_SPELLINGS: list[tuple[Spell, Spell]] = [
    (DB_SPELLINGS[0], TABLE_SPELLINGS[0]),
    (DB_SPELLINGS[1], TABLE_SPELLINGS[1]),
    (DB_SPELLINGS[3], TABLE_SPELLINGS[2]),
    (DB_SPELLINGS[2], TABLE_SPELLINGS[3]),
]
# Partition names in get_partitions_by_names, with their weights: Derby ignores trailing
# blanks (a padded name finds the partition), not leading ones nor case.
NAME_FORMS: list[tuple[Callable[[str], list[str]], float]] = [
    (lambda n: [n], 0.45),
    (lambda n: [n + " "], 0.2),
    (lambda n: [n + "  "], 0.05),
    (lambda n: [n, n + " "], 0.2),
    (lambda n: [" " + n], 0.05),
    (lambda n: [n.upper()], 0.05),
]


def _pick(rng: random.Random, spellings: list[Spell], as_written: float) -> Spell:
    return spellings[0] if rng.random() < as_written else rng.choice(spellings[1:])


def by_names(rng: random.Random) -> list[str]:
    names: list[str] = []
    for v in rng.sample(VALUES, rng.randint(1, len(VALUES))):
        (form,) = rng.choices([f for f, _ in NAME_FORMS], weights=[w for _, w in NAME_FORMS])
        names += form(pname(v))
    if rng.random() < 0.1:
        names.append(pname("zz"))
    rng.shuffle(names)
    return names


# -- what happened -------------------------------------------------------------------------


@dataclass
class Write:
    obj: Obj
    value: int
    route: str
    how: str  # the call, with the names it was given
    names: tuple[str, str]  # the database and the table, as given
    started: float
    burst: int | None = None
    acked: float | None = None
    failure: str | None = None


@dataclass
class Read:
    proxy: str
    method: str
    args: dict[str, Any]
    fresh: bool
    started: float
    ended: float
    sweep: bool = False
    values: dict[Obj, int] = field(default_factory=dict)
    problem: str | None = None  # an error or a wrong set of objects: wrong whatever the values

    @property
    def how(self) -> str:
        return f"{self.method}({', '.join(repr(a) for a in self.args.values())})"


@dataclass
class Fault:
    kind: str
    started: float
    ended: float


class History:
    def __init__(self, peers: set[str]) -> None:
        self.peers = peers  # the proxies that share the Redis
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.writes: list[Write] = []
        self.reads: list[Read] = []
        self.faults: list[Fault] = []
        self.bursts = 0
        # The metastore's event id of each acknowledged write, (object, value): id, and how
        # many events each id was given to (read from the log after the run: see logged()).
        self.event_ids: dict[tuple[Obj, int], int] = {}
        self.id_counts: Counter[int] = Counter()

    def add(self, item: Write | Read | Fault) -> None:
        with self._lock:
            if isinstance(item, Write):
                self.writes.append(item)
            elif isinstance(item, Read):
                self.reads.append(item)
            else:
                self.faults.append(item)


# -- calls ---------------------------------------------------------------------------------


def decode(method: str, reply: bytes) -> tuple[Any, str | None]:
    """(the result's success value, None) or (None, what came instead)."""
    if reply == raw.CLOSED:
        return None, "the connection closed without a reply"
    if reply[3] != MessageType.REPLY:
        return None, f"a Thrift exception (message type {reply[3]})"
    cut = 12 + int.from_bytes(reply[4:8], "big")
    result = idl.decode_result(method, reply[cut:])
    if result.success is None:
        declared = {k: v for k, v in vars(result).items() if k != "success" and v is not None}
        return None, f"the exception {declared!r}"
    return result.success, None


class Connections:
    """Raw connections by route, kept open (or not: ``fresh``), opened again after an error."""

    def __init__(self, routes: dict[str, tuple[str, int]]) -> None:
        self.routes = routes
        self.open: dict[str, raw.RawConnection] = {}

    def call(self, route: str, request: bytes, *, fresh: bool = False) -> bytes:
        host, port = self.routes[route]
        conn = None if fresh else self.open.get(route)
        try:
            if conn is None:
                conn = raw.RawConnection(host, port, timeout=30)
                if not fresh:
                    self.open[route] = conn
            return conn.call(request)
        except (EOFError, OSError):
            self.open.pop(route, None)
            return raw.CLOSED
        finally:
            if fresh and conn is not None:
                conn.close()

    def close(self) -> None:
        for conn in self.open.values():
            conn.close()
        self.open.clear()


class Clients:
    """hmsclient connections by route (for writes), opened again after a transport error."""

    def __init__(self, routes: dict[str, tuple[str, int]]) -> None:
        self.routes = routes
        self.open: dict[str, Client] = {}

    def get(self, route: str) -> Client:
        if route not in self.open:
            c = client(*self.routes[route], timeout=30)
            c.open()
            self.open[route] = c
        return self.open[route]

    def drop(self, route: str) -> None:
        c = self.open.pop(route, None)
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()

    def close(self) -> None:
        for route in list(self.open):
            self.drop(route)


@dataclass
class Planned:
    news: list[tuple[Obj, int]]  # the objects written and their new values
    how: str
    names: tuple[str, str]  # the database and the table, as given
    call: Callable[[Client], None]


DECLARED = (t.MetaException, t.InvalidOperationException, t.NoSuchObjectException)


# -- the adversary -------------------------------------------------------------------------


class Adversary:
    """The workload against ``proxies`` (name: port) in front of the metastore ``hms``
    (host, port), whose database ``db`` :func:`create` made; Redis at ``redis_url`` is the
    one the Redis proxies share (its faults)."""

    def __init__(
        self,
        seed: int,
        db: str,
        hms: tuple[str, int],
        proxies: dict[str, int],
        redis_url: str,
        peers: set[str],
        read_weights: dict[str, float] | None = None,
        *,
        readers: int = 3,
        hot_readers: int = 1,
        writers: int = 2,
    ) -> None:
        self.db, self.proxies, self.redis_url = db, sorted(proxies), redis_url
        self.routes = {**{p: ("127.0.0.1", port) for p, port in proxies.items()}, HMS: hms}
        self.history = History(peers)
        self.read_weights = [(read_weights or {}).get(p, 1.0) for p in self.proxies]
        self.stop = threading.Event()
        self.locks = {n: threading.Lock() for n in TABLES}
        # Bursts and Redis's refusals take turns, so that a stale read tells which it was.
        self.turn = threading.Lock()
        self.errors: list[str] = []  # the rig's own failures: reported, never hidden
        rngs = random.Random(seed)
        jobs: list[tuple[str, Callable[[random.Random], None]]] = [
            *((f"reader-{i}", self._reader) for i in range(readers)),
            *((f"hot-reader-{i}", self._hot_reader) for i in range(hot_readers)),
            *((f"writer-{i}", self._writer) for i in range(writers)),
            ("bursts", self._bursts),
            ("faults", self._faults),
        ]
        self.threads = [
            threading.Thread(
                target=self._guard, args=(name, job, random.Random(rngs.random())), name=name
            )
            for name, job in jobs
        ]

    def run(self, seconds: float) -> None:
        for th in self.threads:
            th.start()
        self.stop.wait(seconds)
        self.stop.set()
        for th in self.threads:
            th.join(120)
            if th.is_alive():
                self.errors.append(f"{th.name} did not stop")

    def _guard(
        self, name: str, job: Callable[[random.Random], None], rng: random.Random | None
    ) -> None:
        try:
            job(rng or random.Random())
        except Exception as exc:
            self.errors.append(f"{name}: {exc!r}")
            self.stop.set()

    # -- reads -----------------------------------------------------------------------------

    def _request(self, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        """(method, the table, the call's arguments) of a random read."""
        name = rng.choice(TABLES)
        db = _pick(rng, DB_SPELLINGS, 0.8)(self.db)
        tbl = _pick(rng, TABLE_SPELLINGS, 0.7)(name)
        roll = rng.random()
        if name not in PARTITIONED or roll < 0.3:
            return "get_table", name, {"dbname": db, "tbl_name": tbl}
        common = {"db_name": db, "tbl_name": tbl}
        if roll < 0.4:
            return "get_partition", name, {**common, "part_vals": [rng.choice(VALUES)]}
        if roll < 0.5:
            return "get_partition_by_name", name, {**common, "part_name": pname(rng.choice(VALUES))}
        if roll < 0.6:
            return "get_partitions", name, {**common, "max_parts": -1}
        return "get_partitions_by_names", name, {**common, "names": by_names(rng)}

    def _hot_request(self, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        """A read of a table or partition as written, which the proxies keep cached
        (mostly hits: what a write's lost invalidation shows in)."""
        name = rng.choice(TABLES)
        if name in PARTITIONED and rng.random() < 0.3:
            args = {"db_name": self.db, "tbl_name": name, "part_name": pname(rng.choice(VALUES))}
            return "get_partition_by_name", name, args
        return "get_table", name, {"dbname": self.db, "tbl_name": name}

    def _hot_reader(self, rng: random.Random) -> None:
        self._reader(rng, self._hot_request)

    def _reader(
        self,
        rng: random.Random,
        request: Callable[[random.Random], tuple[str, str, dict[str, Any]]] | None = None,
    ) -> None:
        conns = Connections(self.routes)
        try:
            while not self.stop.is_set():
                method, name, args = (request or self._request)(rng)
                (proxy,) = rng.choices(self.proxies, weights=self.read_weights)
                self.read(conns, proxy, method, name, args, fresh=rng.random() < 0.3)
                time.sleep(rng.uniform(0, 0.01))
        finally:
            conns.close()

    def read(
        self,
        conns: Connections,
        proxy: str,
        method: str,
        name: str,
        args: dict[str, Any],
        *,
        fresh: bool = False,
        sweep: bool = False,
    ) -> Read:
        """One read through ``proxy``, recorded, with what is wrong with it at once."""
        request = idl.encode_call(method, 7, **args)
        started = time.monotonic()
        reply = conns.call(proxy, request, fresh=fresh)
        record = Read(proxy, method, args, fresh, started, time.monotonic(), sweep)
        self.history.add(record)
        success, problem = decode(method, reply)
        if problem is not None:
            if decode(method, conns.call(HMS, request))[1] is None:
                record.problem = f"{problem}, where the metastore answers"
            return record
        found = success if isinstance(success, list) else [success]
        for obj in found:
            if (obj.dbName, obj.tableName) != (self.db, name):
                record.problem = f"an object of {obj.dbName}.{obj.tableName}"
                return record
            key = (name,) if method == "get_table" else (name, pname(obj.values[0]))
            record.values[key] = int((obj.parameters or {}).get("v", "-1"))
        held = sorted(pname(obj.values[0]) for obj in found if method != "get_table")
        asked = args.get("part_name") or pname(args.get("part_vals", [""])[0])
        if method in ("get_partition", "get_partition_by_name") and held != [asked]:
            record.problem = f"the partition {held[0]}"
        elif method == "get_partitions" and held != [pname(v) for v in VALUES]:
            record.problem = f"the partitions {held}, not all the table's"
        elif method == "get_partitions_by_names":
            direct, direct_problem = decode(method, conns.call(HMS, request))
            if direct_problem is None:
                expected = sorted(pname(p.values[0]) for p in direct)
                if held != expected:
                    record.problem = f"the partitions {held}; the metastore returns {expected}"
        return record

    def sweep(self) -> None:
        """Every object through every proxy (one thread each), in each of
        :data:`SWEEP_SPELLINGS`, twice (what the first pass fills, the second is served)."""

        def through(proxy: str) -> None:
            conns = Connections(self.routes)
            try:
                for _ in range(2):
                    for name in TABLES:
                        for db_spelling, table_spelling in SWEEP_SPELLINGS:
                            db, tbl = db_spelling(self.db), table_spelling(name)
                            for method, args in _sweep_calls(name, db, tbl):
                                self.read(conns, proxy, method, name, args, sweep=True)
            finally:
                conns.close()

        threads = [
            threading.Thread(
                target=self._guard, args=(f"sweep {p}", lambda _, p=p: through(p), None)
            )
            for p in self.proxies
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)

    # -- writes ----------------------------------------------------------------------------

    def _writer(self, rng: random.Random) -> None:
        clients = Clients(self.routes)
        try:
            while not self.stop.is_set():
                name = rng.choice(TABLES)
                if not self.locks[name].acquire(timeout=0.2):
                    continue
                try:
                    weights = [2] * len(self.proxies) + [3]
                    (route,) = rng.choices([*self.proxies, HMS], weights=weights)
                    planned = self._plan(rng, name, clients.get(HMS), odd=rng.random() < 0.4)
                    self._send(planned, route, clients)
                finally:
                    self.locks[name].release()
                self.stop.wait(rng.uniform(0.3, 2.0))
        finally:
            clients.close()

    def _plan(
        self, rng: random.Random, name: str, direct: Client, *, odd: bool, tables_only: bool = False
    ) -> Planned:
        """A write of ``name``'s counter, or of one or two of its partitions', one more than
        the metastore holds now (read from ``direct``); spelled oddly if ``odd``."""
        db = self.db
        if name in PARTITIONED and not tables_only and rng.random() < 0.5:
            values = sorted(rng.sample(VALUES, rng.choice((1, 1, 2))))
            parts = [direct.get_partition(db, name, [v]) for v in values]
            for p in parts:
                p.parameters["v"] = str(int(p.parameters["v"]) + 1)
            db_spelling, table_spelling = (
                rng.choice(PARTITION_WRITES) if odd else PARTITION_WRITES[0]
            )
            wdb, wtbl = db_spelling(db), table_spelling(name)
            news: list[tuple[Obj, int]] = [
                ((name, pname(p.values[0])), int(p.parameters["v"])) for p in parts
            ]
            named = [pname(v) for v in values]
            if len(parts) == 1 and rng.random() < 0.6:
                how = f"alter_partition({wdb!r}, {wtbl!r}, {named[0]})"
                return Planned(
                    news, how, (wdb, wtbl), lambda c: c.alter_partition(wdb, wtbl, parts[0])
                )
            how = f"alter_partitions({wdb!r}, {wtbl!r}, {named})"
            return Planned(news, how, (wdb, wtbl), lambda c: c.alter_partitions(wdb, wtbl, parts))
        tbl = direct.get_table(db, name)
        tbl.parameters["v"] = str(int(tbl.parameters["v"]) + 1)
        db_spelling, table_spelling = rng.choice(TABLE_WRITES) if odd else TABLE_WRITES[0]
        wdb, wtbl = db_spelling(db), table_spelling(name)
        how = f"alter_table({wdb!r}, {wtbl!r})"
        return Planned(
            [((name,), int(tbl.parameters["v"]))],
            how,
            (wdb, wtbl),
            lambda c: c.alter_table(wdb, wtbl, tbl),
        )

    def _send(
        self, planned: Planned, route: str, clients: Clients, burst: int | None = None
    ) -> None:
        """The write through ``route``, recorded: acknowledged, or why not."""
        try:
            target = clients.get(route)
        except Exception as exc:
            self.errors.append(f"connecting to {route}: {exc!r}")
            return
        started = time.monotonic()
        writes = [
            Write(obj, v, route, planned.how, planned.names, started, burst)
            for obj, v in planned.news
        ]
        for w in writes:
            self.history.add(w)
        try:
            planned.call(target)
        except DECLARED as exc:
            failure = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        except Exception as exc:  # the connection's: opened again for the next write
            failure = repr(exc)
            clients.drop(route)
        else:
            acked = time.monotonic()
            for w in writes:
                w.acked = acked
            return
        for w in writes:
            w.failure = failure

    def _bursts(self, rng: random.Random) -> None:
        """Every few seconds, writes of four to seven tables straight at the metastore, each
        on its own connection, released together."""
        self.stop.wait(rng.uniform(2, 4))
        while not self.stop.is_set():
            chosen = sorted(rng.sample(TABLES, rng.randint(4, 7)))
            held = []
            if not self.turn.acquire(timeout=10):
                continue
            try:
                for name in chosen:
                    if not self.locks[name].acquire(timeout=5):
                        break
                    held.append(name)
                else:
                    self._burst(rng, chosen)
            finally:
                for name in held:
                    self.locks[name].release()
                self.stop.wait(1.0)  # (the followers apply the burst before a refusal)
                self.turn.release()
            self.stop.wait(rng.uniform(4, 8))

    def _burst(self, rng: random.Random, names: list[str]) -> None:
        self.history.bursts += 1
        number = self.history.bursts
        clients = [Clients(self.routes) for _ in names]
        try:
            planned = [
                self._plan(rng, n, c.get(HMS), odd=False, tables_only=rng.random() < 0.7)
                for n, c in zip(names, clients, strict=True)
            ]
            start = threading.Barrier(len(names))

            def one(i: int) -> None:
                start.wait(10)
                self._send(planned[i], HMS, clients[i], burst=number)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(names))]
            for th in threads:
                th.start()
            for th in threads:
                th.join(60)
        finally:
            for c in clients:
                c.close()

    # -- Redis refusing writes -------------------------------------------------------------

    def _faults(self, rng: random.Random) -> None:
        """Every few seconds Redis refuses writes for a few, while it serves reads."""
        admin = redis.Redis.from_url(self.redis_url)
        try:
            self.stop.wait(rng.uniform(2, 4))
            while not self.stop.is_set():
                kind = rng.choice(("pause", "noreplicas"))
                seconds = rng.uniform(3.5, 5.0)
                if not self.turn.acquire(timeout=10):
                    continue
                started = time.monotonic()
                try:
                    if kind == "pause":
                        admin.execute_command("CLIENT", "PAUSE", str(int(seconds * 1000)), "WRITE")
                    else:
                        admin.config_set("min-replicas-to-write", 1)
                    time.sleep(seconds)
                finally:
                    admin.execute_command("CLIENT", "UNPAUSE")
                    admin.config_set("min-replicas-to-write", 0)
                    ended = time.monotonic()
                    time.sleep(0.5)  # (writes held through the refusal are acknowledged)
                    self.turn.release()
                self.history.add(Fault(kind, started, ended))
                self.stop.wait(rng.uniform(2, 5))
        finally:
            admin.close()


def _sweep_calls(name: str, db: str, tbl: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "get_table", {"dbname": db, "tbl_name": tbl}
    if name not in PARTITIONED:
        return
    common = {"db_name": db, "tbl_name": tbl}
    every = [pname(v) for v in VALUES]
    for names in (every, [n + " " for n in every], [every[0], every[0] + " "], [every[1] + " "]):
        yield "get_partitions_by_names", {**common, "names": names}
    for v in VALUES:
        yield "get_partition_by_name", {**common, "part_name": pname(v)}


def _tjson(cls: Any, text: str) -> Any:
    obj = cls()
    obj.read(TJSONProtocol(TMemoryBuffer(text.encode())))
    return obj


def logged(history: History, host: str, port: int, db: str, since: int) -> None:
    """Which event of the metastore's log each write became (by the counter value in the
    object after it), and which ids were given to more than one event (HMS 2.3 under
    concurrent writes)."""
    with client(host, port) as c:
        request = t.NotificationEventRequest(since, 100_000)
        events = [e for e in c.get_next_notification(request).events or [] if e.dbName == db]
    history.id_counts = Counter(e.eventId for e in events)
    for e in events:
        message = json.loads(e.message)
        if e.eventType == "ALTER_TABLE":
            after = _tjson(t.Table, message["tableObjAfterJson"])
            obj: Obj = (after.tableName,)
        elif e.eventType == "ALTER_PARTITION":
            after = _tjson(t.Partition, message["partitionObjAfterJson"])
            obj = (after.tableName, pname(after.values[0]))
        else:
            continue
        history.event_ids[(obj, int(after.parameters.get("v", "-1")))] = e.eventId


# -- the judge -----------------------------------------------------------------------------


@dataclass
class Wrong:
    read: Read
    why: str
    write: Write | None = None  # the acknowledged write the read should have seen


def bound(proxy: str, write: Write, peers: set[str]) -> float:
    """How long after ``write`` was acknowledged a read through ``proxy`` must see it."""
    if write.route == proxy:
        return 0.0
    return PEER_SLACK if {proxy, write.route} <= peers else SLACK


def judge(history: History) -> list[Wrong]:
    by_obj: dict[Obj, list[Write]] = {}
    for w in history.writes:
        by_obj.setdefault(w.obj, []).append(w)
    wrong: list[Wrong] = []
    for r in history.reads:
        if r.problem is not None:
            wrong.append(Wrong(r, r.problem))
        for obj, value in r.values.items():
            writes = by_obj.get(obj, [])
            due = [
                w
                for w in writes
                if w.acked is not None and w.acked + bound(r.proxy, w, history.peers) <= r.started
            ]
            newest = max(due, key=lambda w: w.value, default=None)
            if newest is not None and value < newest.value:
                wrong.append(
                    Wrong(r, f"{show(obj)} v={value}, older than v={newest.value}", newest)
                )
            sent = max((w.value for w in writes if w.started <= r.ended), default=0)
            if value > sent:
                wrong.append(Wrong(r, f"{show(obj)} v={value}, never written (v={sent} was)"))
    return wrong


def describe(wrong: Wrong, history: History) -> str:
    r, t0 = wrong.read, history.t0
    where = "the sweep" if r.sweep else ("a fresh connection" if r.fresh else "a kept connection")
    text = (
        f"{r.how} via {r.proxy} ({where}) at {r.started - t0:.3f}-{r.ended - t0:.3f} s: {wrong.why}"
    )
    w = wrong.write
    if w is not None and w.acked is not None:
        burst = f" in burst {w.burst}" if w.burst is not None else ""
        event = history.event_ids.get((w.obj, w.value))
        if event is not None:
            burst += f", event {event}"
            if history.id_counts[event] > 1:
                burst += f" (an id {history.id_counts[event]} events share)"
        text += (
            f"; v={w.value} was {w.how} via {w.route}{burst}, acknowledged at "
            f"{w.acked - t0:.3f} s ({r.started - w.acked:.2f} s before the read)"
        )
        faults = [f.kind for f in history.faults if _during(w, f)]
        if faults:
            text += f", while Redis refused writes ({', '.join(faults)})"
    return text


# The four shapes of issue 39, by what a wrong read and the write it missed have about them.
SHAPES = {
    1: "a write whose event shared its id with another's (HMS 2.3, concurrent writes)",
    2: "a write while Redis refused writes, read through a Redis proxy",
    3: "blanks around a database or table name (the read's or the write's)",
    4: "padded partition names in get_partitions_by_names",
}


def _during(w: Write, f: Fault) -> bool:
    return w.acked is not None and f.started - 0.25 <= w.acked <= f.ended + 0.25


def _blank(name: Any) -> bool:
    return isinstance(name, str) and name != name.strip()


def shapes(wrong: Wrong, history: History) -> tuple[int, ...]:
    """Which of :data:`SHAPES` a wrong read has about it (none: something else)."""
    r, w = wrong.read, wrong.write
    out = []
    if w is not None and history.id_counts[history.event_ids.get((w.obj, w.value), -1)] > 1:
        out.append(1)
    if w is not None and r.proxy in history.peers and any(_during(w, f) for f in history.faults):
        out.append(2)
    named = (r.args.get("dbname", r.args.get("db_name")), r.args.get("tbl_name"))
    if any(map(_blank, named)) or (w is not None and any(map(_blank, w.names))):
        out.append(3)
    if any(n.endswith(" ") for n in r.args.get("names", ())):
        out.append(4)
    return tuple(out)


def report(wrong: list[Wrong], history: History) -> str:
    """The wrong reads by the shapes they have about them, a few of each in full."""
    groups: dict[tuple[int, ...], list[Wrong]] = {}
    for w in wrong:
        groups.setdefault(shapes(w, history), []).append(w)
    lines = []
    for key, members in sorted(groups.items(), key=lambda kv: (len(kv[0]) != 1, kv[0])):
        label = " and ".join(f"shape {n} ({SHAPES[n]})" for n in key) or "none of the four"
        lines.append(f"{len(members)} with {label}:")
        lines += [f"  {describe(w, history)}" for w in members[:5]]
    return "\n".join(lines)


def caught(wrong: list[Wrong], history: History) -> dict[int, int]:
    """How many wrong reads have each shape alone about them."""
    counts = dict.fromkeys(SHAPES, 0)
    for w in wrong:
        found = shapes(w, history)
        if len(found) == 1:
            counts[found[0]] += 1
    return counts


def lags(history: History) -> dict[str, float]:
    """The longest a read was seen to return a value older than an acknowledged write's,
    after its acknowledgement, by where the write went: within the bounds when nothing is
    wrong (how close the run came to them)."""
    by_obj: dict[Obj, list[Write]] = {}
    for w in history.writes:
        if w.acked is not None:
            by_obj.setdefault(w.obj, []).append(w)
    out = dict.fromkeys(("same proxy", "same Redis", "other store", "metastore"), 0.0)
    for r in history.reads:
        for obj, value in r.values.items():
            for w in by_obj.get(obj, []):
                assert w.acked is not None
                if w.value > value and w.acked <= r.started:
                    if w.route == HMS:
                        kind = "metastore"
                    elif w.route == r.proxy:
                        kind = "same proxy"
                    elif {w.route, r.proxy} <= history.peers:
                        kind = "same Redis"
                    else:
                        kind = "other store"
                    out[kind] = max(out[kind], r.started - w.acked)
    return out
