"""The report of the wrong reads: each described with the write it missed, and grouped by
which of issue 39's four shapes it has about it."""

from __future__ import annotations

from typing import Any

from tests.rig.adversary.history import Fault, History, Write
from tests.rig.adversary.judge import Wrong


def describe(wrong: Wrong, history: History) -> str:
    r, t0 = wrong.read, history.t0
    where = "the sweep" if r.sweep else ("a fresh connection" if r.fresh else "a kept connection")
    text = (
        f"{r.how} via {r.proxy} ({where}) at {r.started - t0:.3f}-{r.ended - t0:.3f} s: {wrong.why}"
    )
    w = wrong.write
    if w is not None and w.acked is not None:
        burst = f" in burst {w.burst}" if w.burst is not None else ""
        event = history.event_ids.get((w.obj, w.value))
        if event is not None:
            burst += f", event {event}"
            if history.id_counts[event] > 1:
                burst += f" (an id {history.id_counts[event]} events share)"
        text += (
            f"; v={w.value} was {w.how} via {w.route}{burst}, acknowledged at "
            f"{w.acked - t0:.3f} s ({r.started - w.acked:.2f} s before the read)"
        )
        faults = [f.kind for f in history.faults if _during(w, f)]
        if faults:
            text += f", while Redis refused writes ({', '.join(faults)})"
    return text


# The four shapes of issue 39, by what a wrong read and the write it missed have about them.
SHAPES = {
    1: "a write whose event shared its id with another's (HMS 2.3, concurrent writes)",
    2: "a write while Redis refused writes, read through a Redis proxy",
    3: "blanks around a database or table name (the read's or the write's)",
    4: "padded partition names in get_partitions_by_names",
}


def _during(w: Write, f: Fault) -> bool:
    return w.acked is not None and f.started - 0.25 <= w.acked <= f.ended + 0.25


def _blank(name: Any) -> bool:
    return isinstance(name, str) and name != name.strip()


def shapes(wrong: Wrong, history: History) -> tuple[int, ...]:
    """Which of :data:`SHAPES` a wrong read has about it (none: something else)."""
    r, w = wrong.read, wrong.write
    out = []
    if w is not None and history.id_counts[history.event_ids.get((w.obj, w.value), -1)] > 1:
        out.append(1)
    if w is not None and r.proxy in history.peers and any(_during(w, f) for f in history.faults):
        out.append(2)
    named = (r.args.get("dbname", r.args.get("db_name")), r.args.get("tbl_name"))
    if any(map(_blank, named)) or (w is not None and any(map(_blank, w.names))):
        out.append(3)
    if any(n.endswith(" ") for n in r.args.get("names", ())):
        out.append(4)
    return tuple(out)


def report(wrong: list[Wrong], history: History) -> str:
    """The wrong reads by the shapes they have about them, a few of each in full."""
    groups: dict[tuple[int, ...], list[Wrong]] = {}
    for w in wrong:
        groups.setdefault(shapes(w, history), []).append(w)
    lines = []
    for key, members in sorted(groups.items(), key=lambda kv: (len(kv[0]) != 1, kv[0])):
        label = " and ".join(f"shape {n} ({SHAPES[n]})" for n in key) or "none of the four"
        lines.append(f"{len(members)} with {label}:")
        lines += [f"  {describe(w, history)}" for w in members[:5]]
    return "\n".join(lines)


def caught(wrong: list[Wrong], history: History) -> dict[int, int]:
    """How many wrong reads have each shape alone about them."""
    counts = dict.fromkeys(SHAPES, 0)
    for w in wrong:
        found = shapes(w, history)
        if len(found) == 1:
            counts[found[0]] += 1
    return counts
