"""Judgements in process stand on the version hashes they read (proxy.cache.scopes): a change
to one table's versions undoes the judgements of that table's hits, and no other."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

from proxy import idl
from proxy.cache.keys import Bump
from proxy.cache.scopes import Scopes
from proxy.cache.store import MemoryStore
from proxy.handler import SessionState
from tests.unit.helpers import DAYS, DB, Asked, T, Written, answered_now, by_names, get_table
from tests.unit.inprocess import rig

M = idl.module()
U = "u"


def test_a_change_to_a_hash_moves_the_scopes_that_read_it_and_no_other() -> None:
    scopes = Scopes()
    t, u, both = scopes.of(["t"]), scopes.of(["u"]), scopes.of(["t", "u"])
    assert scopes.of(("t",)) is t  # (one scope for one set of hashes)
    marks = {s: s.mark for s in (t, u, both)}
    scopes.moved("u")
    assert t.mark == marks[t] and u.mark != marks[u] and both.mark != marks[both]
    scopes.moved("elsewhere")  # a hash nothing was judged from
    assert u.mark == scopes.of(["u"]).mark
    before = {s: s.mark for s in (t, u, both)}
    scopes.moved_all()
    assert all(s.mark != before[s] for s in (t, u, both))
    # A mark is given once, to one scope: a stamp equal to a scope's mark was made under it.
    states = {
        (id(s), m)
        for snapshot in (marks, before, {s: s.mark for s in marks})
        for s, m in snapshot.items()
    }
    assert len({m for _, m in states}) == len(states) == 8


def test_a_scope_nothing_holds_is_forgotten_and_made_again_with_a_new_mark() -> None:
    scopes = Scopes()
    scope = scopes.of(["t"])
    old = scope.mark
    del scope
    gc.collect()
    assert len(scopes) == 0
    scopes.moved("t")  # (nothing reads it now)
    again = scopes.of(["t"])
    assert again.mark != old and len(scopes) == 1


def test_the_embedded_store_moves_the_scopes_of_what_it_changes() -> None:
    async def run() -> None:
        store = MemoryStore(max_bytes=1 << 20, max_version_hashes=3)
        scopes = store.standing.scopes
        t, u = scopes.of(["t"]), scopes.of(["u"])
        steps: list[tuple[str, Callable[[], Awaitable[object]], tuple[bool, bool]]] = [
            ("an epoch made", lambda: store.ensure_epochs(["t"]), (True, False)),
            ("an epoch already there", lambda: store.ensure_epochs(["t"]), (False, False)),
            ("a bump", lambda: store.bump([Bump("u", "table", "table")]), (False, True)),
            ("a lock marked", lambda: store.mark([("t", "lock:1")], 1e12), (True, False)),
            ("a lock lifted", lambda: store.unmark([("t", "lock:1")]), (True, False)),
            # "t" is the oldest of the 3 hashes kept: a new one pushes it out.
            ("an eviction", lambda: store.ensure_epochs(["a", "b"]), (True, False)),
            ("a flush", lambda: store.flush(), (True, True)),
        ]
        for what, step, expected in steps:
            before = t.mark, u.mark
            await step()
            assert (t.mark != before[0], u.mark != before[1]) == expected, what

    asyncio.run(run())


def test_a_write_to_one_table_leaves_the_other_tables_hits_standing() -> None:
    def other_table(seqid: int) -> bytes:
        return idl.encode_call("get_table", seqid, dbname=DB, tbl_name=U)

    async def run() -> None:
        async with rig() as r:
            r.hms.add_table(DB, T, *DAYS[:4], v="1")
            r.hms.add_table(DB, U, v="1")
            session = SessionState("s")
            for table in (T, U):
                await r.call(session, "get_table", 1, dbname=DB, tbl_name=table)  # cached
            _, again_t = answered_now(r, session, get_table(2))
            _, again_u = answered_now(r, session, other_table(2))
            ask = Asked(r)
            await ask(by_names(3, *DAYS[:4]))
            await ask(by_names(4, *DAYS[:4]))  # T's partitions judged current
            assert (await ask(by_names(5, *DAYS[:2])))[1] == "assembled"

            changed = M.Table(tableName=U, dbName=DB, parameters={"v": "2"})
            await r.call(session, "alter_table", 6, dbname=DB, tbl_name=U, new_tbl=changed)

            # T's hits are answered as they were, without a new judgement: an Again
            # answers only while its item's judgement stands, and the assembled way only
            # from partitions whose stamp is their table's mark of now.
            assert again_t.answer(get_table(7), Written())  # type: ignore[arg-type]
            assert (await ask(by_names(8, *DAYS[1:3])))[1] == "assembled"
            # U's hit is judged again first.
            assert not again_u.answer(other_table(9), Written())  # type: ignore[arg-type]
            assert again_u.item() is not None

    asyncio.run(run())
