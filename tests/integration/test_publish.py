"""What a real Celery publish puts on the broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from support.broker import drain
from support.services import close_app

from priority_router import PriorityRouter, Transport, from_wire
from priority_router import headers as H

pytestmark = pytest.mark.compat


def transport_of(app: Celery) -> Transport:
    with app.connection_for_read() as conn:
        return Transport(conn.transport.driver_type)


def test_message_carries_the_decision(producer: Callable[[], Celery], worker_env: dict[str, str]) -> None:
    app = producer()
    for n in range(4):
        app.send_task("workers.process_document", ("acme", f"d{n}", 1), headers={"client_id": "acme"})
    app.send_task("workers.process_document", kwargs={"client_id": 42, "document_id": "x"})
    app.send_task("workers.process_document", ("nobody", "y"))

    messages = drain(app, worker_env["DOCUMENT_QUEUE"])
    transport = transport_of(app)
    seen = [
        (
            m.headers.get("client_id"),
            m.headers[H.PRIORITY],
            m.headers[H.PENDING],
            from_wire(m.properties["priority"], transport),
        )
        for m in messages
    ]
    assert sorted(seen, key=str) == sorted(
        [
            ("acme", 1, 0, 1),
            ("acme", 1, -1, 1),
            ("acme", 1, -2, 1),
            ("acme", 2, -3, 2),
            ("42", 1, 0, 1),
            (None, 5, None, 5),
        ],
        key=str,
    )


def test_other_app_in_the_same_process_is_untouched(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    routed = producer()
    plain = Celery("plain", broker=worker_env["BROKER_URL"], set_as_current=False)
    plain_queue = f"plain-{uuid.uuid4().hex[:8]}"
    plain.conf.task_default_queue = plain_queue
    try:
        plain.send_task("workers.process_document", ("acme", "p1"), headers={"client_id": "acme"})
        routed.send_task("workers.process_document", ("acme", "r1"), headers={"client_id": "acme"})
        plain.send_task("workers.process_document", ("acme", "p2"), headers={"client_id": "acme"})

        plain_messages = drain(plain, plain_queue)
        routed_messages = drain(routed, worker_env["DOCUMENT_QUEUE"])
    finally:
        close_app(plain)
    assert len(plain_messages) == 2
    for m in plain_messages:
        assert not any(k.startswith("priority_router") for k in m.headers)
        # kombu's Redis transport stores a missing priority as 0; the router would give 1.
        assert m.properties.get("priority") in (None, 0)
    assert [m.headers[H.PENDING] for m in routed_messages] == [0]
    router = PriorityRouter.from_env(worker_env)
    assert router.peek("acme").pending == 0, "the plain app's publishes were not counted"


def test_task_always_eager_runs_tasks_in_process(worker_env: dict[str, str]) -> None:
    from workers.app import create_app

    app = create_app(worker_env)
    app.conf.task_always_eager = True
    app.loader.import_default_modules()
    try:
        result: Any = app.tasks["workers.process_document"].delay("acme", "e1", 1)
        assert result.get()["document_id"] == "e1"
    finally:
        close_app(app)


def test_a_tier_set_at_run_time_changes_the_wire_priority_and_is_named(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    app = producer()
    operator = PriorityRouter.from_env(worker_env)
    operator.set_tier("vip", fixed=1)
    operator.set_tier("abuser", fixed=9)
    for n in range(3):
        app.send_task("workers.process_document", ("vip", f"v{n}", 1), headers={"client_id": "vip"})
    app.send_task("workers.process_document", ("abuser", "a", 1), headers={"client_id": "abuser"})
    app.send_task("workers.process_document", ("plain", "p", 1), headers={"client_id": "plain"})
    operator.unset_tier("abuser")
    app.send_task("workers.process_document", ("abuser", "b", 1), headers={"client_id": "abuser"})

    transport = transport_of(app)
    seen = [
        (
            m.headers.get("client_id"),
            from_wire(m.properties["priority"], transport),
            m.headers.get(H.TIER),
        )
        for m in drain(app, worker_env["DOCUMENT_QUEUE"])
    ]
    assert sorted(seen, key=str) == sorted(
        [
            ("vip", 1, "client: fixed=1"),
            ("vip", 1, "client: fixed=1"),
            ("vip", 1, "client: fixed=1"),
            ("abuser", 9, "client: fixed=9"),
            ("plain", 1, None),
            ("abuser", 1, None),
        ],
        key=str,
    )


@pytest.mark.parametrize("source", ["keyword", "environment", "celery setting"])
def test_a_tasks_string_names_the_same_patterns_from_every_source(
    worker_env: dict[str, str], source: str
) -> None:
    """``tasks="docs.*,billing.*"`` counts both, as the variable and the Celery setting do."""
    from workers.app import create_app

    text = "docs.*,billing.*"
    env = {**worker_env, "WORKERS_ROUTER": "off"}
    if source == "environment":
        env["PRIORITY_ROUTER_TASKS"] = text
    app = create_app(env)
    if source == "celery setting":
        app.conf.priority_router_tasks = text
    PriorityRouter.from_env(env, tasks=text if source == "keyword" else None).install(app)
    try:
        for task in ("docs.ocr", "billing.invoice", "mail.send"):
            app.send_task(task, headers={"client_id": "acme"})
        reasons = {m.headers["task"]: m.headers[H.REASON] for m in drain(app, env["DOCUMENT_QUEUE"], 3)}
    finally:
        close_app(app)
    assert reasons == {"docs.ocr": "counted", "billing.invoice": "counted", "mail.send": "not-counted"}
