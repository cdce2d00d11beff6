"""The model server's ``/metrics`` (Prometheus text format, ``prometheus-client``).

Each server has its own registry (so two servers in one process, as in the tests, do not
mix their figures). Families, all prefixed ``triplane_serve_``:

==============================  =========  ==============================================
``request_seconds``             histogram  predict latency, arrival to answer, by ``protocol``
``requests_total``              counter    predict requests by ``protocol`` and ``outcome``
                                           (``ok`` or the error kind)
``batch_rows``                  histogram  real rows per batch run (dynamic batching at work)
``batch_requests``              histogram  requests per batch run
``batch_padded_rows_total``     counter    rows added to reach a bucket size
``batch_seconds``               histogram  time to run one batch on the cluster
``retries_total``               counter    batch runs repeated after a transient failure
``reloads_total``               counter    model versions put in service (the first load too)
``model_info``                  gauge      1, labelled with the ``version`` in service
``queue_depth``                 gauge      requests waiting for a replica
==============================  =========  ==============================================
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServeMetrics"]

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "triplane_serve_"
        self.latency = Histogram(p + "request_seconds", "Predict latency, arrival to answer", ["protocol"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter(p + "requests_total", "Predict requests by outcome", ["protocol", "outcome"],
                                registry=r)
        self.batch_rows = Histogram(p + "batch_rows", "Real rows per batch run", buckets=ROW_BUCKETS,
                                    registry=r)
        self.batch_requests = Histogram(p + "batch_requests", "Requests per batch run", buckets=ROW_BUCKETS,
                                        registry=r)
        self.padded = Counter(p + "batch_padded_rows_total", "Rows added to reach a bucket size", registry=r)
        self.batch_seconds = Histogram(p + "batch_seconds", "Time to run one batch", buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.retries = Counter(p + "retries_total", "Batch runs repeated after a transient failure",
                               registry=r)
        self.reloads = Counter(p + "reloads_total", "Model versions put in service", registry=r)
        self.info = Gauge(p + "model_info", "The model version in service", ["version"], registry=r)
        self.queue = Gauge(p + "queue_depth", "Requests waiting for a replica", registry=r)

    def model_loaded(self, version: str) -> None:
        self.info.clear()
        self.info.labels(version=version).set(1)
        self.reloads.inc()

    def batch_done(self, rows: int, size: int, requests: int, seconds: float) -> None:
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)
        self.padded.inc(size - rows)
        self.batch_seconds.observe(seconds)

    def answered(self, protocol: str, outcome: str, seconds: float) -> None:
        self.requests.labels(protocol=protocol, outcome=outcome).inc()
        if outcome == "ok":
            self.latency.labels(protocol=protocol).observe(seconds)

    def render(self, queue_depth: Callable[[], int] | None = None) -> bytes:
        if queue_depth is not None:
            self.queue.set(queue_depth())
        return generate_latest(self.registry)
