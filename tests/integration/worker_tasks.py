"""Extra tasks the integration tests load into real workers (``WORKER_INCLUDE``)."""

from __future__ import annotations

import time
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject

from priority_router import headers as H
from priority_router.router import engine_of


def _seen(task: Task) -> dict[str, Any]:
    r = task.request
    return {
        "id": r.id,
        "client_id": getattr(r, "client_id", None),
        "priority": getattr(r, H.PRIORITY, None),
        "pending": getattr(r, H.PENDING, None),
        "reason": getattr(r, H.REASON, None),
        "retries": r.retries,
        "wire_priority": (r.delivery_info or {}).get("priority"),
    }


@shared_task(bind=True, name="tests.spawn_children")
def spawn_children(self: Task, client_id: str, other_client: str) -> dict[str, Any]:
    """A document that publishes a same-client child, an anonymous child and another client's."""
    same = record_request.apply_async(kwargs={"client_id": client_id})
    anonymous = record_request.apply_async()
    other = record_request.apply_async(kwargs={"client_id": other_client})
    return {"parent": _seen(self), "children": [same.id, anonymous.id, other.id]}


@shared_task(bind=True, name="tests.record_request")
def record_request(self: Task, client_id: str | None = None) -> dict[str, Any]:
    return _seen(self)


@shared_task(bind=True, name="tests.retry_once", max_retries=3, default_retry_delay=0)
def retry_once(self: Task, client_id: str) -> dict[str, Any]:
    seen = _seen(self)
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return seen


@shared_task(bind=True, name="tests.hold_and_record")
def hold_and_record(self: Task, seconds: float, client_id: str | None = None) -> dict[str, Any]:
    started = time.time()
    time.sleep(seconds)
    return {**_seen(self), "started_at": started}


_rejected: set[str] = set()


@shared_task(bind=True, name="tests.reject_once")
def reject_once(self: Task, client_id: str) -> dict[str, Any]:
    """Rejected with requeue on its first run (run it on a threads or solo pool: the set
    of rejected ids is this process's); the second run reports its client's in-flight list."""
    if self.request.id not in _rejected:
        _rejected.add(self.request.id)
        raise Reject("not yet", requeue=True)
    from priority_router.router import installed_router

    router = installed_router(self.app)
    assert router is not None and engine_of(router).inflight is not None
    return {
        **_seen(self),
        "in_flight": engine_of(router).redis.llen(engine_of(router).inflight.key(client_id)),
    }


@shared_task(bind=True, name="tests.count_run")
def count_run(self: Task, client_id: str | None = None) -> None:
    """Counts each run of a document by its id in ``RUNS_KEY`` (a hash in ``RUNS_REDIS_URL``),
    so a test sees a document that ran twice or never."""
    import os

    import redis

    client = redis.Redis.from_url(os.environ["RUNS_REDIS_URL"])
    try:
        client.hincrby(os.environ["RUNS_KEY"], self.request.id, 1)
    finally:
        client.close()


#: Raises the running count of a client and keeps its maximum, in one step.
_ENTER = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local m = tonumber(redis.call('HGET', KEYS[1], 'max:' .. ARGV[1]) or '0')
if n > m then redis.call('HSET', KEYS[1], 'max:' .. ARGV[1], n) end
return n
"""


@shared_task(bind=True, name="tests.track_running")
def track_running(self: Task, seconds: float, client_id: str) -> dict[str, Any]:
    """Runs ``seconds`` while counting how many documents of ``client_id`` run at once
    (hash ``RUNS_KEY`` in ``RUNS_REDIS_URL``: ``<client>`` running now, ``max:<client>`` the
    most seen), and each run of a document by id; returns when it started and ended."""
    import os

    import redis

    client = redis.Redis.from_url(os.environ["RUNS_REDIS_URL"])
    key = os.environ["RUNS_KEY"]
    try:
        started = time.time()
        client.eval(_ENTER, 1, key, client_id)
        client.hincrby(key, f"run:{self.request.id}", 1)
        try:
            time.sleep(seconds)
        finally:
            client.hincrby(key, client_id, -1)
        return {"client_id": client_id, "started": started, "ended": time.time()}
    finally:
        client.close()
