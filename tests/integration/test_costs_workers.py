"""A cost per document with real publishes and real workers, on both brokers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from support.celery_versions import skip_without_fast_redelivery
from support.services import close_app, fast_redelivery, kill_worker_mid_work, running_worker

from priority_router import PriorityRouter
from priority_router import headers as H
from priority_router.router import engine_of
from workers.app import create_app

HOLD = "tests.hold_and_record"


def _router(env: dict[str, str]) -> PriorityRouter:
    return PriorityRouter.from_env(env, socket_timeout=5, connect_timeout=5)


def _app(producer: Callable[[], Celery], env: dict[str, str]) -> Celery:
    app = producer()
    app.conf.priority_router_mode = env.get("PRIORITY_ROUTER_MODE", "seed")
    if "BROKER_TRANSPORT_OPTIONS" in env:
        app.conf.broker_transport_options = json.loads(env["BROKER_TRANSPORT_OPTIONS"])
    return app


def test_a_costed_document_then_an_uncosted_one_go_out_at_the_priorities_costs_give(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    app = _app(producer, worker_env)
    scan = app.send_task(HOLD, (0,), headers={"client_id": "acme", H.COST: 12})
    invoice = app.send_task(HOLD, (0,), headers={"client_id": "acme"})
    with running_worker(worker_env, "--pool", "solo"):
        first, second = scan.get(timeout=60), invoice.get(timeout=60)
    # The scan is checked at 0; the invoice after it at -12: priority 6 (under -10).
    assert (first["pending"], first["priority"]) == (0, 1)
    assert (second["pending"], second["priority"]) == (-12, 6)


def test_the_cost_getter_prices_documents_and_the_header_carries_it(worker_env: dict[str, str]) -> None:
    from celery.signals import before_task_publish

    app = create_app({**worker_env, "WORKERS_ROUTER": "off"})
    router = PriorityRouter.from_env(worker_env, cost_getter=lambda name, args, kwargs, headers: args[0] * 10)
    router.install(app)
    sent: list[dict[str, object]] = []

    def seen(headers: dict[str, object] | None = None, **_: object) -> None:
        sent.append(dict(headers or {}))

    before_task_publish.connect(seen, weak=False)
    try:
        app.send_task(HOLD, (0.25,), headers={"client_id": "acme"})
        app.send_task(HOLD, (0.25,), headers={"client_id": "acme", H.COST: "4"})
    finally:
        before_task_publish.disconnect(seen)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(worker_env["DOCUMENT_QUEUE"])
        close_app(app)
    assert [h[H.COST] for h in sent] == [2.5, 4]  # the header wins over the getter
    assert "'priority_router_cost': 2.5" in str(sent[0]["kwargsrepr"])
    assert [h[H.PENDING] for h in sent] == [0, -2.5]
    assert router.state("acme").counted == 6.5


def test_inflight_costs_return_to_zero_after_every_end_even_a_killed_workers(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    skip_without_fast_redelivery(worker_env["BROKER_URL"])
    env = {**worker_env, "PRIORITY_ROUTER_MODE": "inflight"}
    if worker_env["BROKER_URL"].startswith("redis"):
        env["BROKER_TRANSPORT_OPTIONS"] = fast_redelivery(env)
    app = _app(producer, env)
    router = _router(env)
    costs = [7, 1, 2.5, 1, 30, 0.5]
    ids = [
        app.send_task(HOLD, (1.5,), headers={"client_id": "acme", H.COST: c}).id
        if c != 1
        else app.send_task(HOLD, (1.5,), headers={"client_id": "acme"}).id
        for c in costs
    ]
    assert router.state("acme").counted == sum(costs)

    kill_worker_mid_work(env, "--pool", "threads", "--concurrency", "2")
    unfinished = [i for i in ids if not app.AsyncResult(i).ready()]
    assert unfinished, "the kill came too late to leave any document unfinished"
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        for i in ids:
            app.AsyncResult(i).get(timeout=120)
        deadline = time.monotonic() + 30
        while router.state("acme").counted and time.monotonic() < deadline:
            time.sleep(0.05)
    state = router.state("acme")
    assert (state.counted, state.pending) == (0, 0)
    assert not engine_of(router).redis.exists(engine_of(router).store.key("acme"))


def test_inspect_and_status_show_a_clients_counted_cost(
    cli: Callable[..., Any], counter_url: str, key_prefix: str
) -> None:
    router = PriorityRouter(counter_url, key_prefix=key_prefix)
    router.record("scans", cost=30)
    router.record("scans", cost=2.5)

    inspected = json.loads(cli("inspect", "scans", "--json").output)
    (row,) = json.loads(cli("status", "--json").output)

    assert (inspected["counted"], inspected["pending"], inspected["priority"]) == (32.5, -31.5, 9)
    assert (row["client_id"], row["pending"], row["priority"]) == ("scans", -31.5, 9)
