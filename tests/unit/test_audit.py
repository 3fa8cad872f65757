"""The audit log (--audit-log): one JSON line per call however it was answered (the awaited
way, a hit or a forward answered at once, an Again), with who, what, how big and how it
went; rotated by size; nothing of a call's argument values in it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from proxy import idl
from proxy.audit import AuditLog, partitions_in
from proxy.handler import SessionState
from tests.unit.helpers import DB, T, fed, get_table
from tests.unit.inprocess import rig
from tests.unit.scripted_hms import reply_message

DAYS = [f"2024-01-{d:02d}" for d in range(1, 11)]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_way_of_answering_writes_one_line_with_who_what_and_how(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"

    async def run() -> None:
        async with fed(audit_log=str(log)) as (r, _server, connection):
            r.hms.add_table(DB, T, *DAYS)
            first = connection()
            first.feed(get_table(1))  # a miss: a task, the awaited way
            first.feed(get_table(2))  # then hits: at once, then again (an Again)
            first.feed(get_table(3))
            replies = await first.replied(3)
            other = connection()  # a connection per call: the call known by its bytes
            other.feed(get_table(4))
            replies += await other.replied(1)
            call = idl.encode_call("get_partitions", 5, db_name=DB, tbl_name=T, max_parts=-1)
            first.feed(call)
            replies += (await first.replied(4))[3:]
            r.handler.audit.log.flush()  # (what a second, or a stop, does)
            got = lines(log)
            assert [line["method"] for line in got] == ["get_table"] * 4 + ["get_partitions"]
            assert [line["cache"] for line in got] == ["miss", "hit", "hit", "hit", "miss"]
            assert [line["bytes"] for line in got] == [len(reply) for reply in replies]
            assert {(line["db"], line["table"]) for line in got} == {(DB, T)}
            assert [line["partitions"] for line in got] == [None] * 4 + [10]
            assert {line["outcome"] for line in got} == {"ok"}
            assert {line["address"] for line in got} == {"127.0.0.1"}
            assert all(line["user"] is None and line["ms"] >= 0 for line in got)
            assert all(line["time"].endswith("Z") for line in got)
            await first.end()
            await other.end()

    asyncio.run(run())


def test_users_forwards_and_refusals_are_logged_and_argument_values_are_not(
    tmp_path: Path,
) -> None:
    log = tmp_path / "audit.log"

    async def run() -> None:
        async with rig(cache=False, audit_log=str(log), max_partitions_per_call=5) as r:
            r.hms.add_table(DB, T, *DAYS)
            alice = SessionState("10.0.0.7:4000", user="alice")
            await r.call(alice, "get_table", 1, dbname=DB, tbl_name=T)
            await r.call(
                alice,
                "get_partitions_by_filter",
                2,
                db_name=DB,
                tbl_name=T,
                filter='ds = "secret-literal"',
                max_parts=-1,
            )
            await r.call(alice, "get_partitions", 3, db_name=DB, tbl_name=T, max_parts=-1)
            r.handler.audit.log.flush()
            text = log.read_text()
            assert "secret-literal" not in text
            got = lines(log)
            assert [(g["method"], g["outcome"], g["cache"]) for g in got] == [
                ("get_table", "ok", "none"),
                ("get_partitions_by_filter", "ok", "none"),
                ("get_partitions", "refused", "none"),
            ]
            assert {(g["user"], g["address"]) for g in got} == {("alice", "10.0.0.7")}
            assert got[1]["partitions"] == 0

    asyncio.run(run())


def test_the_file_is_rotated_by_size_keeping_the_backups_asked(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), max_bytes=1000, backups=2)
    for n in range(60):
        audit.record("u", "a", "get_table", "db", f"t{n}", None, 10, "ok", "hit", 0.001)
        if n % 10 == 9:
            audit.flush()
    audit.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.log", "audit.log.1", "audit.log.2"]
    tables = [
        line["table"]
        for p in ("audit.log.2", "audit.log.1", "audit.log")
        for line in lines(tmp_path / p)
    ]
    assert tables == [f"t{n}" for n in range(60 - len(tables), 60)]  # the newest, in order


def test_partitions_are_read_off_the_replys_first_bytes() -> None:
    partition = idl.module().Partition(values=["1"], dbName=DB, tableName=T)
    plain = reply_message(
        "get_partitions", 1, idl.result_class("get_partitions")(success=[partition] * 3)
    )
    assert partitions_in("get_partitions", plain) == 3
    response = idl.module().GetPartitionsByNamesResult(partitions=[partition] * 2)
    wrapped = reply_message(
        "get_partitions_by_names_req",
        1,
        idl.result_class("get_partitions_by_names_req")(success=response),
    )
    assert partitions_in("get_partitions_by_names_req", wrapped) == 2
    error = reply_message(
        "get_partitions",
        1,
        idl.result_class("get_partitions")(o2=idl.module().MetaException("no")),
    )
    assert partitions_in("get_partitions", error) is None
    assert partitions_in("get_table", plain) is None


def test_a_rotation_that_fails_loses_lines_not_the_proxy(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), max_bytes=100, backups=1)
    audit.record("u", "a", "get_table", "db", "t", None, 10, "ok", "hit", 0.001)
    backup = tmp_path / "audit.log.1"
    backup.mkdir()  # (the rename onto it fails)
    backup.joinpath("x").write_text("")
    audit.flush()  # wrote, then could not rotate: logged, not raised
    audit.record("u", "a", "get_table", "db", "t2", None, 10, "ok", "hit", 0.001)
    audit.flush()  # the file opened again: written
    audit.close()
    assert [line["table"] for line in lines(path)] == ["t", "t2"]
