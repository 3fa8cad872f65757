"""The judge: which reads the README's "Coherence guarantees" make wrong, by how long after
its acknowledgement each write must be seen."""

from __future__ import annotations

from dataclasses import dataclass

from tests.rig.adversary.database import Obj, show
from tests.rig.adversary.history import HMS, History, Read, Write

# Seconds a write made elsewhere may take to be seen. Through the notification log: a poll
# (0.3 s here; the README says "about a second" at its default of 1 s). Through another proxy
# on the same Redis: the invalidation's delivery, "never later than --redis-tracking-max-lag"
# (1 s). What runs here takes a few hundred milliseconds and none at all (the summary's
# "longest ... read"), on a busy machine too.
SLACK = 2.0
PEER_SLACK = 1.0


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
