"""Writes hms-cache-proxy.json, the proxy's Grafana dashboard, next to this file.

    python deploy/grafana/generate.py          # rewrite the JSON
    python deploy/grafana/generate.py --check  # exit 1 if the committed JSON is not this output

The dashboard is generated so that every query gets the same selector (``job`` and
``instance`` variables), every panel the ``${datasource}`` variable, a unit and a
description, and the grid is laid out without hand-kept coordinates. Edit the panels below,
run the script, commit both files (tests/deploy/test_observability.py checks they agree and
lints the result). Only the standard library is used.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

UID = "hms-cache-proxy"
TITLE = "HMS cache proxy"
OUT = Path(__file__).with_name("hms-cache-proxy.json")

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"
# The alert bound for notification lag (deploy/prometheus/alerts.yaml), drawn on the panel.
LAG_BOUND_SECONDS = 60

Panel = dict[str, Any]


def sel(**matchers: str) -> str:
    """The selector every query uses: the dashboard's job and instance, then ``matchers``
    (``name="value"``, or ``name="~regex"`` / ``name="!value"`` for ``=~`` / ``!=``)."""
    parts = ['job=~"$job"', 'instance=~"$instance"']
    for name, value in matchers.items():
        op = "="
        if value.startswith("~"):
            op, value = "=~", value[1:]
        elif value.startswith("!"):
            op, value = "!=", value[1:]
        parts.append(f'{name}{op}"{value}"')
    return "{" + ", ".join(parts) + "}"


def rate(metric: str, **matchers: str) -> str:
    return f"rate({metric}{sel(**matchers)}{RATE})"


def ratio(numerator: str, denominator: str) -> str:
    """``numerator / denominator`` where the denominator is above zero: no 0/0 NaN series."""
    return f"{numerator}\n/\n({denominator} > 0)"


def quantile(q: float, metric: str, by: str = "") -> str:
    groups = ", ".join(["le", *([by] if by else [])])
    return f"histogram_quantile({q}, sum by ({groups}) ({rate(metric + '_bucket')}))"


def target(expr: str, legend: str = "__auto") -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "range": True}


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for value, color in steps],
    }


GOOD_HIGH = thresholds((None, "red"), (0.3, "orange"), (0.7, "green"))
ZERO_IS_GOOD = thresholds((None, "green"), (1, "red"))


def stat(
    title: str,
    description: str,
    expr: str,
    unit: str,
    steps: dict[str, Any] | None = None,
    *,
    decimals: int | None = None,
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": "thresholds"},
        "thresholds": steps or thresholds((None, "blue")),
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
            "wideLayout": True,
            "showPercentChange": False,
        },
        "targets": [target(expr, "")],
        "_size": (3, 4),
    }


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    width: int = 12,
    stack: bool = False,
    bounds: tuple[float, float] | None = None,
    log_scale: bool = False,
    threshold_line: float | None = None,
    decimals: int | None = None,
) -> Panel:
    custom: dict[str, Any] = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 20 if stack else 5,
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": 0,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "thresholdsStyle": {"mode": "off" if threshold_line is None else "dashed"},
    }
    if log_scale:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
        del custom["axisSoftMin"]
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": custom,
        "color": {"mode": "palette-classic"},
    }
    if bounds is not None:
        defaults["min"], defaults["max"] = bounds
    if decimals is not None:
        defaults["decimals"] = decimals
    if threshold_line is not None:
        defaults["thresholds"] = thresholds((None, "transparent"), (threshold_line, "red"))
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
        "_size": (width, 8),
    }


HIT = "hmsproxy_cache_lookups_total"
HITS = {"result": "~hit|negative_hit"}
CLIENT_ERRORS = {"outcome": "~upstream_error|internal_error"}


def overview() -> list[Panel]:
    return [
        stat(
            "Cache hit ratio",
            "Cacheable reads answered from the cache (hit or remembered NoSuchObject), out of "
            "all look-ups including misses and bypasses.",
            ratio(f"sum({rate(HIT, **HITS)})", f"sum({rate(HIT)})"),
            "percentunit",
            GOOD_HIGH,
        ),
        stat(
            "Requests / s",
            "Calls answered to clients, all methods and outcomes.",
            "sum(rate(hmsproxy_requests_total" + sel() + RATE + "))",
            "reqps",
        ),
        stat(
            "Error ratio",
            "Calls answered with an upstream or internal error (a declared HMS exception such "
            "as NoSuchObjectException is not an error here).",
            ratio(
                f"sum({rate('hmsproxy_requests_total', **CLIENT_ERRORS)})",
                f"sum({rate('hmsproxy_requests_total')})",
            ),
            "percentunit",
            thresholds((None, "green"), (0.01, "orange"), (0.05, "red")),
        ),
        stat(
            "Proxies without metastore",
            "Proxies whose health probe (every 2 s) gets no answer from the Hive Metastore.",
            "count(hmsproxy_upstream_available" + sel() + " == 0) or vector(0)",
            "short",
            ZERO_IS_GOOD,
            decimals=0,
        ),
        stat(
            "Proxies without Redis",
            "Proxies that cannot reach Redis: they answer from the metastore (degraded) and "
            "cannot invalidate for the other proxies.",
            "count(hmsproxy_cache_available" + sel() + " == 0) or vector(0)",
            "short",
            ZERO_IS_GOOD,
            decimals=0,
        ),
        stat(
            "Notification log leaders",
            "Proxies following the metastore's notification log. Exactly one per Redis; 0 "
            "means writes that bypass the proxy are seen only within the TTLs.",
            "sum(hmsproxy_notification_leader" + sel() + ")",
            "short",
            thresholds((None, "red"), (1, "green"), (2, "orange")),
            decimals=0,
        ),
        stat(
            "Notification lag",
            "Age of the oldest notification event not applied yet, on the proxy that follows "
            f"the log (the leader). Normally about a second; the alert fires above "
            f"{LAG_BOUND_SECONDS} s.",
            "max(\n  hmsproxy_notification_lag_seconds"
            + sel()
            + "\n  and on (job, instance) (hmsproxy_notification_leader"
            + sel()
            + " == 1)\n)",
            "s",
            thresholds((None, "green"), (5, "orange"), (LAG_BOUND_SECONDS, "red")),
        ),
        stat(
            "Client connections",
            "Open connections from engines (Trino opens one per call).",
            "sum(hmsproxy_client_connections" + sel() + ")",
            "short",
            decimals=0,
        ),
    ]


def cache() -> list[Panel]:
    return [
        timeseries(
            "Hit ratio",
            "(hit + negative_hit) / all look-ups of cacheable reads, for the selection and per "
            "proxy.",
            [
                target(ratio(f"sum({rate(HIT, **HITS)})", f"sum({rate(HIT)})"), "all"),
                target(
                    ratio(
                        f"sum by (instance) ({rate(HIT, **HITS)})",
                        f"sum by (instance) ({rate(HIT)})",
                    ),
                    "{{instance}}",
                ),
            ],
            "percentunit",
            bounds=(0, 1),
        ),
        timeseries(
            "Hit ratio by method",
            "Per cacheable method, (hit + negative_hit) / all its look-ups; methods not called "
            "in the interval are left out.",
            [
                target(
                    ratio(
                        f"sum by (method) ({rate(HIT, **HITS)})",
                        f"sum by (method) ({rate(HIT)})",
                    ),
                    "{{method}}",
                )
            ],
            "percentunit",
            bounds=(0, 1),
        ),
        timeseries(
            "Hits answered by a fast path",
            "The share of hits (hit + negative_hit) answered with nothing awaited, from the "
            "connection's socket callback or as soon as its session read the request "
            "(docs/design.md): the rest took the awaited path. It falls when writes, locks and "
            "fills move what kept hits were judged under.",
            [
                target(
                    ratio(
                        f"sum({rate('hmsproxy_cache_hits_at_once_total')})",
                        f"sum({rate(HIT, **HITS)})",
                    ),
                    "all",
                ),
            ],
            "percentunit",
            bounds=(0, 1),
        ),
        timeseries(
            "Calls forwarded at once",
            "By method, the share of calls sent to the metastore at once, from the "
            "connection's socket callback, with no task (docs/design.md): calls only "
            "forwarded (with the cache on, neither cached reads nor writes). The rest took the "
            "awaited path, as every call does when the pool has no idle connection at hand.",
            [
                target(
                    ratio(
                        f"sum by (method) ({rate('hmsproxy_calls_forwarded_at_once_total')})",
                        f"sum by (method) ({rate('hmsproxy_requests_total')})",
                    ),
                    "{{method}}",
                ),
            ],
            "percentunit",
            bounds=(0, 1),
        ),
        timeseries(
            "Cache look-ups by result",
            "hit: served from the cache; negative_hit: a remembered NoSuchObjectException; "
            "miss: fetched from the metastore and stored; bypass: not cacheable at that moment "
            "(Redis unavailable, a write fence, an entry too large).",
            [target(f"sum by (result) ({rate(HIT)})", "{{result}}")],
            "ops",
            stack=True,
        ),
        timeseries(
            "get_partitions_by_names: partitions by result",
            "Partitions asked for in get_partitions_by_names, by whether the cache had them: "
            "a request for 100 names of which 97 are cached sends one call for the 3 missing.",
            [
                target(
                    f"sum by (result) ({rate('hmsproxy_cache_partitions_total')})",
                    "{{result}}",
                )
            ],
            "ops",
            stack=True,
        ),
        timeseries(
            "Bytes written to the cache",
            "Bytes stored in the cache per second, after compression: the fill traffic to Redis.",
            [target(f"sum({rate('hmsproxy_cache_stored_bytes_total')})", "stored")],
            "Bps",
        ),
        timeseries(
            "In-process memory by memo",
            "What each proxy keeps in process, as each memo counts it: the embedded cache or "
            "Redis's front (cache), calls known with their plans (known_calls), partition "
            "variants, encoded Redis commands, set_ugi replies, compression dictionaries, "
            "lock fences, fingerprints. Each is bounded "
            "(docs/reliability.md); a process growing beyond their sum is a leak.",
            [
                target(
                    "sum by (memo) (hmsproxy_memo_bytes" + sel() + ")",
                    "{{memo}}",
                ),
            ],
            "bytes",
            stack=True,
        ),
        timeseries(
            "In-process entries by memo",
            "Entries in each memo of the panel before (each is bounded in number too).",
            [
                target(
                    "sum by (memo) (hmsproxy_memo_entries" + sel() + ")",
                    "{{memo}}",
                ),
            ],
            "short",
            decimals=0,
        ),
        timeseries(
            "Stale replies (--stale-if-error)",
            "Cached replies served past their TTL because the metastore was unreachable, by "
            "method. Empty unless --stale-if-error is set and the metastore failed.",
            [
                target(
                    f"sum by (method) ({rate('hmsproxy_stale_replies_total')}) > 0",
                    "{{method}}",
                )
            ],
            "reqps",
        ),
    ]


def requests() -> list[Panel]:
    duration = "hmsproxy_request_duration_seconds"
    upstream = "hmsproxy_upstream_request_duration_seconds"
    return [
        timeseries(
            "Requests / s by source",
            "Calls answered from the cache and from the metastore (upstream).",
            [target(f"sum by (source) ({rate(duration + '_count')})", "{{source}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "Requests / s by outcome",
            "ok; user_error: a declared HMS exception (NoSuchObjectException, ...); "
            "upstream_error: the metastore failed or was unreachable; internal_error: a bug in "
            "the proxy; client_gone: the client hung up before its answer was sent.",
            [target(f"sum by (outcome) ({rate('hmsproxy_requests_total')})", "{{outcome}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "Latency p50 / p99: cache vs upstream",
            "Time from a complete request to the last byte of its reply, for calls answered "
            "from the cache and from the metastore.",
            [
                target(quantile(0.5, duration, "source"), "p50 {{source}}"),
                target(quantile(0.99, duration, "source"), "p99 {{source}}"),
            ],
            "s",
            log_scale=True,
        ),
        timeseries(
            "Metastore latency p50 / p99",
            "Time the Hive Metastore took to answer the calls the proxy sent it, to the last byte.",
            [
                target(quantile(0.5, upstream), "p50"),
                target(quantile(0.99, upstream), "p99"),
            ],
            "s",
            log_scale=True,
        ),
        timeseries(
            "Requests / s by method (top 10)",
            "The ten methods called most in each interval, all outcomes.",
            [
                target(
                    f"topk(10, sum by (method) ({rate('hmsproxy_requests_total')}))",
                    "{{method}}",
                )
            ],
            "reqps",
        ),
        timeseries(
            "Slowest methods at the metastore (p99, top 10)",
            "Per method, the 99th percentile of the metastore's answer time; the ten slowest.",
            [target(f"topk(10, {quantile(0.99, upstream, 'method')})", "{{method}}")],
            "s",
            log_scale=True,
        ),
    ]


def metastore() -> list[Panel]:
    calls = "hmsproxy_upstream_requests_total"
    return [
        timeseries(
            "Metastore calls by outcome",
            "Calls the proxy sent to the metastore: ok, timeout (silent past "
            "--upstream-read-timeout), connection_error, protocol_error.",
            [target(f"sum by (outcome) ({rate(calls)})", "{{outcome}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "Metastore errors by method",
            "Calls to the metastore that did not end ok, by method and outcome.",
            [
                target(
                    f"sum by (method, outcome) ({rate(calls, outcome='!ok')}) > 0",
                    "{{method}} {{outcome}}",
                )
            ],
            "reqps",
        ),
        timeseries(
            "Calls bridged for old clients (HMS 4.0.1+)",
            "get_table and get_table_objects_by_name, which HMS 4.0.1 removed, answered through "
            "get_table_req / get_table_objects_by_name_req. Non-zero: engines with a Hive 2.3 "
            "client (Spark, PrestoDB, Iceberg) run against a Hive 4 metastore through the bridge.",
            [target(f"sum by (method) ({rate('hmsproxy_bridged_calls_total')})", "{{method}}")],
            "reqps",
        ),
        timeseries(
            "Connection pool",
            "Connections to the metastore, idle (kept for reuse, at most --upstream-max-idle) "
            "and active (in a call; at most --upstream-max-connections per proxy).",
            [
                target(
                    "sum by (state) (hmsproxy_upstream_connections" + sel() + ")",
                    "{{state}}",
                )
            ],
            "short",
            stack=True,
            decimals=0,
        ),
        timeseries(
            "Calls waiting for a metastore connection",
            "Calls queued at --upstream-max-connections (reads at all but an eighth of it, the "
            "rest kept for writes; heavy reads at --heavy-max-concurrent), served round-robin "
            "across users and addresses, each for at most its own --upstream-read-timeout. "
            "Non-zero for long: the metastore is slower than the calls it is asked.",
            [
                target(
                    "sum by (kind) (hmsproxy_upstream_waiting" + sel() + ")",
                    "waiting: {{kind}}",
                ),
            ],
            "short",
            decimals=0,
        ),
        timeseries(
            "Wait for a metastore connection, p99",
            "How long the calls that had to wait for a connection waited (99th percentile), by "
            "kind (read, write, heavy) and user group of --limits-file; calls that found one at "
            "once are not counted.",
            [
                target(
                    quantile(0.99, "hmsproxy_upstream_wait_seconds", by="kind, group"),
                    "{{kind}} {{group}}",
                ),
            ],
            "s",
        ),
        timeseries(
            "Connection attempts",
            "Connections opened to the metastore per second, by result; failed ones move on to "
            "the next metastore of --upstream.",
            [
                target(
                    f"sum by (result) ({rate('hmsproxy_upstream_connects_total')})",
                    "{{result}}",
                )
            ],
            "cps",
        ),
        timeseries(
            "Metastore reachable, per proxy",
            "1 while the metastore answers the proxy's health probe (every 2 s), 0 when not.",
            [target("hmsproxy_upstream_available" + sel(), "{{instance}}")],
            "short",
            bounds=(0, 1),
            decimals=0,
            width=24,
        ),
    ]


def redis() -> list[Panel]:
    return [
        timeseries(
            "Redis errors by operation",
            "Cache operations that failed or ran past --redis-timeout; each such call was "
            "answered from the metastore.",
            [
                target(
                    f"sum by (operation) ({rate('hmsproxy_cache_errors_total')})",
                    "{{operation}}",
                )
            ],
            "ops",
            stack=True,
        ),
        timeseries(
            "Redis reachable, per proxy",
            "1 while Redis answers the proxy's health probe; 0: degraded, serving from the "
            "metastore.",
            [target("hmsproxy_cache_available" + sel(), "{{instance}}")],
            "short",
            bounds=(0, 1),
            decimals=0,
        ),
    ]


def invalidation() -> list[Panel]:
    inval = "hmsproxy_invalidations_total"
    return [
        timeseries(
            "Invalidations by scope",
            "Scopes invalidated per second: catalog, database, table, partition_set, "
            "partitions, statistics, functions, privileges.",
            [target(f"sum by (scope) ({rate(inval)})", "{{scope}}")],
            "ops",
            stack=True,
        ),
        timeseries(
            "Invalidations by reason",
            "What caused them: write (through a proxy), notification (the metastore's log: a "
            "writer that bypassed the proxy), admin (invalidate/flush), ttl.",
            [target(f"sum by (reason) ({rate(inval)})", "{{reason}}")],
            "ops",
            stack=True,
        ),
        timeseries(
            "Notification lag",
            "Age of the oldest event in the metastore's notification log not applied yet (0 "
            "when caught up), per proxy; only the leader's value is current. Writes that bypass "
            "the proxy are normally seen within about a second; the dashed line is the alert "
            f"bound ({LAG_BOUND_SECONDS} s, the default table and partition TTL).",
            [target("hmsproxy_notification_lag_seconds" + sel(), "{{instance}}")],
            "s",
            threshold_line=LAG_BOUND_SECONDS,
        ),
        timeseries(
            "Notification events behind",
            "Events in the notification log not applied yet, per proxy.",
            [target("hmsproxy_notification_lag_events" + sel(), "{{instance}}")],
            "short",
            decimals=0,
        ),
        timeseries(
            "Notification events applied",
            "Events applied from the notification log, by type; gaps (events purged before "
            "they were applied, each answered with a cache flush) as their own series.",
            [
                target(
                    f"sum by (type) ({rate('hmsproxy_notification_events_total')})",
                    "{{type}}",
                ),
                target(f"sum({rate('hmsproxy_notification_gaps_total')})", "gaps"),
            ],
            "ops",
        ),
        timeseries(
            "Since the last good poll, per proxy",
            "Seconds since each proxy last polled the notification log (the leader) or checked "
            "the lease (a standby) successfully: a growing line is a follower that is stuck.",
            [
                target(
                    "time() - hmsproxy_notification_last_poll_timestamp_seconds" + sel(),
                    "{{instance}}",
                )
            ],
            "s",
        ),
        timeseries(
            "Lock fences",
            "Fences of HMS locks (Iceberg commits, Hive ACID): while a lock on a table is held "
            "or waited for, reads of its object go to the metastore. opened/closed/expired per "
            "second, and the fences in place; expired ones are locks whose unlock never came "
            "(a writer that died) and lasted --lock-fence-seconds.",
            [
                target(
                    f"sum by (event) ({rate('hmsproxy_lock_fences_total')})",
                    "{{event}}",
                ),
                target("sum(hmsproxy_lock_fences_active" + sel() + ")", "in place"),
            ],
            "short",
        ),
        timeseries(
            "Versions in process (Redis tracking)",
            "Where hits read the versions they depend on: local (the in-process copy Redis keeps "
            "coherent, no round trip) or redis, per second; streams up (every invalidation "
            "stream delivering within --redis-tracking-max-lag) and resyncs per second; "
            "proxies whose writes Redis takes (the others read nothing from it: "
            "--redis-write-trust).",
            [
                target(
                    f"sum by (source) ({rate('hmsproxy_cache_version_reads_total')})",
                    "{{source}}",
                ),
                target("sum(hmsproxy_redis_tracking_up" + sel() + ")", "streams up"),
                target("sum(hmsproxy_redis_writes_taken" + sel() + ")", "writes taken"),
                target(f"sum({rate('hmsproxy_redis_tracking_resyncs_total')})", "resyncs"),
                target(f"sum({rate('hmsproxy_shared_reads_total')})", "fenced reads shared"),
                target("sum(hmsproxy_redis_tracking_mirror_bytes" + sel() + ")", "bytes held"),
            ],
            "short",
        ),
        timeseries(
            "Invalidation delivery (another proxy's write seen here)",
            "p50 and p99 of the time from setting a beat key to its invalidation arriving "
            "through the stream: how late a write made through another proxy is seen.",
            [
                target(quantile(0.5, "hmsproxy_redis_tracking_delivery_seconds"), "p50"),
                target(quantile(0.99, "hmsproxy_redis_tracking_delivery_seconds"), "p99"),
            ],
            "s",
        ),
        timeseries(
            "Freshness checks by result",
            "Cache hits re-read from the metastore (--freshness-check-rate), per second, by "
            "result: match; mismatch (a stale reply was served: no write explains the "
            "difference, and the notification log, followed, would have shown one; alert "
            "HmsProxyStaleReplies, the log names the table); unlogged (a stale reply the log "
            "cannot show: the log not followed, column statistics, grants; expected within "
            "the TTL, not alerted on); changed (a write came in between); undecided (the "
            "follower or the store could not tell in time); failed (the metastore call "
            "failed).",
            [
                target(
                    f"sum by (result) ({rate('hmsproxy_freshness_checks_total')})",
                    "{{result}}",
                )
            ],
            "ops",
            stack=True,
        ),
        timeseries(
            "Notification follower, per proxy",
            "enabled: the proxy is set to follow the log; leader: it holds the follower lease "
            "(exactly one per Redis); active: the log is followed and moves with writes.",
            [
                target("hmsproxy_notification_enabled" + sel(), "enabled {{instance}}"),
                target("hmsproxy_notification_leader" + sel(), "leader {{instance}}"),
                target("hmsproxy_notification_active" + sel(), "active {{instance}}"),
            ],
            "short",
            bounds=(0, 1),
            decimals=0,
        ),
    ]


def clients() -> list[Panel]:
    return [
        timeseries(
            "Client connections",
            "Open connections from engines, per proxy.",
            [
                target(
                    "sum by (instance) (hmsproxy_client_connections" + sel() + ")",
                    "{{instance}}",
                )
            ],
            "short",
            stack=True,
            decimals=0,
            width=8,
        ),
        timeseries(
            "Client connections closed or refused",
            "Client connections the proxy closed, by reason: bad input (protocol, too_large, "
            "bad_message_type), a request not finished in time (timeout), and others; every "
            "reason is listed in README.md, Metrics (hmsproxy_client_errors_total).",
            [
                target(
                    f"sum by (reason) ({rate('hmsproxy_client_errors_total')})",
                    "{{reason}}",
                )
            ],
            "cps",
            width=8,
        ),
        timeseries(
            "Proxies by version",
            "Running proxies per version (hmsproxy_build_info), to follow a rollout.",
            [
                target(
                    "count by (version) (hmsproxy_build_info" + sel() + ")",
                    "{{version}}",
                )
            ],
            "short",
            decimals=0,
            width=8,
        ),
    ]


def listings() -> list[Panel]:
    lookups = "hmsproxy_listing_lookups_total"
    return [
        timeseries(
            "Listing look-ups by result",
            "Partition directory listings asked for: hit (a sealed partition's cached "
            "listing), miss (sealed, listed from storage and stored), open (listed live, never "
            "cached).",
            [target(f"sum by (result) ({rate(lookups)})", "{{result}}")],
            "ops",
            stack=True,
        ),
        timeseries(
            "Listing cache hit ratio",
            "hit / (hit + miss) over sealed partitions, and the share of listings that were of "
            "sealed partitions at all (open ones are never cached).",
            [
                target(
                    ratio(
                        f"sum({rate(lookups, result='hit')})",
                        f"sum({rate(lookups, result='~hit|miss')})",
                    ),
                    "hit ratio (sealed)",
                ),
                target(
                    ratio(f"sum({rate(lookups, result='~hit|miss')})", f"sum({rate(lookups)})"),
                    "sealed share",
                ),
            ],
            "percentunit",
            bounds=(0, 1),
        ),
        timeseries(
            "Listing latency p50 / p99",
            "storage: listing one directory; cache: one look-up of a request's cached listings "
            "(one round trip for all its partitions).",
            [
                target(
                    quantile(0.5, "hmsproxy_listing_duration_seconds", "source"),
                    "p50 {{source}}",
                ),
                target(
                    quantile(0.99, "hmsproxy_listing_duration_seconds", "source"),
                    "p99 {{source}}",
                ),
            ],
            "s",
            log_scale=True,
            width=8,
        ),
        timeseries(
            "Files returned by source",
            "Files returned in listings per second, by where the listing came from.",
            [
                target(
                    f"sum by (source) ({rate('hmsproxy_listing_files_total')})",
                    "{{source}}",
                )
            ],
            "cps",
            stack=True,
            width=8,
        ),
        timeseries(
            "Stale listing fills",
            "Listings not cached because their partition changed while they were being made "
            "(correct behaviour; a steady rate means partitions are written while read).",
            [target(f"sum({rate('hmsproxy_listing_stale_fills_total')})", "stale fills")],
            "cps",
            width=8,
        ),
    ]


def kerberos() -> list[Panel]:
    return [
        timeseries(
            "Engine authentications",
            "SASL negotiations of engines with the proxy (--client-auth kerberos), by mechanism "
            "(gssapi: Kerberos; digest-md5: a delegation token) and result; failed: a bad or "
            "expired ticket, a wrong service, no common protection, a refused token "
            "(hmsproxy_client_auth_total).",
            [
                target(
                    f"sum by (mechanism, result) ({rate('hmsproxy_client_auth_total')})",
                    "{{mechanism}} {{result}}",
                )
            ],
            "cps",
            width=8,
        ),
        timeseries(
            "Metastore authentications and tokens",
            "The proxy's own SASL negotiations with the metastore (gssapi as the proxy, "
            "digest-md5 with a user's delegation token) and its token fetches; refused: the "
            "metastore no longer knew a token (fetched again).",
            [
                target(
                    f"sum by (mechanism, result) ({rate('hmsproxy_upstream_auth_total')})",
                    "{{mechanism}} {{result}}",
                ),
                target(
                    f"sum by (event) ({rate('hmsproxy_kerberos_tokens_total')})",
                    "tokens {{event}}",
                ),
            ],
            "cps",
            width=8,
        ),
        timeseries(
            "Keytab login: time left",
            "Seconds until each proxy's Kerberos login (its TGT) expires; it logs in again "
            "before, so this saw-tooths and never reaches 0 "
            "(hmsproxy_kerberos_login_expiry_timestamp_seconds).",
            [
                target(
                    "max by (instance) (hmsproxy_kerberos_login_expiry_timestamp_seconds"
                    + sel()
                    + " > 0) - time()",
                    "{{instance}}",
                )
            ],
            "s",
            width=8,
        ),
    ]


def protections() -> list[Panel]:
    refused = "hmsproxy_refused_calls_total"
    return [
        timeseries(
            "Calls refused, by reason and group",
            "Calls answered with an error instead of being sent on: partitions_per_call (over "
            "--max-partitions-per-call, the HMS's own MetaException), reply_too_large (over "
            "--max-reply-bytes), calls_rate and partitions_rate (a bucket of --limits-file). "
            "Each is logged with the user or address and the table.",
            [target(f"sum by (reason, group) ({rate(refused)}) > 0", "{{reason}} {{group}}")],
            "reqps",
            stack=True,
        ),
        timeseries(
            "Heavy calls",
            "Calls for more than --heavy-partitions partitions at the metastore now (at most "
            "--heavy-max-concurrent per proxy) and waiting their turn: they never take the "
            "connections small calls need.",
            [
                target("sum (hmsproxy_heavy_calls_in_flight" + sel() + ")", "in flight"),
                target(
                    "sum (hmsproxy_upstream_waiting" + sel(kind="heavy") + ")",
                    "waiting",
                ),
            ],
            "short",
            decimals=0,
        ),
        timeseries(
            "Partition counts asked",
            "get_num_partitions_by_filter calls the proxy made to cost a call for partitions "
            "before sending it (kept --partition-count-ttl); failed: the metastore would not "
            "say, and the call went on uncosted.",
            [
                target(
                    f"sum by (result) ({rate('hmsproxy_partition_count_queries_total')})",
                    "{{result}}",
                )
            ],
            "reqps",
        ),
    ]


ROWS = [
    ("Overview", overview),
    ("Cache", cache),
    ("Requests and latency", requests),
    ("Metastore (upstream)", metastore),
    ("Protections", protections),
    ("Redis", redis),
    ("Invalidation and notification log", invalidation),
    ("Clients", clients),
    ("File listings", listings),
    ("Kerberos", kerberos),
]


def layout() -> list[Panel]:
    """Rows one under the other; in each, panels left to right, wrapping at 24 columns."""
    out: list[Panel] = []
    y = 0
    for title, make in ROWS:
        out.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = 0
        line_height = 0
        for panel in make():
            w, h = panel.pop("_size")
            if x + w > 24:
                x, y, line_height = 0, y + line_height, 0
            panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            out.append(panel)
            x += w
            line_height = max(line_height, h)
        y += line_height
    for i, panel in enumerate(out, start=1):
        panel["id"] = i
        for ref, t in zip("ABCDEFGHIJ", panel.get("targets", []), strict=False):
            t["refId"] = ref
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": TITLE,
        "description": "Cache, metastore, Redis, notification log and file listings of "
        "hms-cache-proxy (metrics: README.md, Metrics).",
        "tags": ["hive-metastore", "hms-cache-proxy"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "regex": "",
                    "refresh": 1,
                    "current": {},
                    "options": [],
                    "hide": 0,
                    "multi": False,
                    "includeAll": False,
                },
                variable("job", "Job", "label_values(hmsproxy_build_info, job)"),
                variable(
                    "instance",
                    "Instance",
                    'label_values(hmsproxy_build_info{job=~"$job"}, instance)',
                ),
            ]
        },
        "panels": layout(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not what {Path(__file__).name} makes: run it", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
