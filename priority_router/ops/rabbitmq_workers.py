"""The Celery workers consuming a RabbitMQ queue that is about to be swapped.

A worker whose queue is deleted under it takes the broker's ``basic.cancel`` for a lost
connection: it drops the documents it had prefetched (unacknowledged, so RabbitMQ would
give them back, but to the deleted queue: they are gone), reconnects, and declares the
queue again as its own kind.  So before the swap each worker consuming the queue is told
to stop (Celery's remote control ``cancel_consumer``, logged by the worker as ``Canceling
queue QUEUE``), and the migration waits until none consumes it and none holds a document
of it unacknowledged: those it had prefetched it still runs and acknowledges.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from celery import Celery

#: Seconds each remote-control inspection waits for the workers' replies.
INSPECT_TIMEOUT = 1.0


def roster(app: Celery) -> dict[str, list[str]]:
    """Every worker that answers remote control, and the queues it consumes."""
    with app.connection_for_write() as conn:
        active = app.control.inspect(timeout=INSPECT_TIMEOUT, connection=conn).active_queues() or {}
    return {w: sorted(str(q.get("name")) for q in queues or ()) for w, queues in sorted(active.items())}


def consuming(workers: dict[str, list[str]], queue: str) -> list[str]:
    return [w for w, queues in workers.items() if queue in queues]


def cancel(app: Celery, queue: str) -> None:
    """Tell every worker to stop consuming ``queue``.  Sent to all, not only those that
    answered: a worker busy on the solo pool reads it once its task ends."""
    with app.connection_for_write() as conn:
        app.control.cancel_consumer(queue, connection=conn)


def held(app: Celery, routes: Iterable[tuple[str, str]], workers: list[str]) -> dict[str, int]:
    """Per worker of ``workers``, the documents it holds unacknowledged that came through
    ``routes`` (``(exchange, routing key)`` pairs): reserved, scheduled (ETA) or running
    with late acks.  Each inspection returns once every worker named has answered."""
    wanted = set(routes)
    if not workers:
        return {}
    with app.connection_for_write() as conn:
        inspect = app.control.inspect(destination=workers, timeout=INSPECT_TIMEOUT, connection=conn)
        reserved = inspect.reserved() or {}
        scheduled = inspect.scheduled() or {}
        active = inspect.active() or {}
    found: dict[str, set[str]] = {}
    for worker, requests in reserved.items():
        found.setdefault(worker, set()).update(_ids(requests, wanted))
    for worker, entries in scheduled.items():
        found.setdefault(worker, set()).update(_ids((e.get("request") or {} for e in entries or ()), wanted))
    for worker, requests in active.items():
        unacked = [r for r in requests or () if not r.get("acknowledged")]
        found.setdefault(worker, set()).update(_ids(unacked, wanted))
    return {w: len(ids) for w, ids in sorted(found.items()) if ids}


def _ids(requests: Iterable[Any], wanted: set[tuple[str, str]]) -> set[str]:
    ids = set()
    for request in requests:
        info = request.get("delivery_info") or {}
        if (str(info.get("exchange") or ""), str(info.get("routing_key") or "")) in wanted:
            ids.add(str(request.get("id")))
    return ids


def wait_until(check: Any, timeout: float, interval: float = 0.5) -> Any:
    """Call ``check()`` until it returns something falsy or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if not value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
