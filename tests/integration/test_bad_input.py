"""Odd client ids through a real publish: every document goes out, ids stay distinct."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from support.broker import drain
from support.services import close_app

from priority_router import PriorityRouter
from priority_router import headers as H
from workers.app import create_app

COUNTED: list[Any] = [
    "x" * 1_000_000,
    "x" * 1_000_001,
    "line\nbreak",
    "nul\x00byte",
    "{acme}",
    "acme",
    "*",
    ":",
    "é日本",
    42,
    4.5,
]
NOT_AN_ID: list[Any] = ["", "   ", None, [1, 2], {"a": 1}, True]


def test_every_odd_id_publishes_and_stays_its_own_client(
    worker_env: dict[str, str], real_redis: redis.Redis, key_prefix: str
) -> None:
    app: Celery = create_app(worker_env)
    queue = worker_env["DOCUMENT_QUEUE"]
    try:
        for value in COUNTED + NOT_AN_ID:
            app.send_task("workers.hold_document", kwargs={"client_id": value, "document_id": "d"})
        messages = drain(app, queue, expected=len(COUNTED) + len(NOT_AN_ID))
    finally:
        close_app(app)

    assert len(messages) == len(COUNTED) + len(NOT_AN_ID)
    assert all(m.properties["priority"] is not None for m in messages)
    reasons = [m.headers[H.REASON] for m in messages]
    assert reasons.count("counted") == len(COUNTED)
    assert reasons.count("no-client") == len(NOT_AN_ID)

    keys = [k.decode() for k in real_redis.scan_iter(match=key_prefix + "{*")]
    assert len(keys) == len(COUNTED)  # distinct ids, distinct clients
    for key in keys:
        assert len(key) <= len(key_prefix) + 2 + 64 + 1
        assert key.isprintable()
    assert all(int(real_redis.get(k) or 0) == 1 for k in keys)


def test_a_getter_returning_undecodable_bytes(
    producer: Callable[[], Celery], worker_env: dict[str, str], key_prefix: str
) -> None:
    router = PriorityRouter.from_env(
        worker_env, client_id_getter=lambda name, args, kwargs, headers: b"\xff\xfe-client"
    )
    app = Celery("bytes-getter", broker=worker_env["BROKER_URL"])
    app.conf.task_default_queue = worker_env["DOCUMENT_QUEUE"]
    router.install(app)
    try:
        for _ in range(3):
            app.send_task("workers.hold_document", ("ignored",))
        messages = drain(app, worker_env["DOCUMENT_QUEUE"])
    finally:
        router.uninstall(app)
        close_app(app)
    assert sorted(m.headers[H.PENDING] for m in messages) == [-2, -1, 0]
    assert router.peek(b"\xff\xfe-client").pending == -2
