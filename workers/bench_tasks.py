"""Documents that report they ran, for ``bench/end_to_end.py`` and ``bench/kill_loss.py``.

Loaded only when asked for (``WORKER_INCLUDE=workers.bench_tasks``).  Each run increments
a counter in Redis; the run that brings it to ``target`` also pushes its finish time onto
``<counter_key>:end``, so the benchmark learns when the last document ran without a
result backend and without polling.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Task, shared_task

_clients: dict[str, redis.Redis] = {}


def _client(url: str) -> redis.Redis:
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url)
    return client


@shared_task(name="workers.count_document", acks_late=True, ignore_result=True)
def count_document(client_id: str, document_id: str, counter_url: str, counter_key: str, target: int) -> None:
    """Count one run of a document; the ``target``-th run records the time it finished."""
    client = _client(counter_url)
    if int(client.incr(counter_key)) == target:
        client.rpush(counter_key + ":end", repr(time.time()))


@shared_task(bind=True, name="workers.count_and_sleep")
def count_and_sleep(self: Task, seconds: float, client_id: str | None = None) -> None:
    """Counts the document's start by its id in ``RUNS_KEY`` (a hash in ``RUNS_REDIS_URL``),
    then holds its slot ``seconds``: a document that never started is missing there
    (``bench/kill_loss.py``)."""
    client = _client(os.environ["RUNS_REDIS_URL"])
    client.hincrby(os.environ["RUNS_KEY"], self.request.id, 1)
    time.sleep(seconds)
