"""mode="inflight": the worker's main process ends a document whose process was lost.

Celery 5.7 puts the document's request on the task's stack while it sends ``task_failure``
for it; Celery 5.4 to 5.6 do not, so there ``task.request`` is the main process's empty
one and the end is found by the id among the requests that process received
(integration/endings.py).  The real thing, a killed prefork child, is
tests/integration/test_inflight_workers.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from celery import Celery
from celery.app.task import Context
from celery.exceptions import WorkerLostError
from celery.signals import task_failure, task_received

from priority_router import PriorityRouter
from priority_router import headers as H
from priority_router.integration.endings import watch_endings
from priority_router.router import engine_of


class Request:
    """What ``task_received`` passes: a worker's request, with the message's headers."""

    def __init__(self, task_id: str, client: str) -> None:
        self.id = task_id
        self.request_dict: dict[str, Any] = {"id": task_id, "client_id": client, H.INFLIGHT: True}


@pytest.fixture
def app() -> Celery:
    return Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)


@pytest.fixture
def router(app: Celery) -> Iterator[PriorityRouter]:
    router = PriorityRouter(mode="inflight", redis_client=fakeredis.FakeRedis())
    router.install(app)
    watch_endings()  # as the app's first settle does
    router.record("acme", "lost")
    router.record("acme", "other")
    assert router.peek("acme").pending == -1
    yield router
    router.uninstall(app)


def _task(app: Celery) -> Any:
    def process() -> None:
        pass

    return app.task(name="docs.process", shared=False)(process)


@pytest.mark.parametrize("on_the_stack", [True, False], ids=["celery-5.7", "celery-5.4-to-5.6"])
def test_a_lost_documents_failure_ends_it_once(
    app: Celery, router: PriorityRouter, on_the_stack: bool
) -> None:
    task = _task(app)
    request = Request("lost", "acme")
    task_received.send(sender=None, request=request)
    if on_the_stack:
        task.request_stack.push(Context(request.request_dict))
    try:
        for _ in range(2):  # reported twice, ended once
            task_failure.send(sender=task, task_id="lost", exception=WorkerLostError("lost"))
    finally:
        if on_the_stack:
            task.request_stack.pop()
    assert router.peek("acme").pending == 0
    assert (
        engine_of(router).redis.lrange(engine_of(router).store.key("acme"), 0, -1) != []
    )  # "other" is still in flight


def test_an_ordinary_failure_or_an_unknown_id_ends_nothing(app: Celery, router: PriorityRouter) -> None:
    task = _task(app)
    request = Request("lost", "acme")
    task_received.send(sender=None, request=request)
    # An ordinary failure is ended by task_postrun in the process that ran it.
    task_failure.send(sender=task, task_id="lost", exception=ValueError("bad input"))
    # A document this process never received.
    task_failure.send(sender=task, task_id="elsewhere", exception=WorkerLostError("lost"))
    assert router.peek("acme").pending == -1
