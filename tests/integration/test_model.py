"""Randomised model test: through the proxy, every read always equals the same read made
directly at the HMS, whatever writes came before.

A seeded random sequence of writes (databases, tables, renames, partitions, statistics) goes
through the proxy; after every write, a battery of reads (existing and missing objects) is
made both through the proxy and directly, and the raw replies must be byte-identical. The
battery runs twice per step, so the second round is served from the cache wherever the
cache holds the answer. Run against the embedded cache, a single Redis and a 3-node Redis
Cluster; with Redis, a second proxy on the same store (versions kept in process, coherent
through Redis's invalidations) answers every read too, and must equal the HMS within the
invalidation's bound (--redis-tracking-max-lag) after a write made through the first.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig import sample as build
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisCluster, RedisServer

pytestmark = pytest.mark.hms

STEPS = int(os.environ.get("MODEL_STEPS", "45"))
DAYS = [f"2024-02-{d:02d}" for d in range(1, 9)]
M = idl.module()
MAX_LAG = 1.0  # --redis-tracking-max-lag of the proxies: the bound on the second one


@dataclass
class World:
    """What the model knows exists (to pick targets; the HMS itself is the oracle)."""

    prefix: str
    dbs: dict[str, dict[str, set[str] | None]] = field(default_factory=dict)  # table -> days
    counter: int = 0

    def fresh(self, kind: str) -> str:
        self.counter += 1
        return f"{self.prefix}_{kind}{self.counter}"


def _sd() -> Any:
    return build.storage_descriptor(None, (("id", "bigint"), ("name", "string")), M, build.TEXT)


class Model:
    def __init__(
        self,
        hms: MetastoreServer,
        proxy: ProxyProcess,
        seed: int,
        prefix: str,
        other: ProxyProcess | None = None,
    ) -> None:
        self.hms = hms
        self.proxy = proxy
        self.rng = random.Random(seed)
        self.world = World(prefix)
        self.seqid = 0
        self.via = raw.RawConnection("127.0.0.1", proxy.port)
        self.direct = raw.RawConnection(hms.host, hms.port)
        self.other = raw.RawConnection("127.0.0.1", other.port) if other is not None else None
        self.mismatches: list[str] = []
        self.late = 0  # reads through the other proxy that were right only after a retry
        self.slowest = 0.0
        self.wrote_through_other = False
        # The metastore's answers since the last write, by request (seqid zeroed): with no
        # write between, it answers the same call with the same bytes but for the seqid,
        # which it echoes, so the second battery of a step asks it nothing again (the
        # proxies still get a new seqid each time). Cleared by every write.
        self.answers: dict[bytes, bytes] = {}

    def close(self) -> None:
        self.via.close()
        self.direct.close()
        if self.other is not None:
            self.other.close()

    # -- calls ---------------------------------------------------------------------------

    def call(self, method: str, **args: Any) -> bytes:
        """A write, through either proxy (the model then holds the writer to its own write at
        once, and the other proxy within the bound)."""
        self.seqid += 1
        self.answers.clear()
        self.wrote_through_other = self.other is not None and self.rng.random() < 0.5
        through = self.other if self.wrote_through_other and self.other is not None else self.via
        return through.call(idl.encode_call(method, self.seqid, **args))

    def compare(self, method: str, **args: Any) -> None:
        self.seqid += 1
        request = idl.encode_call(method, self.seqid, **args)
        key = raw.without_seqid(request)
        known = self.answers.get(key)
        if known is None:
            direct = self.direct.call(request)
            self.answers[key] = direct
        else:
            direct = raw.with_seqid(known, self.seqid)
        proxied = self.via.call(request)

        # Byte for byte, except get_partitions_by_names assembled from partitions cached from
        # other requests: those carry the HMS's bytes from that other request, and the HMS
        # orders a partition's parameter map differently from request to request.
        def same(proxied: bytes) -> bool:
            if method == "get_partitions_by_names":
                return raw.same_result(method, proxied, direct)
            return proxied == direct

        # The same call at once again on the same connection: answered, if the first was a
        # hit answered at once, from that hit (proxy.handler.again); held to the same rule.
        at_once = self.other is None or not self.wrote_through_other
        if at_once and not same(self.via.call(request)):
            self.mismatches.append(f"asked again: {method}({args})")
        if self.other is None:
            if not same(proxied):
                self.mismatches.append(f"{method}({args})")
            return
        # The writing proxy must answer with the write at once; the other within the bound.
        other = self.other.call(request)
        at_writer, at_bystander = (other, proxied) if self.wrote_through_other else (proxied, other)
        bystander = self.via if self.wrote_through_other else self.other
        if not same(at_writer):
            self.mismatches.append(f"writing proxy: {method}({args})")
        started = time.monotonic()
        deadline = started + MAX_LAG + 0.5  # the bound, and the time to ask again
        while not same(at_bystander):
            if time.monotonic() > deadline:
                self.mismatches.append(f"other proxy: {method}({args})")
                return
            time.sleep(0.01)
            self.late += 1
            at_bystander = bystander.call(request)
        self.slowest = max(self.slowest, time.monotonic() - started)

    def table_object(self, db: str, table: str) -> Any:
        reply = raw.call(
            self.hms.host, self.hms.port, idl.encode_call("get_table", 1, dbname=db, tbl_name=table)
        )
        return idl.decode_result("get_table", reply[12 + len("get_table") :]).success

    def partition_object(self, db: str, table: str, day: str) -> Any:
        reply = raw.call(
            self.hms.host,
            self.hms.port,
            idl.encode_call("get_partition", 1, db_name=db, tbl_name=table, part_vals=[day]),
        )
        return idl.decode_result("get_partition", reply[12 + len("get_partition") :]).success

    # -- writes --------------------------------------------------------------------------

    def pick_table(self, partitioned: bool | None = None) -> tuple[str, str] | None:
        choices = [
            (db, t)
            for db, tables in self.world.dbs.items()
            for t, days in tables.items()
            if partitioned is None or (days is not None) == partitioned
        ]
        return self.rng.choice(sorted(choices)) if choices else None

    def create_database(self) -> None:
        name = self.world.fresh("db")
        self.call("create_database", database=M.Database(name, "model", None, {"k": "v"}))
        self.world.dbs[name] = {}

    def drop_database(self) -> None:
        if len(self.world.dbs) < 2:
            return self.create_database()
        db = self.rng.choice(sorted(self.world.dbs))
        self.call("drop_database", name=db, deleteData=True, cascade=True)
        del self.world.dbs[db]

    def alter_database(self) -> None:
        db = self.rng.choice(sorted(self.world.dbs))
        self.call(
            "alter_database",
            dbname=db,
            db=M.Database(
                db, f"described {self.rng.random()}", None, {"k": str(self.rng.random())}
            ),
        )

    def create_table(self) -> None:
        db = self.rng.choice(sorted(self.world.dbs))
        name = self.world.fresh("t")
        partitioned = self.rng.random() < 0.7
        keys = ("ds",) if partitioned else ()
        table = build.table(
            db, name, _sd(), keys=keys, parameters={"p": "1"}, owner="model", types=M
        )
        self.call("create_table", tbl=table)
        self.world.dbs[db][name] = set() if partitioned else None

    def drop_table(self) -> None:
        target = self.pick_table()
        if target is None:
            return self.create_table()
        db, name = target
        self.call("drop_table", dbname=db, name=name, deleteData=True)
        del self.world.dbs[db][name]

    def alter_table(self) -> None:
        target = self.pick_table()
        if target is None:
            return self.create_table()
        db, name = target
        table = self.table_object(db, name)
        table.parameters["p"] = str(self.rng.randint(0, 10**6))
        if self.rng.random() < 0.25:  # a rename
            new = self.world.fresh("t")
            table.tableName = new
            self.world.dbs[db][new] = self.world.dbs[db].pop(name)
        self.call(
            "alter_table_with_environment_context",
            dbname=db,
            tbl_name=name,
            new_tbl=table,
            environment_context=None,
        )

    def add_partitions(self) -> None:
        target = self.pick_table(partitioned=True)
        if target is None:
            return self.create_table()
        db, name = target
        days = self.world.dbs[db][name]
        assert days is not None
        new = [d for d in DAYS if d not in days][: self.rng.randint(1, 3)]
        if not new:
            return self.drop_partition()
        parts = [build.partition(db, name, [d], _sd(), {"n": "0"}, types=M) for d in new]
        self.call("add_partitions", new_parts=parts)
        days.update(new)

    def drop_partition(self) -> None:
        target = self.pick_table(partitioned=True)
        if target is None or not self.world.dbs[target[0]][target[1]]:
            return self.add_partitions() if target else self.create_table()
        db, name = target
        days = self.world.dbs[db][name]
        assert days is not None
        day = self.rng.choice(sorted(days))
        self.call("drop_partition", db_name=db, tbl_name=name, part_vals=[day], deleteData=True)
        days.discard(day)

    def alter_partition(self) -> None:
        target = self.pick_table(partitioned=True)
        if target is None or not self.world.dbs[target[0]][target[1]]:
            return self.add_partitions() if target else self.create_table()
        db, name = target
        day = self.rng.choice(sorted(self.world.dbs[db][name] or ()))
        part = self.partition_object(db, name, day)
        part.parameters["n"] = str(self.rng.randint(0, 10**6))
        self.call("alter_partition", db_name=db, tbl_name=name, new_part=part)

    def update_statistics(self) -> None:
        target = self.pick_table()
        if target is None:
            return self.create_table()
        db, name = target
        days = self.world.dbs[db][name]
        stats = M.ColumnStatisticsObj(
            "id",
            "bigint",
            M.ColumnStatisticsData(
                longStats=M.LongColumnStatsData(0, self.rng.randint(1, 999), 0, 5)
            ),
        )
        if days:
            day = self.rng.choice(sorted(days))
            desc = M.ColumnStatisticsDesc(False, db, name, f"ds={day}")
            self.call(
                "update_partition_column_statistics", stats_obj=M.ColumnStatistics(desc, [stats])
            )
        elif days is None:
            desc = M.ColumnStatisticsDesc(True, db, name)
            self.call("update_table_column_statistics", stats_obj=M.ColumnStatistics(desc, [stats]))

    WRITES = (
        (create_database, 1),
        (drop_database, 1),
        (alter_database, 1),
        (create_table, 3),
        (drop_table, 2),
        (alter_table, 3),
        (add_partitions, 5),
        (drop_partition, 3),
        (alter_partition, 4),
        (update_statistics, 4),
    )

    def step(self) -> None:
        writes, weights = zip(*self.WRITES, strict=True)
        self.rng.choices(writes, weights)[0](self)

    # -- reads ---------------------------------------------------------------------------

    def battery(self) -> None:
        c = self.compare
        c("get_all_databases")
        c("get_databases", pattern=f"{self.world.prefix}*")
        for db, tables in sorted(self.world.dbs.items()):
            c("get_database", name=db)
            c("get_all_tables", db_name=db)
            c("get_tables", db_name=db, pattern="*t*")
            c("get_table", dbname=db, tbl_name="never_created")
            for name, days in sorted(tables.items()):
                c("get_table", dbname=db, tbl_name=name)
                c("get_table_req", req=M.GetTableRequest(dbName=db, tblName=name))
                c("get_fields", db_name=db, table_name=name)
                if days is None:
                    c("get_table_statistics_req", request=M.TableStatsRequest(db, name, ["id"]))
                    continue
                names = [f"ds={d}" for d in DAYS]
                some = self.rng.sample(names, 4)
                c("get_partition_names", db_name=db, tbl_name=name, max_parts=-1)
                c("get_partition_names_ps", db_name=db, tbl_name=name, part_vals=[""], max_parts=-1)
                c("get_partitions", db_name=db, tbl_name=name, max_parts=-1)
                c(
                    "get_partitions_by_filter",
                    db_name=db,
                    tbl_name=name,
                    filter='ds >= "2024-02-04"',
                    max_parts=-1,
                )
                c("get_partitions_by_names", db_name=db, tbl_name=name, names=some)
                c("get_partitions_by_names", db_name=db, tbl_name=name, names=names)
                c("get_partition", db_name=db, tbl_name=name, part_vals=[self.rng.choice(DAYS)])
                c(
                    "get_partition_with_auth",
                    db_name=db,
                    tbl_name=name,
                    part_vals=[DAYS[0]],
                    user_name="u",
                    group_names=["g"],
                )
                c(
                    "get_partitions_statistics_req",
                    request=M.PartitionsStatsRequest(db, name, ["id"], some),
                )
        c("get_database", name="never_created_db")


@pytest.fixture(params=["embedded", "redis", "cluster"])
def store_args(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    if request.param == "embedded":
        yield []
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        yield ["--redis", server.url, "--redis-key-prefix", f"model-{os.getpid()}-{id(request)}:"]
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        yield ["--redis", cluster.url, "--redis-key-prefix", f"model-{os.getpid()}-{id(request)}:"]


def test_reads_through_the_proxy_equal_reads_at_the_hms(
    hms: MetastoreServer,
    proxy_factory: ProxyFactory,
    store_args: list[str],
    request: pytest.FixtureRequest,
) -> None:
    lag = ["--redis-tracking-max-lag", str(MAX_LAG)]
    proxy = proxy_factory(*store_args, "--redis-timeout", "1", *lag)
    other = proxy_factory(*store_args, "--redis-timeout", "1", *lag) if store_args else None
    seed = int(os.environ.get("MODEL_SEED", "20261129")) + len(store_args)
    kind = request.node.callspec.params["store_args"] if hasattr(request.node, "callspec") else "x"
    prefix = f"model_{kind}_{random.randrange(10**6)}"
    model = Model(hms, proxy, seed, prefix=prefix, other=other)
    try:
        model.create_database()
        for _ in range(STEPS):
            model.step()
            model.battery()
            model.battery()  # now from the cache where it can be
            assert model.mismatches == [], f"seed {seed}: {model.mismatches[:5]}"
    finally:
        model.close()
        for db in list(model.world.dbs):
            raw.call(
                hms.host,
                hms.port,
                idl.encode_call("drop_database", 1, name=db, deleteData=True, cascade=True),
            )
    hits = proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit")
    misses = proxy.metric_sum("hmsproxy_cache_lookups_total", result="miss")
    assert hits > misses  # the cache really answered most of it
    assert proxy.metric("hmsproxy_cache_errors_total", operation="get") == 0
    assert "Traceback" not in proxy.log()
    if other is not None:
        # The second proxy's hits read their versions in process (no Redis round trip).
        local = other.metric("hmsproxy_cache_version_reads_total", source="local")
        assert local > other.metric("hmsproxy_cache_version_reads_total", source="redis")
        assert "Traceback" not in other.log()
        print(f"other proxy: {model.late} retries, slowest {model.slowest * 1000:.1f} ms")
