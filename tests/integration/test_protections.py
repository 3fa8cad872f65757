"""The worst day of a metastore, on a real one: a table of 100,000 partitions, 20 clients of
one user fetching all of it at once while 50 clients of other users make small calls
(tests/rig/protection_load.py). With the protections on, the whole-table fetches are refused
with the HMS's own message, the small callers are served as in a quiet run, and the
metastore's heap stays where it was; heavy calls that are let through go one at a time, and
a reply too big for a client is a clear error, sent to the metastore once.

What the same load does with the protections off (the heap, the small callers' p99, the
errors) is recorded side by side in docs/reliability.md (bench/protections.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hmsclient.genthrift.hive_metastore import ttypes as t

from tests.rig.bulk_partitions import COLUMNS, BulkTable, make_partitioned_table
from tests.rig.hms import MetastoreServer
from tests.rig.protection_load import SUMMARY_HEAD, Client, LoadResult, run_load, summary
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import TEXT, client, partition, storage_descriptor, table

pytestmark = [pytest.mark.hms, pytest.mark.whole_machine]

DB, HUGE = "worst", "events"
PARTITIONS = 100_000
LIMIT = 50_000  # --max-partitions-per-call
SMALL = [f"small{i}" for i in range(10)]
HEAP_BOUND = 128 << 20  # the loaded run's heap peak, above the quiet run's
ROOMY = ["--cache", "off", "--upstream-max-idle", "64", "--log-level", "warning"]


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MetastoreServer, BulkTable]]:
    with MetastoreServer(tmp_path_factory.mktemp("worst-day-hms")) as server:
        made = make_partitioned_table(server, DB, HUGE, PARTITIONS)
        with client(server.host, server.port) as c:
            for name in SMALL:
                location = f"{server.warehouse.as_uri()}/{DB}.db/{name}"
                c.create_table(table(DB, name, storage_descriptor(location, COLUMNS), keys=["ds"]))
                c.add_partitions(
                    [
                        partition(
                            DB,
                            name,
                            [f"p{i:06d}"],
                            storage_descriptor(f"{location}/ds=p{i:06d}", COLUMNS, stored_as=TEXT),
                        )
                        for i in range(2)
                    ]
                )
        yield server, made


def load(
    server: MetastoreServer, proxy: ProxyProcess, heavy: int, seconds: float = 10
) -> LoadResult:
    """The load of tests/rig/protection_load.py: 50 small callers, a call every half second
    each (~1,000 calls a run: the p99 is the tenth slowest, not the fourth)."""
    assert server.process is not None
    process = server.process
    return run_load(
        proxy.port,
        process.pid,
        lambda: process.poll() is None,
        DB,
        HUGE,
        SMALL,
        heavy=heavy,
        small=50,
        seconds=seconds,
        pause=0.5,
    )


def test_one_users_whole_table_fetches_are_refused_and_everyone_else_is_served_as_in_quiet(
    huge: tuple[MetastoreServer, BulkTable], tmp_path: Path
) -> None:
    server, _ = huge
    args = [*ROOMY, "--max-partitions-per-call", str(LIMIT), "--heavy-max-concurrent", "1"]
    proxy = ProxyProcess(tmp_path, server.uri, *args).start()
    try:
        load(server, proxy, heavy=0, seconds=4)  # (warm: connections made, code compiled)
        quiet = load(server, proxy, heavy=0)
        loaded = load(server, proxy, heavy=20)
        refused = proxy.metric(
            "hmsproxy_refused_calls_total", reason="partitions_per_call", group="default"
        )
        counts = proxy.metric_sum("hmsproxy_partition_count_queries_total")
    finally:
        proxy.stop()
    print(f"\n{SUMMARY_HEAD}\n{summary('quiet', quiet)}\n{summary('protected', loaded)}")
    # Refused on purpose, each with the metastore's own words, never sent.
    assert loaded.heavy_outcomes == {"refused": 20}
    message = (
        f"Number of partitions scanned (={PARTITIONS}) on table '{DB}.{HUGE}' exceeds limit "
        f"(={LIMIT}). This is controlled on the metastore server by hms-cache-proxy "
        "--max-partitions-per-call."
    )
    assert set(loaded.texts) == {message[:160]}
    assert refused == 20
    assert counts == 1  # one COUNT query for the twenty (kept --partition-count-ttl)
    # Everyone else: nothing failed, and no slower than in a quiet run.
    for run in (quiet, loaded):
        assert set(run.small_outcomes) == {"ok"} and len(run.small) > 500
    assert loaded.p99() <= 2 * quiet.p99(), (loaded.p99(), quiet.p99())
    # The metastore never built the 52 MB replies: its heap is where the quiet run left it.
    assert loaded.heap_peak <= quiet.heap_peak + HEAP_BOUND, (loaded.heap_peak, quiet.heap_peak)
    assert loaded.metastore_alive


def test_heavy_calls_go_one_at_a_time_and_a_reply_too_big_is_a_clear_error_sent_once(
    huge: tuple[MetastoreServer, BulkTable], tmp_path: Path
) -> None:
    server, made = huge
    # 12,000 partitions are ~6 MB (522 bytes each), 20,000 are ~10 MB: over the 8 MiB here.
    args = [*ROOMY, "--heavy-partitions", "10000", "--heavy-max-concurrent", "1"]
    args += ["--max-reply-bytes", "8MiB"]
    proxy = ProxyProcess(tmp_path, server.uri, *args).start()
    try:
        results: list[tuple[str, str, int | None]] = []
        lock = threading.Lock()

        def fetch(first: int) -> None:
            c = Client(proxy.port, "etl", 300)
            try:
                got = c.call(
                    "get_partitions_by_filter",
                    db_name=DB,
                    tbl_name=HUGE,
                    filter=f'ds >= "{made.value(first)}"',
                    max_parts=-1,
                )
            finally:
                c.close()
            with lock:
                results.append(got)

        threads = [threading.Thread(target=fetch, args=(PARTITIONS - 12_000,)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert [r[0] for r in results] == ["ok"] * 3
        assert [r[2] for r in results] == [12_000] * 3
        waited = proxy.metric("hmsproxy_upstream_wait_seconds_count", kind="heavy", group="default")
        assert waited == 2  # one at the metastore at a time: the others waited their turn
        assert proxy.metric("hmsproxy_heavy_calls_in_flight") == 0
        # Too big for the client: a MetaException naming the table and its size, at once.
        fetch(PARTITIONS - 20_000)
        outcome, text, _ = results[-1]
        assert outcome == "refused"
        assert f"of table '{DB}.{HUGE}' (20000 partitions) is larger than 8388608 bytes" in text
        method = "get_partitions_by_filter"
        assert proxy.metric("hmsproxy_upstream_requests_total", method=method,
                            outcome="reply_too_large") == 1  # fmt: skip
        assert (
            proxy.metric("hmsproxy_refused_calls_total", reason="reply_too_large", group="default")
            == 1
        )
        # The client's connection is fine: its next call is answered.
        c = Client(proxy.port, "etl", 60)
        try:
            assert c.call("get_table", dbname=DB, tbl_name=HUGE)[0] == "ok"
        finally:
            c.close()
    finally:
        proxy.stop()
    with client(server.host, server.port) as c:  # (the table is as it was)
        assert c.get_num_partitions_by_filter(DB, HUGE, "") == PARTITIONS
        assert isinstance(c.get_table(DB, HUGE), t.Table)


def test_a_users_rate_and_the_audit_log_on_a_real_metastore(
    huge: tuple[MetastoreServer, BulkTable], tmp_path: Path
) -> None:
    """A group's calls per second refuse a user's misses past its bucket while its hits stay
    free, and every call, hits answered at once included, is a line of the audit log."""
    server, _ = huge
    limits = tmp_path / "limits.toml"
    limits.write_text('[groups.adhoc]\nusers = ["analyst0"]\ncalls_per_second = 1\n')
    audit = tmp_path / "audit.log"
    args = ["--limits-file", str(limits), "--audit-log", str(audit), "--log-level", "warning"]
    proxy = ProxyProcess(tmp_path, server.uri, *args).start()
    try:
        c = Client(proxy.port, "analyst0", 60)
        try:
            got = [c.call("get_table", dbname=DB, tbl_name=SMALL[0]) for _ in range(4)]
            got.append(c.call("get_table", dbname=DB, tbl_name=SMALL[1]))
        finally:
            c.close()
        refused = proxy.metric("hmsproxy_refused_calls_total", reason="calls_rate", group="adhoc")
    finally:
        proxy.stop()  # (the audit log's last lines written)
    assert [outcome for outcome, _, _ in got] == ["ok"] * 4 + ["refused"]
    assert "user analyst0 (group adhoc) is over its 1 calls per second" in got[-1][1]
    assert refused == 1
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    calls = [line for line in lines if line["method"] == "get_table"]
    assert [(line["cache"], line["outcome"]) for line in calls] == [
        ("miss", "ok"),
        ("hit", "ok"),
        ("hit", "ok"),
        ("hit", "ok"),
        ("miss", "refused"),
    ]
    assert {(line["user"], line["address"], line["db"]) for line in calls} == {
        ("analyst0", "127.0.0.1", DB)
    }
    assert [line["table"] for line in calls] == [SMALL[0]] * 4 + [SMALL[1]]
    assert all(line["bytes"] > 0 for line in calls)
