"""RabbitMQ: a queue that cannot honour priorities is refused loudly, never served FIFO."""

from __future__ import annotations

import logging
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from amqp.exceptions import PreconditionFailed
from celery import Celery
from kombu import Connection, Queue
from support.broker import drain
from support.services import (
    ROOT,
    close_app,
    counter_db_url,
    running_worker,
    worker_command,
    worker_environment,
)

from priority_router import headers as H
from priority_router.integration import rabbitmq
from priority_router.integration.rabbitmq import QueueNotPriorityError, verify_priority_queues
from priority_router.ops.doctor import diagnose
from workers.app import create_app

pytestmark = [pytest.mark.rabbitmq, pytest.mark.compat]


@pytest.fixture
def fifo_queue(amqp_url: str) -> str:
    """A queue that already exists without x-max-priority, as a team's old setup left it."""
    name = f"legacy-{uuid.uuid4().hex[:8]}"
    with Connection(amqp_url) as conn:
        Queue(name, channel=conn.default_channel).declare()
    yield name  # type: ignore[misc]
    with Connection(amqp_url) as conn:
        conn.default_channel.queue_delete(name)


def _env(amqp_url: str, redis_server_url: str, queue: str) -> dict[str, str]:
    return {
        "BROKER_URL": amqp_url,
        "DOCUMENT_QUEUE": queue,
        "PRIORITY_ROUTER_REDIS_URL": counter_db_url(redis_server_url),
    }


def test_verify_names_the_queue_and_both_ways_out(
    fifo_queue: str, amqp_url: str, redis_server_url: str
) -> None:
    app: Celery = create_app(_env(amqp_url, redis_server_url, fifo_queue))
    with pytest.raises(QueueNotPriorityError) as info:
        verify_priority_queues(app)
    message = str(info.value)
    assert fifo_queue in message and "x-max-priority" in message
    assert "delete" in message and "new queue name" in message
    close_app(app)


