"""The status page: what a person wants to see at a glance, on ``/`` of the metrics port.

Most figures come from the Prometheus registry, so the page and the dashboards never
disagree. Two things the metrics deliberately do not carry (table names would make their
series unbounded) are kept here, bounded: the busiest tables by look-ups and the most recent
invalidations. Table names appear only with ``--status-show-names on``; otherwise a short
hash of the name stands in, so the page can be shown to people who may not see the schema.

The page is one self-contained HTML document (no scripts, no external assets) that reloads
itself every few seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from proxy import __version__
from proxy.cache.keys import DEFAULT_CATALOG, TableRef
from proxy.metrics import Metrics

TOP_TABLES = 10


@dataclass(slots=True)
class Invalidated:
    at: float
    reason: str
    scopes: tuple[str, ...]
    tables: tuple[str, ...]  # as shown: names or hashes; empty with ``everything``
    everything: bool
    more: int = 0  # tables beyond those shown


# Names are shown up to this long, and an invalidation names this many tables at most: a
# client decides how long a name it sends, and a drop can name thousands.
MAX_NAME = 200
MAX_TABLES_SHOWN = 10
# A write's own event comes back through the notification log within a poll or two: within
# this long, it is shown on the write's line rather than as a line of its own.
SAME_WRITE_SECONDS = 30.0


class Activity:
    """Busiest tables and recent invalidations, in bounded memory.

    Tables are counted with the space-saving scheme: at most ``capacity`` are tracked; a new
    table takes the place of the least looked-up one and starts from its count, so a count
    can be high by at most the count of the table it replaced, and a table looked up more
    often than that can never be missing from the list.

    Without ``show_names``, a table is shown as a hash of its name keyed with ``secret``, so
    that a list of candidate names cannot be hashed to find which tables these are; proxies
    given the same secret show the same hash for a table.
    """

    def __init__(
        self,
        show_names: bool,
        capacity: int = 500,
        recent: int = 20,
        secret: bytes | None = None,
    ) -> None:
        self.show_names = show_names
        self.capacity = capacity
        self.started = time.time()
        self._secret = secret or os.urandom(32)
        self._tables: dict[str, list[int]] = {}  # table tag -> [look-ups, hits]
        self._shown: dict[str, str] = {}  # table tag -> its name as shown
        self.recent: deque[Invalidated] = deque(maxlen=recent)

    def snapshot(self) -> Activity:
        """A copy to read from another thread (the page is rendered off the event loop)."""
        copy = Activity(self.show_names, self.capacity, self.recent.maxlen or 20, self._secret)
        copy.started = self.started
        copy._tables = {tag: list(counts) for tag, counts in self._tables.items()}
        copy._shown = dict(self._shown)
        copy.recent.extend(replace(r) for r in self.recent)  # lines change ("and its event")
        return copy

    def name(self, table: TableRef) -> str:
        if self.show_names:
            prefix = "" if table.catalog == DEFAULT_CATALOG else f"{table.catalog}."
            full = f"{prefix}{table.db}.{table.table}"
            return full if len(full) <= MAX_NAME else full[: MAX_NAME - 1] + "\u2026"
        key = "\x00".join((table.catalog, table.db, table.table)).encode()
        return "table#" + hmac.new(self._secret, key, hashlib.sha256).hexdigest()[:12]

    def looked_up(self, table: TableRef, hit: bool, times: int = 1) -> None:
        # The table's versions are shared by every catalog (proxy.cache.keys): not its row.
        tag = table.tag if table.catalog == DEFAULT_CATALOG else f"{table.catalog}:{table.tag}"
        counts = self._tables.get(tag)
        if counts is None:
            floor = 0
            if len(self._tables) >= self.capacity:
                least = min(self._tables, key=lambda t: self._tables[t][0])
                floor = self._tables.pop(least)[0]
                self._shown.pop(least, None)
            counts = self._tables[tag] = [floor, 0]
            self._shown[tag] = self.name(table)
        counts[0] += times
        if hit:
            counts[1] += times

    def busiest(self, n: int = TOP_TABLES) -> list[tuple[str, int, int]]:
        top = sorted(self._tables.items(), key=lambda item: -item[1][0])[:n]
        return [(self._shown[t], c[0], c[1]) for t, c in top]

    def invalidated(
        self, reason: str, scopes: Iterable[str], tables: Iterable[TableRef], everything: bool
    ) -> None:
        listed = list(tables)
        shown = tuple(self.name(t) for t in listed[:MAX_TABLES_SHOWN])
        now = time.time()
        if reason == "notification" and shown and not everything:
            for line in self.recent:  # the event of a write made through this proxy?
                if now - line.at > SAME_WRITE_SECONDS:
                    break
                if line.reason.startswith("write") and line.tables == shown:
                    line.reason = "write (and its event)"
                    return
        self.recent.appendleft(
            Invalidated(
                now,
                reason,
                tuple(sorted(set(scopes))),
                shown,
                everything,
                max(0, len(listed) - len(shown)),
            )
        )


# -- the page -------------------------------------------------------------------------------

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#f7f8fa}
h1{font-size:20px;margin:0 0 .2em}h2{font-size:15px;margin:1.4em 0 .4em}
.sub{color:#5b6475}.cards{display:flex;flex-wrap:wrap;gap:.8em}
.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:.6em .9em;min-width:11em}
.card b{display:block;font-size:18px}.ok{color:#1a7f37}.bad{color:#c62828}.warn{color:#9a6700}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e8}
td,th{padding:.25em .8em;border-bottom:1px solid #eef0f4;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
"""


