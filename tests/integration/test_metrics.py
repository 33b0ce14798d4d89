"""Prometheus metrics, scraped over HTTP from real processes."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families
from support.services import close_app, free_port, running_worker

from priority_router.metrics import serve
from workers.app import create_app


@pytest.fixture(autouse=True)
def metrics_on(worker_env: dict[str, str]) -> None:
    """Metrics are opt-in: these publishers and workers ask for them."""
    worker_env["PRIORITY_ROUTER_METRICS"] = "true"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_publisher_counts_assignments_and_counter_round_trips(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    port = serve(0, addr="127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    before = scrape(url)
    app = producer()
    for n in range(5):
        app.send_task("workers.hold_document", ("acme", f"d{n}", 0), headers={"client_id": "acme"})
    app.send_task("workers.hold_document", ("nobody", "x", 0))
    after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("priority_router_assignments_total", priority="1", reason="counted") == 3
    assert delta("priority_router_assignments_total", priority="2", reason="counted") == 2
    assert delta("priority_router_assignments_total", priority="5", reason="no-client") == 1
    assert delta("priority_router_counter_seconds_count") == 5
    assert delta("priority_router_fail_open_total") == 0

    # A counter store that refuses: every publish still goes out, priced by the publisher's
    # own counts, and is counted in fail_open_total.
    down = create_app({**worker_env, "PRIORITY_ROUTER_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    for n in range(3):
        down.send_task("workers.hold_document", ("acme", f"x{n}", 0), headers={"client_id": "acme"})
    close_app(down)
    final = scrape(url)
    assert (
        value(final, "priority_router_fail_open_total") - value(after, "priority_router_fail_open_total") == 3
    )
    local = ("priority_router_assignments_total", (("priority", "1"), ("reason", "local")))
    assert final.get(local, 0) - after.get(local, 0) == 3


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_worker_serves_queue_wait_by_priority(
    pool: str, producer: Callable[[], Celery], worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    env = {**worker_env, "PRIORITY_ROUTER_METRICS_PORT": str(port)}
    if pool == "prefork":
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    app = producer()
    ids = [
        app.send_task("workers.hold_document", ("acme", f"d{n}", 0), headers={"client_id": "acme"}).id
        for n in range(5)
    ]
    with running_worker(env, "--pool", pool, "--concurrency", "2"):
        for tid in ids:
            app.AsyncResult(tid).get(timeout=60)
        samples = scrape(f"http://127.0.0.1:{port}/metrics")

    assert value(samples, "priority_router_queue_wait_seconds_count", priority="1") == 3
    assert value(samples, "priority_router_queue_wait_seconds_count", priority="2") == 2
    # Published before the worker started, so each waited at least the worker's start-up.
    assert value(samples, "priority_router_queue_wait_seconds_sum", priority="1") > 0


def test_worker_counts_documents_held_by_their_clients_limits_and_released(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    from priority_router import PriorityRouter

    PriorityRouter.from_env(worker_env).set_tier("bulk", max_in_flight=1)
    port = free_port()
    env = {**worker_env, "PRIORITY_ROUTER_METRICS_PORT": str(port)}
    app = producer()
    docs = [app.send_task("tests.hold_and_record", (0.2,), kwargs={"client_id": "bulk"}) for _ in range(4)]
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        for doc in docs:
            doc.get(timeout=60)
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
    held = value(samples, "priority_router_held_total", reason="cap")
    assert held >= 1
    assert value(samples, "priority_router_released_total") == held
    assert value(samples, "priority_router_held_total", reason="rate") == 0


def test_a_worker_whose_metrics_port_is_taken_says_so_once_and_runs(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    with socket.socket() as taken:  # another node of the host serves it (celery multi, one env)
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        app = producer()
        sent = app.send_task("workers.hold_document", ("acme", "d", 0), headers={"client_id": "acme"})
        with running_worker(
            {**worker_env, "PRIORITY_ROUTER_METRICS_PORT": str(port)}, "--pool", "solo"
        ) as worker:
            sent.get(timeout=60)
            log = worker.output()
    assert log.count(f"cannot serve metrics on port {port}") == 1, log
    assert "own metrics_port (0 picks a free one" in log
    assert "Traceback" not in log and "raised:" not in log, log