@pytest.mark.parametrize("logfile", [False, True], ids=["console", "logfile"])
def test_worker_refuses_to_start_on_a_fifo_queue(
    fifo_queue: str, amqp_url: str, redis_server_url: str, logfile: bool, tmp_path: Path
) -> None:
    """Refused in the worker's own log: with ``--logfile`` (``--detach``, systemd) nothing
    else is read, and the refusal came before Celery had set that log up."""
    env = _env(amqp_url, redis_server_url, fifo_queue)
    log = tmp_path / "worker.log"
    proc = subprocess.run(
        worker_command("--pool", "solo", *(["--logfile", str(log)] if logfile else [])),
        cwd=ROOT,
        env=worker_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    said = log.read_text() if logfile else proc.stderr + proc.stdout
    refusal = next(line for line in said.splitlines() if "CRITICAL/MainProcess] priority-router:" in line)
    assert "x-max-priority" in refusal and fifo_queue in refusal


def test_a_worker_checks_only_the_queues_it_consumes(
    fifo_queue: str, amqp_url: str, redis_server_url: str
) -> None:
    """The app's default queue is a FIFO queue, but this worker consumes another (``-Q``):
    it starts, and its own queue becomes a priority queue."""
    other = f"pri-{uuid.uuid4().hex[:8]}"
    env = _env(amqp_url, redis_server_url, fifo_queue)
    try:
        with running_worker(env, "--pool", "solo", "-Q", other) as worker:
            assert fifo_queue not in worker.output()
        with Connection(amqp_url) as conn:
            # Declared by the worker with the router's arguments: redeclaring it so passes.
            Queue(other, channel=conn.default_channel, queue_arguments={"x-max-priority": 10}).declare()
    finally:
        with Connection(amqp_url) as conn:
            conn.default_channel.queue_delete(other)


def test_fresh_queue_is_declared_as_priority_queue(amqp_url: str, redis_server_url: str) -> None:
    queue = f"fresh-{uuid.uuid4().hex[:8]}"
    app = create_app(_env(amqp_url, redis_server_url, queue))
    try:
        assert verify_priority_queues(app) == [queue]
        with Connection(amqp_url) as conn:
            # Redeclaring with x-max-priority=10 succeeds only if that is what exists.
            Queue(queue, channel=conn.default_channel, queue_arguments={"x-max-priority": 10}).declare()
            conn.default_channel.queue_delete(queue)
    finally:
        close_app(app)


def test_publishing_to_a_fifo_queue_still_delivers_and_says_so_once(
    fifo_queue: str, amqp_url: str, redis_server_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = {**_env(amqp_url, redis_server_url, fifo_queue), "PRIORITY_ROUTER_KEY_PREFIX": key_prefix}
    app = create_app(env)
    try:
        for n in range(3):
            app.send_task("workers.hold_document", ("acme", f"d{n}", 0), headers={"client_id": "acme"})
        messages = drain(app, fifo_queue, expected=3)
    finally:
        close_app(app)
    assert sorted(m.headers[H.PENDING] for m in messages) == [-2, -1, 0]  # each counted once
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert fifo_queue in errors[0] and "delete" in errors[0]


def test_doctor_does_not_call_a_quorum_queue_a_priority_queue(
    amqp_url: str, redis_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    classic, quorum = f"c-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"
    app: Celery = create_app(_env(amqp_url, redis_server_url, classic))
    app.conf.task_queues = [Queue(classic), Queue(quorum, queue_arguments={"x-queue-type": "quorum"})]
    try:
        verify_priority_queues(app)  # as a worker would: both exist now
        findings = {(f.check, f.ok): f for f in diagnose(app)}
        priority = findings[("x-max-priority", True)]
        assert classic in priority.detail and quorum not in priority.detail
        assert quorum in findings[("quorum", False)].detail  # RabbitMQ 3.x: no priorities
        # A Celery without worker_detect_quorum_queues (5.4) cannot consume it at all.
        detects = "worker_detect_quorum_queues" in rabbitmq.CELERY_DEFAULTS
        assert any("global QoS" in f.detail for f in findings.values()) is not detects
        known = {k: v for k, v in rabbitmq.CELERY_DEFAULTS.items() if k != "worker_detect_quorum_queues"}
        monkeypatch.setattr(rabbitmq, "CELERY_DEFAULTS", known)
        cannot = [f for f in diagnose(app) if "global QoS" in f.detail]
        assert len(cannot) == 1 and not cannot[0].ok and "Celery 5.6" in cannot[0].fix
    finally:
        with Connection(amqp_url) as conn:
            for name in (classic, quorum):
                conn.default_channel.queue_delete(name)
        close_app(app)


def test_an_app_declaring_quorum_where_a_priority_queue_exists_is_told_so_not_that_it_is_fifo(
    amqp_url: str, redis_server_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The newcomer's trial: a team's quorum habit met the router's classic priority queue.
    The publisher said the queue was "a priority queue again", the worker that it would be
    served in arrival order; both were false.  RabbitMQ refuses the declaration itself."""
    name = f"typed-{uuid.uuid4().hex[:8]}"
    with Connection(amqp_url) as conn:
        Queue(name, channel=conn.default_channel, queue_arguments={"x-max-priority": 10}).declare()
    env = {**_env(amqp_url, redis_server_url, name), "PRIORITY_ROUTER_KEY_PREFIX": key_prefix}
    app: Celery = create_app(env)
    app.conf.task_queues = [Queue(name, queue_arguments={"x-queue-type": "quorum"})]
    try:
        with pytest.raises(QueueNotPriorityError) as info:
            verify_priority_queues(app)  # what a worker and doctor run
        assert info.value.other_type and "another queue type" in str(info.value)
        assert "arrival order" not in str(info.value)
        for _ in range(2):
            with pytest.raises(PreconditionFailed):  # as without the router
                app.send_task("workers.hold_document", ("acme", "d", 0), headers={"client_id": "acme"})
        said = [r for r in caplog.records if r.name == "priority_router" and r.levelno >= logging.INFO]
        assert [r.levelno for r in said] == [logging.ERROR], [r.getMessage() for r in said]
        assert "another queue type" in said[0].getMessage() and name in said[0].getMessage()
    finally:
        with Connection(amqp_url) as conn:
            conn.default_channel.queue_delete(name)
        close_app(app)


def test_a_dry_run_after_the_router_was_switched_on_keeps_publishing(
    amqp_url: str, redis_server_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found in a field trial: dry run switched on after the router had made the queue a
    priority queue, and every publish failed with PRECONDITION_FAILED (plain Celery's
    declaration has no x-max-priority).  The dry run now declares the queue as it exists."""
    name = f"was-routed-{uuid.uuid4().hex[:8]}"
    with Connection(amqp_url) as conn:
        Queue(name, channel=conn.default_channel, queue_arguments={"x-max-priority": 10}).declare()
    env = {
        **_env(amqp_url, redis_server_url, name),
        "PRIORITY_ROUTER_KEY_PREFIX": key_prefix,
        "PRIORITY_ROUTER_DRY_RUN": "true",
    }
    app: Celery = create_app(env)
    try:
        with caplog.at_level(logging.WARNING, "priority_router"):
            for n in range(3):
                app.send_task("workers.hold_document", ("acme", f"d{n}", 0), headers={"client_id": "acme"})
        said = [r.getMessage() for r in caplog.records if "is a priority queue on RabbitMQ" in r.getMessage()]
        assert len(said) == 1 and name in said[0], caplog.text
        messages = drain(app, name, 3)
        assert [m.headers[H.DRY_RUN] for m in messages] == [True] * 3
        assert {m.properties.get("priority") for m in messages} <= {None, 0}, "plain Celery's priority"
        # A worker in dry run consumes it too; it stopped on the refused declaration before.
        with Connection(amqp_url) as conn:
            Queue(name, channel=conn.default_channel, queue_arguments={"x-max-priority": 10}).declare()
        with running_worker(env, "--pool", "solo") as worker:
            assert "is a priority queue on RabbitMQ" in worker.output()
            app.send_task("workers.hold_document", ("acme", "late", 0), headers={"client_id": "acme"})
            deadline = time.monotonic() + 30
            while "succeeded" not in worker.output() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "succeeded" in worker.output(), worker.output()
    finally:
        with Connection(amqp_url) as conn:
            conn.default_channel.queue_delete(name)
        close_app(app)
