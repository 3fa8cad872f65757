"""The catalog knows every method of Hive 2.3, 3.1, 4.0.1 and 4.2.1 (tests/data/hms_methods),
and what a Hive 4 cluster sends by itself never flushes the cache."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from proxy import catalog, idl
from proxy.cache.engine import CacheEngine
from proxy.cache.keys import CATALOG_TAG, EPOCH, Naming, TableRef, partition_field
from proxy.cache.plan import FLUSH, WritePlan
from proxy.cache.planner import Planner, Ttls
from proxy.cache.store import MemoryStore
from proxy.catalog import Kind, MethodSpec, Scope
from proxy.handler.writes import READ_PREFIXES
from proxy.metrics import Metrics
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.framing import Message
from tests.unit.inprocess import message, request

DATA = Path(__file__).resolve().parents[1] / "data" / "hms_methods"
VERSIONS = ("hive-2.3", "hive-3.1", "hive-4.0.1", "hive-4.2.1")
M = idl.module()
NAMING = Naming()
PLANNER = Planner(NAMING, Ttls(), per_user=False)


def methods_of(version: str) -> list[str]:
    lines = (DATA / f"{version}.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def header_of(version: str) -> str:
    lines = (DATA / f"{version}.txt").read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


def engine() -> CacheEngine:
    return CacheEngine(
        MemoryStore(1 << 20), PLANNER, Metrics(), l1_bytes=1 << 20, max_entry_bytes=1 << 20
    )


def call(method: str, **args: Any) -> Message:
    """A client's call: encoded through the IDL where it declares the method, else a call with
    no arguments (the proxy forwards those as bytes and never decodes them)."""
    if method in idl.method_names():
        return request(method, 1, **args)
    assert not args
    return message(encode_header(method, MessageType.CALL, 1) + b"\x00")


def handler_plan(method: str, msg: Message) -> WritePlan | None:
    """What proxy.handler.writes does with a call: None for one forwarded as a read."""
    spec = catalog.lookup(method)
    if spec is None:
        return None if method.startswith(READ_PREFIXES) else FLUSH
    if spec.kind is not Kind.WRITE:
        return None
    return engine().plan_write(spec, msg)


def bumped(plan: WritePlan) -> set[tuple[str, str]]:
    return {(b.key, b.field) for b in plan.bumps}


def versions(tag: str) -> str:
    return NAMING.versions(tag)


# -- the lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_each_list_names_its_source_and_is_sorted(version: str) -> None:
    assert "Source:" in header_of(version)
    names = methods_of(version)
    assert names == sorted(set(names))
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names)


def test_the_lists_agree_with_what_is_known_of_the_versions() -> None:
    v23, v31, v401, v421 = (set(methods_of(v)) for v in VERSIONS)
    assert len(v23) == 154 and len(v401) == 280 and len(v421) == 284
    assert v23 - v31 == {n for n in v23 if "index" in n}  # indexes went in Hive 3.0
    assert v31 - v401 == {"get_table", "get_table_objects_by_name"}  # HIVE-26537
    assert v421 - v401 == {
        "delete_column_statistics_req",
        "get_databases_req",
        "get_functions_req",
        "get_replayed_txns_for_policy",
    }
    assert v401 <= v421
    assert v23 <= idl.method_names()  # the 2.3 part of the IDL is checked against the jar


@pytest.mark.parametrize("version", VERSIONS)
def test_every_method_of_every_version_has_an_entry(version: str) -> None:
    missing = [n for n in methods_of(version) if catalog.lookup(n) is None]
    assert not missing


def test_the_catalog_knows_no_method_that_is_neither_declared_nor_hives() -> None:
    listed = set().union(*(methods_of(v) for v in VERSIONS))
    invented = [
        s.name
        for s in catalog.all_methods()
        if s.name not in idl.method_names() and s.name not in listed
    ]
    assert not invented


# -- calls that read like look-ups but change server state -------------------------------------

CLAIMS = (
    "find_next_compact",
    "find_next_compact2",
    "get_lock_materialization_rebuild",
    "scheduled_query_poll",
)


@pytest.mark.parametrize("name", CLAIMS)
def test_read_looking_calls_that_take_something_are_state_never_retried(name: str) -> None:
    spec = catalog.lookup(name)
    assert spec is not None
    assert spec.kind is Kind.WRITE and spec.scope == Scope.NONE and not spec.targets
    assert not spec.retryable and not spec.flushes
    assert engine().plan_write(spec, call(name)).empty


# -- what a Hive 4 cluster sends by itself -----------------------------------------------------

# The compaction worker (HiveServer2), its transaction, and the Initiator's requests.
COMPACTION_WORKER = {
    "find_next_compact": {},
    "find_next_compact2": {},
    "update_compactor_state": {},
    "find_columns_with_stats": {},
    "set_hadoop_jobid": {},
    "mark_compacted": {},
    "mark_failed": {},
    "mark_refused": {},
    "mark_cleaned": {},
    "submit_for_cleanup": {},
    "update_compaction_metrics_data": {},
    "remove_compaction_metrics_data": {},
    "get_latest_committed_compaction_info": {},
    "abort_Compactions": {},
    "compact2": {"rqst": M.CompactionRequest("sales", "orders", "ds=2024-01-01", 2)},
    "show_compact": {"rqst": M.ShowCompactRequest()},
    "open_txns": {"rqst": M.OpenTxnRequest(num_txns=1, user="hive", hostname="hs2")},
    "allocate_table_write_ids": {
        "rqst": M.AllocateTableWriteIdsRequest(dbName="sales", tableName="orders", txnIds=[7])
    },
    "get_valid_write_ids": {"rqst": M.GetValidWriteIdsRequest(fullTableNames=["sales.orders"])},
    "heartbeat": {"ids": M.HeartbeatRequest(txnid=7)},
    "commit_txn": {"rqst": M.CommitTxnRequest(txnid=7)},
    "abort_txn": {"rqst": M.AbortTxnRequest(txnid=7)},
}
# The scheduled-query executor (HiveServer2).
SCHEDULED_QUERIES = {
    "scheduled_query_poll": {},
    "scheduled_query_progress": {},
    "get_scheduled_query": {},
}
# Transaction and write-id housekeeping, materialized-view rebuilds, replication's bookkeeping.
HOUSEKEEPING = {
    "add_write_ids_to_min_history": {},
    "get_open_txns_req": {},
    "get_latest_txnid_in_conflict": {},
    "get_max_allocated_table_write_id": {},
    "heartbeat_txn_range": {"txns": M.HeartbeatTxnRangeRequest(min=1, max=9)},
    "seed_write_id": {},
    "seed_txn_id": {},
    "repl_tbl_writeid_state": {},
    "get_replayed_txns_for_policy": {},
    "add_replication_metrics": {},
    "add_runtime_stats": {},
    "get_lock_materialization_rebuild": {},
    "heartbeat_lock_materialization_rebuild": {},
    # Not background, but after every ACID write of a Hive 4 HiveServer2 (see below).
    "update_transaction_statistics": {},
}
BACKGROUND = {**COMPACTION_WORKER, **SCHEDULED_QUERIES, **HOUSEKEEPING}


def test_the_background_calls_are_hive_4_methods() -> None:
    assert set(BACKGROUND) <= set(methods_of("hive-4.2.1"))


@pytest.mark.parametrize("name", sorted(BACKGROUND))
def test_no_background_call_of_a_hive_4_cluster_flushes_or_invalidates(name: str) -> None:
    spec = catalog.lookup(name)
    assert spec is not None, f"{name} is unknown: the handler would flush or forward blindly"
    plan = handler_plan(name, call(name, **BACKGROUND[name]))
    assert plan is None or plan.empty, plan
    if spec.kind is Kind.WRITE:
        assert not spec.retryable


# -- ACID writes -------------------------------------------------------------------------------

ORDERS = TableRef.of("sales", "orders")


def test_a_commit_without_write_events_changes_nothing_cached() -> None:
    spec = catalog.lookup("commit_txn")
    assert spec is not None and spec.kind is Kind.WRITE and not spec.retryable
    assert engine().plan_write(spec, call("commit_txn", rqst=M.CommitTxnRequest(txnid=7))).empty
    empty_list = M.CommitTxnRequest(txnid=7, writeEventInfos=[])
    assert engine().plan_write(spec, call("commit_txn", rqst=empty_list)).empty


def test_a_replicated_commit_invalidates_the_partitions_it_wrote() -> None:
    spec = catalog.lookup("commit_txn")
    assert spec is not None
    events = [
        M.WriteEventInfo(1, "sales", "orders", "f1", "ds=2024-01-01"),
        M.WriteEventInfo(1, "sales", "orders", "f2", "ds=2024-01-02"),
    ]
    plan = engine().plan_write(spec, call("commit_txn", rqst=M.CommitTxnRequest(7, None, events)))
    assert not plan.flush_all
    key = versions(ORDERS.tag)
    assert {(key, partition_field(("2024-01-01",))), (key, partition_field(("2024-01-02",)))} <= (
        bumped(plan)
    )
    assert (key, "table") not in bumped(plan)


def test_a_replicated_commit_whose_events_name_no_database_flushes() -> None:
    spec = catalog.lookup("commit_txn")
    assert spec is not None
    events = [M.WriteEventInfo(writeId=1, table="orders", files="f1")]
    msg = call("commit_txn", rqst=M.CommitTxnRequest(7, None, events))
    assert engine().plan_write(spec, msg).flush_all


def test_write_notifications_invalidate_the_partitions_whose_files_changed() -> None:
    data = M.InsertEventRequestData(filesAdded=["f1"])
    one = M.WriteNotificationLogRequest(1, 2, "sales", "orders", data, ["2024-01-01"])
    other = M.WriteNotificationLogRequest(1, 2, "sales", "orders", data, ["2024-01-02"])
    key = versions(ORDERS.tag)
    single = handler_plan(
        "add_write_notification_log", call("add_write_notification_log", rqst=one)
    )
    assert single is not None and (key, partition_field(("2024-01-01",))) in bumped(single)
    batch = M.WriteNotificationLogBatchRequest("hive", "sales", "orders", [one, other])
    plan = handler_plan(
        "add_write_notification_log_in_batch",
        call("add_write_notification_log_in_batch", rqst=batch),
    )
    assert plan is not None and not plan.flush_all
    assert {(key, partition_field(("2024-01-01",))), (key, partition_field(("2024-01-02",)))} <= (
        bumped(plan)
    )
    assert (key, "table") not in bumped(plan)


def test_transactional_row_counts_change_nothing_the_cache_holds() -> None:
    """update_transaction_statistics follows every Hive 4 ACID write (once per partition):
    it only adds to materialized views' counters (MV_TABLES_USED), never cached. A flush here
    would empty the cache on every INSERT into a transactional table."""
    spec = catalog.lookup("update_transaction_statistics")
    assert spec is not None and spec.kind is Kind.WRITE and not spec.retryable
    plan = handler_plan("update_transaction_statistics", call("update_transaction_statistics"))
    assert plan is not None and plan.empty


@pytest.mark.parametrize(
    "rqst",
    [
        # The end of a REPL LOAD: repl.last.id goes into database, table, partition parameters.
        M.CommitTxnRequest(
            txnid=7, replPolicy="p", replLastIdInfo=M.ReplLastIdInfo("sales", 42, "orders")
        ),
        M.CommitTxnRequest(txnid=7, replLastIdInfo=M.ReplLastIdInfo("sales", 42)),
        # A table parameter set with the commit, the table named by its id only.
        M.CommitTxnRequest(txnid=7, keyValue=M.CommitTxnKeyValue(12, "_meta.offset", "99")),
    ],
)
def test_commits_that_write_parameters_the_proxy_cannot_place_flush(rqst: Any) -> None:
    spec = catalog.lookup("commit_txn")
    assert spec is not None
    assert engine().plan_write(spec, call("commit_txn", rqst=rqst)).flush_all


# -- other writes of Hive 3 and 4 --------------------------------------------------------------


def test_new_creation_metadata_of_a_materialized_view_invalidates_its_table() -> None:
    creation = M.CreationMetadata("hive", "sales", "daily", ["sales.orders"])
    msg = call(
        "update_creation_metadata", dbname="sales", tbl_name="daily", creation_metadata=creation
    )
    plan = handler_plan("update_creation_metadata", msg)
    assert plan is not None
    assert (versions(TableRef.of("sales", "daily").tag), "table") in bumped(plan)
    assert (versions(CATALOG_TAG), "tables") in bumped(plan)  # get_table_meta and the like


def test_refreshed_privileges_invalidate_the_replies_that_carry_grants() -> None:
    plan = handler_plan("refresh_privileges", call("refresh_privileges"))
    assert plan is not None and bumped(plan) == {(versions(CATALOG_TAG), "privileges")}


CONNECTOR_WRITES = ("create_dataconnector_req", "alter_dataconnector_req", "drop_dataconnector_req")


def test_a_catalog_wide_write_would_miss_the_table_lists_of_remote_databases() -> None:
    """Why data-connector writes flush: a write of the catalog-wide versions (C|D, no target)
    does not reach the versions a database's table list depends on."""
    catalog_wide = PLANNER.write(MethodSpec("x", Kind.WRITE, Scope.CATALOG | Scope.DATABASE), None)
    obj = idl.args_class("get_all_tables")(db_name="remote_db")
    spec = catalog.lookup("get_all_tables")
    assert spec is not None
    read = PLANNER.read(spec, obj, idl.encode(obj), None)
    assert read is not None
    assert not bumped(catalog_wide) & {(r.key, r.field) for r in read.refs}