def _samples(metrics: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _sum(
    samples: dict[str, list[tuple[dict[str, str], float]]],
    name: str,
    where: Callable[[dict[str, str]], bool] = lambda labels: True,
) -> float:
    return sum(v for labels, v in samples.get(name, []) if where(labels))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"


def _ratio(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _card(title: str, value: str, detail: str = "", state: str = "") -> str:
    cls = f' class="{state}"' if state else ""
    return (
        f'<div class="card" data-card="{html.escape(title)}">{html.escape(title)}'
        f"<b{cls}>{html.escape(value)}</b>"
        f'<span class="sub">{html.escape(detail)}</span></div>'
    )


def _table(headers: list[str], rows: list[list[str]], numeric: set[int], name: str) -> str:
    if not rows:
        return '<p class="sub">nothing yet</p>'
    head = "".join(
        f'<th class="n">{html.escape(h)}</th>' if i in numeric else f"<th>{html.escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{html.escape(c)}</td>' if i in numeric else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f'<table id="{name}"><tr>{head}</tr>{body}</table>'


def render(metrics: Metrics, activity: Activity, facts: dict[str, Any], refresh: int = 5) -> bytes:
    """The page. ``facts``: what the registry does not know (upstreams, store kind)."""
    s = _samples(metrics)
    now = time.time()
    hits = _sum(
        s,
        "hmsproxy_cache_lookups_total",
        lambda labels: labels["result"] in ("hit", "negative_hit"),
    )
    looked = _sum(s, "hmsproxy_cache_lookups_total")
    requests = _sum(s, "hmsproxy_requests_total")
    failed = _sum(
        s,
        "hmsproxy_requests_total",
        lambda labels: labels["outcome"] in ("upstream_error", "internal_error"),
    )
    hms_up = _sum(s, "hmsproxy_upstream_available") >= 1
    redis_up = _sum(s, "hmsproxy_cache_available") >= 1
    lag_events = _sum(s, "hmsproxy_notification_lag_events")
    lag_seconds = _sum(s, "hmsproxy_notification_lag_seconds")
    following = _sum(s, "hmsproxy_notification_active") >= 1
    leader = _sum(s, "hmsproxy_notification_leader") >= 1
    store = str(facts.get("store", ""))
    cards = [
        _card("Uptime", _duration(now - activity.started), f"version {__version__}"),
        _card(
            "Metastore",
            "up" if hms_up else "DOWN",
            ", ".join(facts.get("upstreams", [])),
            "ok" if hms_up else "bad",
        ),
        _card(
            "Cache store",
            "off" if store == "off" else ("up" if redis_up else "DOWN (serving from the HMS)"),
            store,
            "" if store == "off" else ("ok" if redis_up else "bad"),
        ),
        _card("Hit ratio", _ratio(hits, looked), f"{int(hits):,} of {int(looked):,} look-ups"),
        _card(
            "Requests",
            f"{int(requests):,}",
            f"{int(failed):,} failed",
            "bad" if failed else "",
        ),
        _card(
            "Notification log",
            (f"lag {lag_seconds:.0f} s" if following else "not followed"),
            (
                f"{int(lag_events)} events behind; "
                + ("this proxy follows" if leader else "another proxy follows")
                if following
                else "staleness bounded by TTLs"
            ),
            ("warn" if lag_seconds > 30 else "ok") if following else "warn",
        ),
        _card(
            "Connections",
            f"{int(_sum(s, 'hmsproxy_client_connections')):,} clients",
            f"{int(_sum(s, 'hmsproxy_upstream_connections')):,} to the metastore",
        ),
    ]
    by_method: dict[str, dict[str, float]] = {}
    for labels, value in s.get("hmsproxy_cache_lookups_total", []):
        by_method.setdefault(labels["method"], {})[labels["result"]] = value
    method_rows = []
    for method, counts in sorted(by_method.items(), key=lambda item: -sum(item[1].values())):
        total = sum(counts.values())
        if not total:
            continue
        served = counts.get("hit", 0) + counts.get("negative_hit", 0)
        method_rows.append([method, f"{int(total):,}", f"{int(served):,}", _ratio(served, total)])
    table_rows = [
        [name, f"{lookups:,}", _ratio(hit, lookups)] for name, lookups, hit in activity.busiest()
    ]
    recent_rows = [
        [
            time.strftime("%H:%M:%S", time.localtime(r.at)),
            r.reason,
            "everything"
            if r.everything
            else ", ".join(r.tables) + (f" and {r.more:,} more" if r.more else "") or "-",
            ", ".join(r.scopes),
        ]
        for r in activity.recent
    ]
    listing: dict[str, float] = {}
    for labels, value in s.get("hmsproxy_listing_lookups_total", []):
        listing[labels["result"]] = listing.get(labels["result"], 0.0) + value
    names_note = "" if activity.show_names else " (names hashed; --status-show-names on shows them)"
    methods = _table(
        ["method", "look-ups", "served from cache", "hit ratio"], method_rows, {1, 2, 3}, "methods"
    )
    tables = _table(["table", "look-ups", "hit ratio"], table_rows, {1, 2}, "tables")
    recent = _table(["time", "cause", "what", "scopes"], recent_rows, set(), "invalidations")
    listings = "".join(
        _card(title, f"{int(listing.get(result, 0)):,}")
        for title, result in (
            ("Sealed, from cache", "hit"),
            ("Sealed, listed", "miss"),
            ("Open, listed live", "open"),
        )
    )
    stamp = html.escape(time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)))
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh}">
<title>hms-cache-proxy status</title><style>{STYLE}</style></head>
<body>
<h1>hms-cache-proxy</h1>
<div class="sub">status at {stamp}; reloads every {refresh} s; metrics at
<a href="/metrics">/metrics</a></div>
<h2>Health</h2><div class="cards">{"".join(cards)}</div>
<h2>Hit ratio by method</h2>{methods}
<h2>Busiest tables{html.escape(names_note)}</h2>{tables}
<h2>Recent invalidations</h2>{recent}
<h2>File listings</h2><div class="cards">{listings}</div>
</body></html>
"""
    return page.encode("utf-8")
