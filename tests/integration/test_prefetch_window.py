"""A real prefork worker's prefetch window (integration/window.py): one document beyond its
slots on RabbitMQ while its documents are short, back to its slots on long ones; exactly its
slots on Redis and on other pools; and light clients still go first."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from support.services import running_worker

HOLD = "workers.hold_document"


def _window(app: Celery) -> int:
    stats = app.control.inspect(timeout=10, limit=1).stats() or {}  # limit: no wait for more
    assert len(stats) == 1, stats
    (reported,) = stats.values()
    return int(reported["prefetch_count"])


def _drain(app: Celery, client: str, n: int, seconds: float) -> list[dict[str, Any]]:
    sent = [
        app.send_task(HOLD, (client, f"{client}{i}", seconds), headers={"client_id": client})
        for i in range(n)
    ]
    return [r.get(timeout=60) for r in sent]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_the_window_widens_on_short_documents_and_narrows_on_long_ones_only_for_prefork_on_rabbitmq(
    broker_url: str, worker_env: dict[str, str], producer: Callable[[], Celery], pool: str
) -> None:
    app = producer()
    widens = broker_url.startswith("amqp") and pool == "prefork"
    with running_worker(worker_env, "--pool", pool, "--concurrency", "2"):
        assert _window(app) == 2
        _drain(app, "short", 60, 0.01)
        assert _window(app) == (3 if widens else 2)
        _drain(app, "long", 8, 0.5)
        assert _window(app) == 2


def test_a_light_clients_document_passes_a_heavy_backlog_of_short_documents(
    worker_env: dict[str, str], producer: Callable[[], Celery]
) -> None:
    app = producer()
    heavy = [
        app.send_task(HOLD, ("heavy", f"h{n}", 0.02), headers={"client_id": "heavy"}) for n in range(200)
    ]
    with running_worker(worker_env, "--pool", "prefork", "--concurrency", "2"):
        for r in heavy[:40]:
            r.get(timeout=30)  # the worker drains the heavy client's backlog, its window wide
        sent_at = time.time()
        light = app.send_task(HOLD, ("light", "l0", 0.02), headers={"client_id": "light"})
        started = light.get(timeout=30)["started_at"]
        heavy_starts = [r.get(timeout=60)["started_at"] for r in heavy]
    # Started after it was sent and before it: at most the window it found full (2 slots
    # + 1 ahead) and the one a freed slot takes from it before the broker sends it.
    overtaking = sum(1 for t in heavy_starts if sent_at <= t < started)
    assert overtaking <= 2 + 1 + 1, overtaking
    assert sum(1 for t in heavy_starts if t >= started) > 100, "the light one went before the backlog"
