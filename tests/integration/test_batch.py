"""A batch of one client's documents, published as a Celery group inside ``router.batch``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from celery import Celery, group
from support.services import running_worker

from priority_router.router import engine_of, installed_router

SEQUENTIAL = [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9]


@pytest.mark.compat
def test_a_group_in_a_batch_gets_the_one_by_one_priorities_in_one_round_trip(
    producer: Callable[[], Celery], worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = producer()
    router = installed_router(app)
    assert router is not None
    # Before counting round trips: the counter store's connection exists, and on RabbitMQ this
    # process has made its first read of the queue migrations (then one a second, not one a publish).
    app.send_task("workers.process_document", ("warm", "w0", 0), headers={"client_id": "warm"})
    pool = engine_of(router).redis.connection_pool
    checkouts: list[object] = []
    real = pool.get_connection
    monkeypatch.setattr(pool, "get_connection", lambda *a, **k: checkouts.append(a) or real(*a, **k))

    documents = [f"d{n:02d}" for n in range(25)]
    with router.batch("acme", len(documents)):
        batch = group(app.signature("workers.process_document", ("acme", d, 0)) for d in documents)
        result = batch.apply_async(headers={"client_id": "acme"})
    assert len(checkouts) == 1, "the 25 documents were counted in one round trip"
    monkeypatch.undo()
    light = app.send_task("workers.process_document", ("light", "l0", 0), headers={"client_id": "light"})

    with running_worker(worker_env, "--pool", "solo"):
        reports = result.get(timeout=60)
        light_report = light.get(timeout=60)

    by_document = {r["document_id"]: r for r in reports}
    assert [by_document[d]["priority"] for d in documents] == SEQUENTIAL
    assert [by_document[d]["pending"] for d in documents] == [-n for n in range(25)]
    assert light_report["priority"] == 1
    # The light client's one document ran before the batch's low-priority tail.
    assert light_report["started_at"] < by_document["d24"]["started_at"]
    assert router.peek("acme").pending == -24
