"""A threads worker, a real worker process on each broker: each document starts as a thread
frees, also with a kombu before 5.7 (Celery 5.5's), where the router wakes the worker's
event loop itself (``integration/old_kombu.py``).  ``make matrix`` runs it on each kombu."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from celery import Celery
from support.services import running_worker

from priority_router.integration.old_kombu import FULL, kombu_version

HOLD = "tests.hold_and_record"
DEGRADED = "is older than 5.7, so this worker runs degraded"


@pytest.mark.compat
def test_a_threads_worker_starts_each_document_as_a_thread_frees(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    app = producer()
    for _ in range(20):
        app.send_task(HOLD, (0.05, "acme"))
    with running_worker(worker_env, "--pool", "threads", "--concurrency", "2") as worker:
        # The worker's log, not AsyncResult.get(): Celery 5.4's Redis result backend can hang
        # collecting results from a loop (the oldest row's).
        started = time.monotonic()
        while worker.output().count(" succeeded in ") < 20 and time.monotonic() - started < 60:
            time.sleep(0.05)
        took = time.monotonic() - started
        log = worker.output()
    assert log.count(" succeeded in ") == 20, log[-3000:]
    # 20 documents of 50 ms on 2 threads are 0.5 s of work.  A loop that wakes only on its
    # own starts about one document a second (10 s and more here): the bound leaves a slow
    # machine ten times the work.
    assert took < 5, f"{took:.1f} s for 0.5 s of work: the worker's loop is not woken"
    assert log.count(DEGRADED) == (1 if kombu_version() < FULL else 0), log
