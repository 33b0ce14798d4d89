"""Prometheus metrics, with the ``metrics`` extra (``prometheus_client``) installed.

Publishing side (any process that publishes through an installed router):

- ``priority_router_assignments_total{priority,reason}``: documents stamped, by logical
  priority and how it was decided (counted, inherited, no-client, local, fail-open).
- ``priority_router_fail_open_total``: publishes the counter store did not count because
  it could not answer (or its circuit breaker was open): priced by the publisher's own
  counts (``local``) or given ``default_priority`` (``fail-open``).
- ``priority_router_counter_seconds``: round-trip time of one counter check.
- ``priority_router_last_row_total``: documents counted past the threshold table's lowest
  limit, at its least urgent priority, where clients are served first in first out among
  themselves; ``priority-router status`` says which clients share it.

Worker side:

- ``priority_router_queue_wait_seconds{priority}``: start time minus publish time (the
  publish time travels in a header), the production measure of fairness.

Metrics go to ``prometheus_client``'s default registry.  A worker serves them on
``metrics_port`` (see :func:`serve`); with the prefork pool, tasks run in child
processes, so set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the worker
starts and the served registry aggregates every child.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from . import headers as H
from .decision import Decision, Reason

logger = logging.getLogger("priority_router")

try:
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only without the extra
    prometheus_client = None  # type: ignore[assignment]

_lock = threading.Lock()
_metrics: RouterMetrics | None = None

COUNTER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600)


class RouterMetrics:
    """The router's metric families, registered once per process."""

    def __init__(self) -> None:
        assert prometheus_client is not None
        pc = prometheus_client
        self.assignments = pc.Counter(
            "priority_router_assignments",
            "Documents given a priority, by logical priority (1 most urgent) and how it was decided.",
            ["priority", "reason"],
        )
        self.fail_open = pc.Counter(
            "priority_router_fail_open",
            "Publishes the counter store did not count because it could not answer (reason local "
            "or fail-open).",
        )
        self.counter_seconds = pc.Histogram(
            "priority_router_counter_seconds",
            "Round-trip time of one pending-counter check.",
            buckets=COUNTER_BUCKETS,
        )
        self.queue_wait = pc.Histogram(
            "priority_router_queue_wait_seconds",
            "Seconds from publish to task start, by logical priority.",
            ["priority"],
            buckets=WAIT_BUCKETS,
        )
        self.last_row = pc.Counter(
            "priority_router_last_row",
            "Documents counted past the threshold table's lowest limit (its last row), where "
            "clients are served first in first out among themselves.",
        )
        self.held = pc.Counter(
            "priority_router_held",
            "Documents the worker's gate held by their client's limits, by what held them (cap, rate).",
            ["reason"],
        )
        self.released = pc.Counter(
            "priority_router_released",
            "Held documents the gate released and published again.",
        )

    def record_held(self, reason: str) -> None:
        self.held.labels(reason if reason in ("cap", "rate") else "cap").inc()

    def record_decision(self, decision: Decision, last_limit: int | None = None) -> None:
        """Count one decision; ``last_limit``, the table's lowest limit, counts it past the
        table's last row when its count is under it."""
        self.assignments.labels(str(decision.priority), decision.reason.value).inc()
        if decision.reason is Reason.LOCAL or decision.reason is Reason.FAIL_OPEN:
            self.fail_open.inc()
        elif (
            last_limit is not None
            and decision.reason is Reason.COUNTED
            and decision.pending is not None
            and int(decision.pending) < last_limit
        ):
            self.last_row.inc()

    def observe_start(self, request: Any, now: float | None = None) -> None:
        """Record one task's queue wait from its request's router headers."""
        published = getattr(request, H.PUBLISHED_AT, None)
        priority = getattr(request, H.PRIORITY, None)
        if not isinstance(published, int | float) or not isinstance(priority, int):
            return
        wait = (time.time() if now is None else now) - float(published)
        self.queue_wait.labels(str(priority)).observe(max(0.0, wait))


def get_metrics() -> RouterMetrics | None:
    """The process's metrics, or None without ``prometheus_client``."""
    global _metrics
    if prometheus_client is None:
        return None
    with _lock:
        if _metrics is None:
            _metrics = RouterMetrics()
        return _metrics


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Serve the metrics over HTTP on ``port`` (0 picks a free one); returns the port.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, the served registry aggregates every process
    writing to that directory (prefork children included).
    """
    if prometheus_client is None:
        from .errors import ConfigurationError

        raise ConfigurationError(
            "metrics_port",
            "prometheus_client is not installed",
            "pip install 'priority-router[metrics]', or unset metrics_port",
        )
    registry: Any = prometheus_client.REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _ = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    return int(server.server_port)
