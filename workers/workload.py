"""Publishing the benchmarks' workloads to real Celery workers.

The workloads themselves (``NoisyNeighbour``, ``SteadyBurst``, ``HeavyMix``, ``Giants``) and the
fairness metrics live in the package, ``priority_router.simulation``, so the simulator
replays the very documents these functions publish, and both measure them alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from celery import Celery

from priority_router.demo import documents
from priority_router.demo.documents import Wait
from priority_router.simulation.metrics import jain, p95, slowdown, waits_by_group
from priority_router.simulation.workloads import Document, Giants, HeavyMix, NoisyNeighbour, SteadyBurst

__all__ = [
    "HOLD",
    "PROCESS",
    "Document",
    "Giants",
    "HeavyMix",
    "NoisyNeighbour",
    "Sent",
    "SteadyBurst",
    "Wait",
    "jain",
    "most_at_once",
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


def publish(
    app: Celery,
    workload: NoisyNeighbour,
    wait: Wait = time.sleep,
    published: dict[str, tuple[str, float]] | None = None,
) -> dict[str, tuple[str, float]]:
    """Publish ``workload`` to the example workers' tasks (``priority_router.demo.documents.
    publish``, which the demo runs on its own task); returns task id -> (group, publish time)."""
    return documents.publish(app, workload, wait, published, hold_task=HOLD, pages_task=PROCESS)


# --- Timed workloads: bench/fairness.py --workload modes and giants ------------------------------

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


def most_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most (start, end) spans that overlap at one instant; an end and a start at the
    same instant do not overlap."""
    pairs = list(spans)
    events = sorted([(start, 1) for start, _ in pairs] + [(end, -1) for _, end in pairs])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most
