"""Notification events to invalidations: both message formats, partition precision."""

from __future__ import annotations

import base64
import gzip
import json

from proxy.cache.events import Event, invalidation_for
from proxy.cache.keys import EPOCH, DatabaseRef, TableRef, partition_field
from tests.unit.helpers import NAMING, PLANNER

TV = NAMING.versions(TableRef.of("db", "t").tag)
DV = NAMING.versions(DatabaseRef.of("db").tag)


def event(
    kind: str, body: dict[str, object], *, gz: bool = False, table: str | None = "t"
) -> Event:
    text = json.dumps(body)
    fmt = "json-0.2"
    if gz:
        text = base64.b64encode(gzip.compress(text.encode())).decode()
        fmt = "gzip(json-2.0)"
    return Event(7, 1700000000, kind, "db", table, text, fmt)


def bumps(e: Event) -> set[tuple[str, str]]:
    plan = invalidation_for(e, PLANNER)
    assert plan is not None and not plan.flush_all
    return {(b.key, b.field) for b in plan.bumps}


def tjson_table(name: str, cols: list[str]) -> str:
    col_list = ["rec", len(cols), *({"1": {"str": c}, "2": {"str": "string"}} for c in cols)]
    return json.dumps(
        {"1": {"str": name}, "2": {"str": "db"}, "7": {"rec": {"1": {"lst": col_list}}}}
    )


def test_alter_partition_names_only_that_partition_in_both_formats() -> None:
    body = {"db": "db", "table": "t", "keyValues": {"ds": "2024-01-01", "h": "3"}}
    for gz in (False, True):
        assert bumps(event("ALTER_PARTITION", body, gz=gz)) == {
            (TV, "parts"),
            (TV, partition_field(["2024-01-01", "3"])),
        }


def test_add_partition_prefers_the_partition_objects() -> None:
    listed = [json.dumps({"1": {"lst": ["str", 1, "a/b"]}})]
    body = {"partitions": [{"ds": "wrong"}], "partitionListJson": listed}
    assert (TV, partition_field(["a/b"])) in bumps(event("ADD_PARTITION", body))
    assert (TV, "partset") in bumps(event("ADD_PARTITION", body))


def test_drop_partition_uses_the_maps() -> None:
    got = bumps(event("DROP_PARTITION", {"partitions": [{"ds": "1"}, {"ds": "2"}]}))
    assert {(TV, partition_field(["1"])), (TV, partition_field(["2"])), (TV, "partset")} <= got


def test_alter_table_keeps_partitions_unless_columns_changed() -> None:
    same = {
        "tableObjBeforeJson": tjson_table("t", ["a"]),
        "tableObjAfterJson": tjson_table("t", ["a"]),
    }
    assert (TV, "pgen") not in bumps(event("ALTER_TABLE", same))
    assert (TV, "table") in bumps(event("ALTER_TABLE", same))
    changed = {
        "tableObjBeforeJson": tjson_table("t", ["a"]),
        "tableObjAfterJson": tjson_table("t", ["a", "b"]),
    }
    assert (TV, "pgen") in bumps(event("ALTER_TABLE", changed))


def test_a_rename_kills_both_names() -> None:
    body = {
        "tableObjBeforeJson": tjson_table("t", ["a"]),
        "tableObjAfterJson": tjson_table("u", ["a"]),
    }
    new = NAMING.versions(TableRef.of("db", "u").tag)
    assert {(TV, EPOCH), (new, EPOCH), (DV, "db")} <= bumps(event("ALTER_TABLE", body))


def test_create_and_drop_table() -> None:
    for kind in ("CREATE_TABLE", "DROP_TABLE"):
        assert {(TV, EPOCH), (DV, "db")} <= bumps(event(kind, {}))


def test_insert_into_an_unpartitioned_table_invalidates_the_table() -> None:
    assert (TV, "table") in bumps(event("INSERT", {"partKeyVals": {}}))
    assert (TV, partition_field(["1"])) in bumps(event("INSERT", {"partKeyVals": {"ds": "1"}}))


def test_events_that_change_nothing_cached_are_skipped() -> None:
    for kind in ("OPEN_TXN", "COMMIT_TXN", "ALLOC_WRITE_ID_EVENT"):
        assert invalidation_for(event(kind, {}), PLANNER) is None


def test_drop_database_and_unreadable_events_flush() -> None:
    plan = invalidation_for(event("DROP_DATABASE", {}, table=None), PLANNER)
    assert plan is not None and plan.flush_all
    broken = Event(1, 0, "ALTER_PARTITION", None, None, "not json", "json-0.2")
    plan = invalidation_for(broken, PLANNER)
    assert plan is not None and plan.flush_all


def test_unknown_event_types_invalidate_the_whole_table() -> None:
    got = bumps(event("SOMETHING_NEW_IN_HIVE_5", {}))
    assert (TV, EPOCH) in got  # everything of the table, at once


def test_partition_statistics_events_name_their_partition() -> None:
    got = bumps(event("UPDATE_PART_COL_STAT_EVENT", {"partVals": ["x"]}))
    assert (TV, partition_field(["x"])) in got and (TV, "pgen") not in got
