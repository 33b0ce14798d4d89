"""The example workers accept JSON only: a pickled message is refused, never run."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery
from support.services import close_app, running_worker


def test_worker_refuses_pickle(producer: Callable[[], Celery], worker_env: dict[str, str]) -> None:
    app = producer()
    attacker = Celery("attacker", broker=worker_env["BROKER_URL"], backend=worker_env["RESULT_BACKEND"])
    attacker.conf.update(
        task_default_queue=worker_env["DOCUMENT_QUEUE"],
        task_serializer="pickle",
        accept_content=["pickle", "json"],
        task_queue_max_priority=10,  # declare the queue as the workers expect it
    )
    pickled = attacker.send_task("tests.record_request", kwargs={"client_id": "mallory"})
    with running_worker(worker_env, "--pool", "solo") as worker:
        honest = app.send_task("tests.record_request", kwargs={"client_id": "acme"})
        assert honest.get(timeout=60)["client_id"] == "acme"
        log = worker.output()
    assert "ContentDisallowed" in log or "disallowed" in log.lower(), log
    assert app.AsyncResult(pickled.id).state == "PENDING"
    close_app(attacker)
