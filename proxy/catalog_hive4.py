"""Hive 3 and 4 methods that the cache has no part in, by what they are to the proxy.

None of these reads or changes anything the cache holds (tables, partitions, statistics,
database and table lists, functions, grants): each is either a read that is forwarded every
time, or a write of server state that is forwarded once and never retried. :mod:`proxy.catalog`
enters them into its one table (``uncached`` and ``state``); their arguments are never decoded,
so ``idl/hive_metastore.thrift`` does not declare them.

The lists are checked against the method lists of Hive 3.1, 4.0.1 and 4.2.1 in
``tests/data/hms_methods`` (tests/unit/test_catalog_coverage.py).
"""

from __future__ import annotations

# --- Reads: nothing to cache, safe to send again on a fresh connection -----------------------

# The compactor's and the transaction manager's view: changes with every transaction.
TXN_READS = (
    "find_columns_with_stats",  # which columns of a table or partition have statistics
    "get_latest_committed_compaction_info",
    "get_latest_txnid_in_conflict",
    "get_max_allocated_table_write_id",
    "get_open_txns_req",
    "get_replayed_txns_for_policy",
)

# Materialized views, scheduled queries, replication: state of the HMS, not metadata.
SERVER_READS = (
    "get_materialization_invalidation_info",
    "get_metastore_db_uuid",
    "get_replication_metrics",
    "get_runtime_stats",
    "get_scheduled_query",
)

# Stores beside the catalog: data connectors, HPL/SQL packages and procedures, the property
# store, the schema registry and serdes, workload management.
STORE_READS = (
    "find_package",
    "get_active_resource_plan",
    "get_all_packages",
    "get_all_resource_plans",
    "get_all_stored_procedures",
    "get_dataconnector_req",
    "get_dataconnectors",
    "get_ischema",
    "get_properties",
    "get_resource_plan",
    "get_schema_all_versions",
    "get_schema_latest_version",
    "get_schema_version",
    "get_schemas_by_cols",
    "get_serde",
    "get_stored_procedure",
    "get_triggers_for_resourceplan",
    "validate_resource_plan",  # checks a plan, changes nothing
)

# What the HMS would make of a CREATE TABLE (its translation of the table), without making it.
DRY_RUNS = ("translate_table_dryrun",)

# --- Server state: forwarded once, never retried, the cache left alone ------------------------

# Read-looking, but they change server state: each call takes something (a compaction from the
# queue, a scheduled execution, a rebuild lock), so sending one twice takes twice. Never
# cached, never retried on a fresh connection.
CLAIMS = (
    "find_next_compact",
    "find_next_compact2",
    "get_lock_materialization_rebuild",
    "scheduled_query_poll",
)

# The compaction queue and the workers' progress through it, which Hive 4's compaction workers
# (HiveServer2) call at every step. A compaction changes files, not metadata; what it does to
# statistics reaches the cache through the notification log.
COMPACTION = (
    "abort_Compactions",
    "mark_cleaned",
    "mark_compacted",
    "mark_failed",
    "mark_refused",
    "remove_compaction_metrics_data",
    "set_hadoop_jobid",
    "submit_for_cleanup",
    "update_compaction_metrics_data",
    "update_compactor_state",
)

# Transactions and write ids: housekeeping and replication's seeding of them.
TXN_STATE = (
    "add_write_ids_to_min_history",
    "repl_tbl_writeid_state",
    "seed_txn_id",
    "seed_write_id",
)

# Materialized-view rebuild locks, scheduled queries (the executor reports its progress),
# replication's metrics and its change-management bin, runtime statistics of queries.
SERVER_STATE = (
    "add_replication_metrics",
    "add_runtime_stats",
    "cm_recycle",
    "heartbeat_lock_materialization_rebuild",
    "scheduled_query_maintenance",
    "scheduled_query_progress",
)

# The stores beside the catalog (see STORE_READS).
STORE_WRITES = (
    "add_package",
    "add_schema_version",
    "add_serde",
    "alter_ischema",
    "alter_resource_plan",
    "alter_wm_pool",
    "alter_wm_trigger",
    "create_ischema",
    "create_or_drop_wm_trigger_to_pool_mapping",
    "create_or_update_wm_mapping",
    "create_resource_plan",
    "create_stored_procedure",
    "create_wm_pool",
    "create_wm_trigger",
    "drop_ischema",
    "drop_package",
    "drop_resource_plan",
    "drop_schema_version",
    "drop_stored_procedure",
    "drop_wm_mapping",
    "drop_wm_pool",
    "drop_wm_trigger",
    "map_schema_version_to_serde",
    "set_properties",
    "set_schema_version_state",
)
