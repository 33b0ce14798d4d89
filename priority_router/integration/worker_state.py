"""What the gate reads and changes of a Celery worker's own state, in one place: Celery
documents none of it as public, so each use has a test that fails when Celery changes it
(``tests/unit/test_worker_state.py``).

- ``celery.worker.state.reserved_requests``: the requests this worker process holds, from
  receipt to their end (a prefork worker's main process holds its children's);
- ``celery.worker.state.task_ready``: forgets a request the worker will not run;
- ``Request.message`` and ``Request.acknowledged``: the kombu message behind a request, and
  whether Celery has acknowledged it.
"""

from __future__ import annotations

from typing import Any

from celery.worker import state as _state


def held_requests() -> list[Any]:
    """The requests this worker process holds now (received, not yet ended)."""
    return list(_state.reserved_requests)


def held_count() -> int:
    return len(_state.reserved_requests)


def forget(request: Any) -> None:
    """The worker will not run ``request``: it is no longer reserved, active or scheduled."""
    _state.task_ready(request)


def acknowledge_now(request: Any) -> None:
    """Acknowledge ``request``'s message now, on the calling thread (the consumer's), and
    mark it acknowledged so Celery never acknowledges it again.  ``Request.acknowledge()``
    queues the ack on the worker's event loop instead, which on RabbitMQ sends it only at
    the loop's next wake-up.  Raises what kombu raises."""
    if request.acknowledged:
        return
    try:
        request.message.ack()
    finally:
        request.acknowledged = True
