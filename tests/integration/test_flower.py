"""A real Flower shows and finds each document's client and priority."""

from __future__ import annotations

import ast
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from support.services import Flower, running_worker


@pytest.fixture
def flower(worker_env: dict[str, str]) -> Iterator[Flower]:
    service = Flower(worker_env)
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


def wait_for(check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {check}")
        time.sleep(0.25)


def test_flower_shows_client_and_priority(
    flower: Flower, producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    app = producer()
    with running_worker(worker_env, "--pool", "solo"):
        # Flower builds its pages from events, and events sent before its receiver has
        # subscribed are gone: wait until it has heard the worker itself (status=true reads
        # Flower's event state; refresh=1 would only ask the worker over the broker).
        wait_for(lambda: any(flower.get("/api/workers?status=true").values()))
        # acme's id travels only in a header; beta's in the task's own keyword argument.
        acme = [app.send_task("tests.record_request", headers={"client_id": "acme"}).id for _ in range(4)]
        beta = app.send_task("workers.process_document", kwargs={"client_id": "beta", "document_id": "b1"})
        for tid in [*acme, beta.id]:
            app.AsyncResult(tid).get(timeout=60)

        def info(tid: str) -> dict[str, Any]:
            task = flower.get(f"/api/task/info/{tid}")
            return task if task.get("state") == "SUCCESS" and task.get("kwargs") else {}

        last = wait_for(lambda: info(acme[-1]))
        shown = ast.literal_eval(last["kwargs"])
        assert shown == {
            "priority_router_client": "acme",
            "priority_router_priority": 2,
            "priority_router_pending": -3,
        }
        assert last["args"] == "()"

        beta_info = wait_for(lambda: info(beta.id))
        beta_kwargs = ast.literal_eval(beta_info["kwargs"])
        assert beta_kwargs["client_id"] == "beta" and beta_kwargs["document_id"] == "b1"
        assert beta_kwargs["priority_router_priority"] == 1

        query = urllib.parse.quote("kwargs:priority_router_client=acme")

        def search() -> dict[str, Any]:
            found: dict[str, Any] = flower.get(f"/api/tasks?search={query}")
            return found if set(acme) <= set(found) else {}

        found = wait_for(search)
        # Flower sees every worker's events on the broker: other tests' (or suites') "acme"
        # documents may be there too, but beta's never is.
        assert set(acme) <= set(found) and beta.id not in found

        page = flower.get(f"/task/{acme[-1]}")
        assert "priority_router_client" in page and "acme" in page


def test_flower_shows_why_a_held_document_has_not_started(
    flower: Flower, producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    from priority_router import PriorityRouter

    PriorityRouter.from_env(worker_env).set_tier("bulk", max_in_flight=1)
    app = producer()
    with running_worker(worker_env, "--pool", "threads", "--concurrency", "2"):
        # Flower builds its pages from events, and events sent before its receiver has
        # subscribed are gone: wait until it has heard the worker itself (status=true reads
        # Flower's event state; refresh=1 would only ask the worker over the broker).
        wait_for(lambda: any(flower.get("/api/workers?status=true").values()))
        first = app.send_task("tests.hold_and_record", (3,), kwargs={"client_id": "bulk"})
        second = app.send_task("tests.hold_and_record", (0,), kwargs={"client_id": "bulk"})

        def held() -> dict[str, Any]:
            task: dict[str, Any] = flower.get(f"/api/task/info/{second.id}")
            return task if "priority_router_held" in str(task.get("kwargs")) else {}

        shown = wait_for(held)
        assert shown["state"] == "RECEIVED"
        assert ast.literal_eval(shown["kwargs"])["priority_router_held"] == (
            "held by its client's cap: max_in_flight=1 running"
        )
        first.get(timeout=30)
        second.get(timeout=30)

        def ran() -> dict[str, Any]:
            task: dict[str, Any] = flower.get(f"/api/task/info/{second.id}")
            return task if task.get("state") == "SUCCESS" else {}

        done = wait_for(ran)
        assert "priority_router_held" not in str(done["kwargs"])  # received again, then run
