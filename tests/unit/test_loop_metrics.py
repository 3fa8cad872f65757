"""The hit path's plain counters (proxy.loop_metrics) expose exactly what prometheus_client's
own Counter and Histogram would, in both exposition formats."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from proxy.loop_metrics import LoopCounter, LoopHistogram
from proxy.metric_table import LATENCY_BUCKETS


def test_loop_metrics_expose_what_prometheus_clients_own_would() -> None:
    disable_created_metrics()  # type: ignore[no-untyped-call]
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    doc = "Calls answered to clients"
    counters = (
        Counter("hmsproxy_requests", doc, ["method", "outcome"], registry=theirs),
        LoopCounter("hmsproxy_requests", doc, ["method", "outcome"], ours),
    )
    histograms = (
        Histogram("hmsproxy_d", "Time", ["method"], buckets=LATENCY_BUCKETS, registry=theirs),
        LoopHistogram("hmsproxy_d", "Time", ["method"], ours, buckets=LATENCY_BUCKETS),
    )
    for counter in counters:
        counter.labels("get_table", "ok").inc()
        counter.labels("get_table", "ok").inc(2)
        counter.labels("get_table", "client_gone")  # a series at zero
    for histogram in histograms:
        for value in (0.0001, 0.0005, 0.003, 0.0031, 29.0, 31.0, 1e9):
            histogram.labels("get_table").observe(value)
        histogram.labels("get_partitions")
    assert generate_latest(ours) == generate_latest(theirs)
    assert openmetrics_latest(ours) == openmetrics_latest(theirs)  # type: ignore[no-untyped-call]
    assert ours.get_sample_value("hmsproxy_d_bucket", {"method": "get_table", "le": "0.0005"}) == 2
