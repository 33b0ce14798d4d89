"""Real publishes, a real broker and a real worker: light clients' documents run first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from support.services import running_worker

PROCESS = "workers.process_document"
HEAVY_DOCS = 60
LIGHT_CLIENTS = 5


def _results(app: Celery, ids: list[str], timeout: float = 120) -> list[dict[str, Any]]:
    return [app.AsyncResult(i).get(timeout=timeout) for i in ids]


@pytest.mark.compat
def test_light_clients_run_before_heavy_backlog(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    app = producer()
    ids = []
    for n in range(HEAVY_DOCS):
        ids.append(app.send_task(PROCESS, ("heavy", f"h{n}", 1), headers={"client_id": "heavy"}).id)
    for c in range(LIGHT_CLIENTS):
        for n in range(2):
            ids.append(app.send_task(PROCESS, kwargs={"client_id": f"light{c}", "document_id": f"l{n}"}).id)

    # Prefetch 1 and late acks (set by install) with one process: the worker holds
    # one message at a time, so the order it runs them is the broker's priority order.
    with running_worker(worker_env, "--pool", "solo"):
        done = _results(app, ids)

    ran = sorted(done, key=lambda r: r["started_at"])
    order = [(r["client_id"], r["priority"]) for r in ran]
    heavy_priorities = [r["priority"] for r in done if r["client_id"] == "heavy"]
    assert heavy_priorities[:22] == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9]
    assert all(p == 9 for p in heavy_priorities[21:])
    assert {r["priority"] for r in done if r["client_id"] != "heavy"} == {1}

    last_light = max(i for i, (client, _) in enumerate(order) if client != "heavy")
    heavy_before_last_light = [p for client, p in order[:last_light] if client == "heavy"]
    assert all(p == 1 for p in heavy_before_last_light), order[: last_light + 1]
    # The heavy backlog itself is served in priority order.
    heavy_run = [p for client, p in order if client == "heavy"]
    assert heavy_run == sorted(heavy_run), heavy_run


@pytest.mark.compat
def test_children_and_retries_in_a_real_worker(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    app = producer()
    for _ in range(7):  # put "acme" at priority 4 before the parent
        app.send_task("tests.record_request", kwargs={"client_id": "acme"})
    parent = app.send_task("tests.spawn_children", ("acme", "beta"), headers={"client_id": "acme"})
    retried = app.send_task("tests.retry_once", ("gamma",), headers={"client_id": "gamma"})
    with running_worker(worker_env, "--pool", "solo"):
        outcome = parent.get(timeout=60)
        same, anonymous, other = _results(app, outcome["children"])
        after_retry = retried.get(timeout=60)

    assert outcome["parent"]["priority"] == 4 and outcome["parent"]["pending"] == -7
    assert (same["priority"], same["reason"]) == (4, "inherited")
    assert (anonymous["priority"], anonymous["client_id"], anonymous["reason"]) == (4, "acme", "inherited")
    assert (other["priority"], other["pending"], other["reason"]) == (1, 0, "counted")
    assert after_retry["retries"] == 1 and after_retry["priority"] == 1
    from priority_router import PriorityRouter

    router = PriorityRouter.from_env(worker_env)
    assert router.peek("acme").pending == -7, "children are not new documents"
    assert router.peek("gamma").pending == 0, "a retry is not a new document"
