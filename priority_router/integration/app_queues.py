"""The queues an app's documents go to: declared ones, the default, and those its
``task_routes`` name (Celery creates those on the first publish, so they are in no list
until then)."""

from __future__ import annotations

from typing import Any

from celery import Celery


def queue_names(app: Celery) -> list[str]:
    """Every queue ``app`` declares or routes to, in a stable order (declared first)."""
    names = [q.name for q in app.amqp.queues.values()]
    for name in [app.conf.task_default_queue, *routed_queue_names(app)]:
        if name and name not in names:
            names.append(name)
    return names


def routed_queue_names(app: Celery) -> list[str]:
    """The queues named in ``task_routes`` maps and patterns (routing functions cannot be
    read without calling them, so their queues are not known here)."""
    found: list[str] = []
    for route in app.amqp.router.routes:
        for table in (getattr(route, "map", None), getattr(route, "patterns", None)):
            for value in (table or {}).values():
                name = _queue_of(value)
                if name and name not in found:
                    found.append(name)
    return found


def declare_routed(app: Celery) -> None:
    """Add the routed queues to ``app.amqp.queues`` as Celery does on a first publish, so
    checks see their arguments (``x-max-priority``)."""
    queues = app.amqp.queues
    for name in routed_queue_names(app):
        if name not in queues and queues.create_missing:
            queues[name]


def _queue_of(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        queue = value.get("queue")
        return queue if isinstance(queue, str) else getattr(queue, "name", None)
    return None
