"""Redis refuses writes but still serves reads: no proxy serves what a write changed.

Each way a real ``redis-server`` refuses writes while it answers reads: paused for writes
(``CLIENT PAUSE WRITE``), too few replicas (NOREPLICAS), a failed save (MISCONF), a primary
demoted to a replica (READONLY), out of memory under ``noeviction`` (OOM). Two proxies share
it in front of the real metastore; one has the table cached, the other takes the write (and
a lock) while Redis refuses. The reader must answer the writer's change at once after the
writer's reply, and serve hits again once Redis takes writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.conftest import ProxyFactory
from tests.rig.hms import MetastoreServer
from tests.rig.locking import Endpoint, create_table
from tests.rig.ports import free_port
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms

DB = "refusals"

Refusal = tuple[Callable[[redis.Redis], None], Callable[[redis.Redis], None]]


def _failed_save(r: redis.Redis) -> None:
    r.config_set("save", "3600 1")
    r.config_set("dir", "/proc")  # no rdb file can be made here, not even by root
    r.bgsave()
    eventually(
        lambda: r.info("persistence")["rdb_last_bgsave_status"] == "err",
        10,
        "the background save to fail",
    )


def _save_again(r: redis.Redis, workdir: Path) -> None:
    r.config_set("dir", str(workdir))
    r.config_set("stop-writes-on-bgsave-error", "no")
    r.config_set("save", "")


REFUSALS: dict[str, Callable[[Path], Refusal]] = {
    "pause": lambda _: (
        lambda r: r.execute_command("CLIENT", "PAUSE", "60000", "WRITE"),
        lambda r: r.execute_command("CLIENT", "UNPAUSE"),
    ),
    "noreplicas": lambda _: (
        lambda r: r.config_set("min-replicas-to-write", 1),
        lambda r: r.config_set("min-replicas-to-write", 0),
    ),
    "misconf": lambda workdir: (_failed_save, lambda r: _save_again(r, workdir)),
    "readonly": lambda _: (
        lambda r: r.execute_command("REPLICAOF", "127.0.0.1", str(free_port())),
        lambda r: r.execute_command("REPLICAOF", "NO", "ONE"),
    ),
    "oom": lambda _: (
        lambda r: r.config_set("maxmemory", 1),
        lambda r: r.config_set("maxmemory", 0),
    ),
}


def _hits(proxy: ProxyProcess) -> float:
    return proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="hit")


@pytest.mark.parametrize(
    ("refusal", "tracking"),
    [(name, "on") for name in REFUSALS] + [("noreplicas", "off")],
)
def test_no_proxy_serves_a_write_redis_refused(
    refusal: str,
    tracking: str,
    lock_hms: MetastoreServer,
    lock_proxy_factory: ProxyFactory,
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "redis"
    server = RedisServer(workdir, None, "--enable-protected-configs", "yes")
    server.start()
    table = f"t_{refusal}_{tracking}"
    try:
        hms = Endpoint(lock_hms.host, lock_hms.port)
        create_table(hms, lock_hms.warehouse.as_uri(), DB, table)
        args = ("--redis", server.url, "--notifications", "off", "--ttl-table", "600")
        writer = lock_proxy_factory(*args, "--redis-tracking", tracking)
        reader = lock_proxy_factory(*args, "--redis-tracking", tracking)
        through_writer = Endpoint("127.0.0.1", writer.port)
        through_reader = Endpoint("127.0.0.1", reader.port)

        def reader_serves_a_hit() -> bool:
            before = _hits(reader)
            served = through_reader.table_reply(DB, table)
            return _hits(reader) > before and served == hms.table_reply(DB, table)

        eventually(reader_serves_a_hit, 10, "the reader to serve the table from the cache")
        refuse, allow = REFUSALS[refusal](workdir)
        admin = redis.Redis.from_url(server.url)
        try:
            refuse(admin)
            started = time.monotonic()
            through_writer.set_parameter(DB, table, "during", refusal)
            held = time.monotonic() - started
            # The writer's reply came only once every proxy had stopped reading from Redis.
            assert through_reader.table_reply(DB, table) == hms.table_reply(DB, table)
            assert through_reader.table(DB, table).parameters["during"] == refusal
            lock = through_writer.lock(DB, table)
            assert lock.state == 1  # ACQUIRED: held while fenced, then granted
            through_writer.unlock(lock.lockid)
            assert through_reader.table_reply(DB, table) == hms.table_reply(DB, table)
        finally:
            allow(admin)
            admin.close()
        assert held >= 2.0, f"the write went ahead after {held:.2f} s, before peers distrusted"
        # Writes are taken again: the writer's pending invalidations land, then hits resume.
        eventually(reader_serves_a_hit, 15, "the reader to serve hits again")
        through_writer.set_parameter(DB, table, "after", refusal)
        eventually(
            lambda: through_reader.table(DB, table).parameters.get("after") == refusal,
            5,
            "a write after the refusal to be seen through the other proxy",
        )
    finally:
        server.stop()