@pytest.mark.parametrize("name", CONNECTOR_WRITES)
def test_data_connector_writes_flush(name: str) -> None:
    plan = handler_plan(name, call(name))
    assert plan is not None and plan.flush_all


def test_functions_of_hive_42_are_cached_like_the_older_calls() -> None:
    spec = catalog.lookup("get_functions_req")
    assert spec is not None and spec.kind is Kind.CACHEABLE_READ and spec.wide
    msg = call("get_functions_req", request=M.GetFunctionsRequest(dbName="sales", pattern="*"))
    plan = engine().plan_read(spec, msg, None)
    assert plan is not None
    assert {(r.key, r.field) for r in plan.refs} == {
        (versions(CATALOG_TAG), EPOCH),
        (versions(CATALOG_TAG), "functions"),
    }


def test_partitions_with_file_metadata_are_not_cached() -> None:
    """Hive 4's getFileMetadata (Impala's catalogd answers it) reads the file system, which
    changes with no metastore write."""
    spec = catalog.lookup("get_partitions_by_names_req")
    assert spec is not None
    ask = {"db_name": "sales", "tbl_name": "orders", "names": ["ds=1"]}
    with_files = call(
        "get_partitions_by_names_req",
        req=M.GetPartitionsByNamesRequest(**ask, getFileMetadata=True),
    )
    without = call(
        "get_partitions_by_names_req",
        req=M.GetPartitionsByNamesRequest(**ask, getFileMetadata=False),
    )
    assert engine().plan_read(spec, with_files, None) is None
    assert engine().plan_read(spec, without, None) is not None
