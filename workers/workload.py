"""Publishing the benchmarks' workloads to real Celery workers.

The workloads themselves (``NoisyNeighbour``, ``SteadyBurst``, ``HeavyMix``) and the
fairness metrics live in the package, ``priority_router.simulation``, so the simulator
replays the very documents these functions publish, and both measure them alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from celery import Celery

from priority_router.simulation.metrics import jain, p95, slowdown, waits_by_group
from priority_router.simulation.workloads import Document, HeavyMix, NoisyNeighbour, SteadyBurst

__all__ = [
    "HOLD",
    "PROCESS",
    "Document",
    "HeavyMix",
    "NoisyNeighbour",
    "Sent",
    "SteadyBurst",
    "Wait",
    "jain",
    "p95",
    "publish",
    "publish_steady_burst",
    "publish_timed",
    "send",
    "slowdown",
    "waits_by_group",
]

HOLD = "workers.hold_document"
PROCESS = "workers.process_document"

#: Called as ``wait(seconds)`` between light documents; the demo collects results there.
Wait = Callable[[float], None]


def publish(
    app: Celery,
    workload: NoisyNeighbour,
    wait: Wait = time.sleep,
    published: dict[str, tuple[str, float]] | None = None,
) -> dict[str, tuple[str, float]]:
    """Publish ``workload`` through ``app``; returns task id -> (group, publish time).

    ``published`` (returned) is filled in as documents go out, for a ``wait`` that
    watches them."""
    published = {} if published is None else published
    burst_out: float | None = None
    for doc in workload.documents():
        if doc.group == "heavy":
            delay = 0.0
        else:
            burst_out = time.time() if burst_out is None else burst_out
            delay = burst_out + doc.at - time.time()
        if delay > 0:
            wait(delay)
        if workload.pages is None:
            name, args = HOLD, (doc.client_id, doc.document_id, doc.seconds)
        else:
            name, args = PROCESS, (doc.client_id, doc.document_id, workload.pages)
        result = app.send_task(name, args, headers={"client_id": doc.client_id})
        published[result.id] = (doc.group, time.time())
    return published


# --- Fairness between counting modes (bench/fairness_modes.py) ---------------------------------

#: Task id -> (the document, the publisher's clock just after ``send_task`` returned).
Sent = dict[str, tuple[Document, float]]


def send(app: Celery, doc: Document) -> tuple[str, float]:
    """Publish one ``hold_document``; returns (task id, publisher's clock after the send)."""
    result = app.send_task(
        HOLD, (doc.client_id, doc.document_id, doc.seconds), headers={"client_id": doc.client_id}
    )
    return result.id, time.time()


def publish_timed(app: Celery, docs: list[Document], wait: Wait = time.sleep) -> Sent:
    """Publish ``docs`` (sorted by ``at``), each ``at`` seconds after the first went out."""
    sent: Sent = {}
    start = time.time()
    for doc in docs:
        delay = start + doc.at - time.time()
        if delay > 0:
            wait(delay)
        tid, at = send(app, doc)
        sent[tid] = (doc, at)
    return sent


def publish_steady_burst(app: Celery, workload: SteadyBurst, timeout: float = 300) -> Sent:
    """Run ``workload``: the steady client waits for each result before its next document."""
    steady, burst = workload.documents()
    sent: Sent = {}
    for n, doc in enumerate(steady):
        if n == workload.burst_after:
            for heavy in burst:
                tid, at = send(app, heavy)
                sent[tid] = (heavy, at)
        tid, at = send(app, doc)
        sent[tid] = (doc, at)
        app.AsyncResult(tid).get(timeout=timeout)
    return sent
