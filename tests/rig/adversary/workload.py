"""The workload: writers, bursts of writes straight at the metastore, Redis refusing
writes, readers, and the sweep after them, each call recorded in a :class:`History`."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from hmsclient.genthrift.hive_metastore import ttypes as t

from proxy import idl
from tests.rig.adversary.connections import Client, Clients, Connections, decode
from tests.rig.adversary.database import PARTITIONED, TABLES, VALUES, Obj, pname
from tests.rig.adversary.history import HMS, Fault, History, Read, Write
from tests.rig.adversary.spellings import (
    DB_SPELLINGS,
    PARTITION_WRITES,
    SWEEP_SPELLINGS,
    TABLE_SPELLINGS,
    TABLE_WRITES,
    by_names,
    pick_spelling,
)


@dataclass
class Planned:
    news: list[tuple[Obj, int]]  # the objects written and their new values
    how: str
    names: tuple[str, str]  # the database and the table, as given
    call: Callable[[Client], None]


DECLARED = (t.MetaException, t.InvalidOperationException, t.NoSuchObjectException)


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
        # Ways no write has gone yet: the writers try each once first, so that every way is
        # exercised whatever the draws (a run once sent none of ~40 writes through one proxy).
        self.unwritten = {*self.proxies, HMS}
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
        db = pick_spelling(rng, DB_SPELLINGS, 0.8)(self.db)
        tbl = pick_spelling(rng, TABLE_SPELLINGS, 0.7)(name)
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
                    untried = sorted(self.unwritten)
                    if untried:
                        route = rng.choice(untried)
                    else:
                        weights = [2] * len(self.proxies) + [3]
                        (route,) = rng.choices([*self.proxies, HMS], weights=weights)
                    self.unwritten.discard(route)
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
