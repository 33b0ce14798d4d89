"""max_wait in a real worker: a heavy client's old documents stop waiting for fresh light ones."""

from __future__ import annotations

import time
import uuid

import pytest
from support.services import broker_db_url, close_app, counter_db_url, results_db_url, running_worker

from workers.app import create_app

HOLD = "workers.hold_document"
MAX_WAIT = 1.0
HEAVY = 20
#: The light stream: a new client every 1/RATE s for STREAM s, at more documents per second
#: than two threads of DOC s can run, so strict priorities would starve the heavy client.
RATE, STREAM, DOC = 30, 6.0, 0.1
#: How often the worker looks for overdue documents, by default (its log says so).
SWEEP = 0.25


@pytest.fixture
def env(redis_server_url: str, key_prefix: str) -> dict[str, str]:
    return {
        "BROKER_URL": broker_db_url(redis_server_url),
        "RESULT_BACKEND": results_db_url(redis_server_url),
        "DOCUMENT_QUEUE": f"max-wait-{uuid.uuid4().hex[:8]}",
        "PRIORITY_ROUTER_REDIS_URL": counter_db_url(redis_server_url),
        "PRIORITY_ROUTER_KEY_PREFIX": key_prefix,
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "PRIORITY_ROUTER_MAX_WAIT": str(MAX_WAIT),
    }


@pytest.mark.compat
def test_overdue_heavy_documents_run_before_fresh_light_ones(env: dict[str, str]) -> None:
    app = create_app(env)
    try:
        with running_worker(env, "--pool", "threads", "--concurrency", "2") as worker:
            heavy = [
                app.send_task(HOLD, ("heavy", f"h{n}", DOC), headers={"client_id": "heavy"}).id
                for n in range(HEAVY)
            ]
            light = []
            start = time.monotonic()
            for n in range(int(RATE * STREAM)):
                delay = start + n / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                light.append(
                    app.send_task(HOLD, (f"light{n}", "l", DOC), headers={"client_id": f"light{n}"}).id
                )
            results = {i: app.AsyncResult(i).get(timeout=120) for i in heavy + light}
            log = worker.output()
    finally:
        close_app(app)

    assert "served first (swept every 0.25 s)" in log, log
    assert f"max_wait={MAX_WAIT:g} s" in log, log  # the worker's start-up line names it
    heavy_runs = [results[i] for i in heavy]
    assert max(r["priority"] for r in heavy_runs) >= 8  # strict priorities would starve these
    runs = sorted(results.values(), key=lambda r: r["started_at"])
    order = ["heavy" if r["client_id"] == "heavy" else "light" for r in runs]
    light_starts = [r["started_at"] for r in runs if r["client_id"] != "heavy"]
    # Once promoted (overdue, and a sweep or two later), a heavy document is served before
    # every light document still queued (all younger): only those the worker had already
    # taken (2 threads, prefetch 1 each) may start in between.  On a loaded machine heavy
    # documents can start before they are overdue (no light one queued yet): those count
    # no light document against them.
    for run in heavy_runs:
        swept_by = run["published_at"] + MAX_WAIT + 2 * SWEEP
        overtaken_by = sum(swept_by < started < run["started_at"] for started in light_starts)
        assert overtaken_by <= 4, (overtaken_by, order)
    # ... and long before the light stream is over: strictly they would run after it.
    last_light_published = max(results[i]["published_at"] for i in light)
    assert max(r["started_at"] for r in heavy_runs) < last_light_published, order
