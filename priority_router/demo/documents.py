"""What a document task does and reports, and publishing a noisy-neighbour workload.

The demo's workers register ``hold`` as their one task (``priority_router.demo.worker``);
the repository's example workers (``workers/tasks.py``) run the same functions under their
own task names, and ``workers/workload.py`` publishes with ``publish``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from typing import Any

from celery import Celery, Task

from .. import headers as H
from ..simulation.workloads import NoisyNeighbour

#: The demo's task: ``hold`` as its workers register it.
HOLD = "priority_router.demo.hold_document"

#: Called as ``wait(seconds)`` between light documents; the demo collects results there.
Wait = Callable[[float], None]


def report(task: Task, client_id: str, document_id: str, started: float) -> dict[str, Any]:
    """What a document task returns: who sent it, the router's decision, when it started."""
    request = task.request
    return {
        "client_id": client_id,
        "document_id": document_id,
        "priority": getattr(request, H.PRIORITY, None),
        "pending": getattr(request, H.PENDING, None),
        "published_at": getattr(request, H.PUBLISHED_AT, None),
        "started_at": started,
        "finished_at": time.time(),
    }


def hold(task: Task, client_id: str, document_id: str, seconds: float = 0.05) -> dict[str, Any]:
    """A document that keeps a worker slot for ``seconds`` (waiting on I/O, say)."""
    started = time.time()
    time.sleep(seconds)
    return report(task, client_id, document_id, started)


def publish(
    app: Celery,
    workload: NoisyNeighbour,
    wait: Wait = time.sleep,
    published: dict[str, tuple[str, float]] | None = None,
    *,
    hold_task: str = HOLD,
    pages_task: str | None = None,
    groups: Container[str] = ("heavy", "light"),
) -> dict[str, tuple[str, float]]:
    """Publish ``workload``'s documents of ``groups`` through ``app``; returns task id ->
    (group, publish time).

    Each document is a ``hold_task`` that keeps a slot for the document's seconds, or, when
    the workload has ``pages``, a ``pages_task`` doing that much CPU work.  ``published``
    (returned) is filled in as documents go out, for a ``wait`` that watches them."""
    if workload.pages is not None and pages_task is None:
        raise ValueError("a workload with pages needs a pages_task to publish them to")
    published = {} if published is None else published
    burst_out: float | None = None
    for doc in workload.documents():
        if doc.group not in groups:
            continue
        if doc.group == "heavy":
            delay = 0.0
        else:
            burst_out = time.time() if burst_out is None else burst_out
            delay = burst_out + doc.at - time.time()
        if delay > 0:
            wait(delay)
        if workload.pages is None:
            name, args = hold_task, (doc.client_id, doc.document_id, doc.seconds)
        else:
            assert pages_task is not None
            name, args = pages_task, (doc.client_id, doc.document_id, workload.pages)
        result = app.send_task(name, args, headers={"client_id": doc.client_id})
        published[result.id] = (doc.group, time.time())
    return published
